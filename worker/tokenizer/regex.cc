#include "worker/tokenizer/regex.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace deepinfer::tokenizer {
namespace {

// One match-data block per thread: matching allocates nothing, and a Regex can be shared by
// threads. Only the whole-match pair is read, so a small ovector is enough (PCRE2 returns 0
// when groups did not fit but still fills pair 0).
pcre2_match_data* ThreadMatchData() {
  thread_local std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create(8, nullptr), &pcre2_match_data_free);
  return data.get();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(absl::string_view pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("bad regex '", pattern, "' at offset ",
                                                   error_offset, ": ",
                                                   reinterpret_cast<const char*>(message)));
  }
  // JIT is an optimisation only; without it (unsupported CPU) matching still works.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(std::string(pattern), code));
}

Regex::~Regex() { pcre2_code_free(code_); }

void Regex::FindAll(absl::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const {
  pcre2_match_data* data = ThreadMatchData();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    const int rc =
        pcre2_match(code_, subject, text.size(), start, PCRE2_NO_UTF_CHECK, data, nullptr);
    if (rc < 0) {
      CHECK(rc == PCRE2_ERROR_NOMATCH) << "pcre2_match failed with " << rc << " on " << pattern_;
      return;
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    const size_t begin = ovector[0], end = ovector[1];
    matches->emplace_back(begin, end);
    if (end > begin) {
      start = end;
    } else {
      if (end >= text.size()) return;
      start = end + 1;  // skip one whole character
      while (start < text.size() && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) ++start;
    }
  }
}

bool Regex::FullMatch(absl::string_view text) const {
  pcre2_match_data* data = ThreadMatchData();
  const int rc =
      pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
                  PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED | PCRE2_ENDANCHORED, data, nullptr);
  return rc >= 0;
}

}  // namespace deepinfer::tokenizer
