#include "tokenizer/regex.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "tokenizer/unicode/unicode_additions.h"

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

// Unicode White_Space, which is what \s means in Oniguruma (HF tokenizers' regex engine).
// PCRE2's \s with PCRE2_UCP also matches U+180E (Mongolian vowel separator, a format
// character since Unicode 6.3), so the two would cut text containing it differently.
constexpr char kWhiteSpaceClassBody[] =
    "\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

// The code points Oniguruma puts in general category `category` (L, M, N, P, S, Z) that
// PCRE2's older Unicode tables leave unassigned, or nullptr for other categories.
const char* AdditionsFor(absl::string_view category) {
  if (category == "L") return kUnicodeAdditionsL;
  if (category == "M") return kUnicodeAdditionsM;
  if (category == "N") return kUnicodeAdditionsN;
  if (category == "P") return kUnicodeAdditionsP;
  if (category == "S") return kUnicodeAdditionsS;
  if (category == "Z") return kUnicodeAdditionsZ;
  return nullptr;
}

// Makes PCRE2 classify characters as Oniguruma (HF tokenizers) does:
// * \s and \S become explicit White_Space classes (\S inside a character class has no such
//   rewrite and keeps PCRE2's meaning);
// * \p{L}, \p{M}, \p{N}, \p{P}, \p{S}, \p{Z} (and \P{..} outside classes) also match the
//   characters of Unicode versions newer than PCRE2's tables (unicode/unicode_additions.h).
// \Q..\E quoted text is left alone.
std::string TranslatePattern(absl::string_view pattern) {
  std::string out;
  out.reserve(pattern.size());
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[i + 1];
      if (next == 'Q') {
        const size_t end = pattern.find("\\E", i + 2);
        const size_t stop = end == absl::string_view::npos ? pattern.size() : end + 2;
        out.append(pattern.data() + i, stop - i);
        i = stop - 1;
      } else if (next == 's') {
        out += in_class ? std::string(kWhiteSpaceClassBody)
                        : absl::StrCat("[", kWhiteSpaceClassBody, "]");
        ++i;
      } else if (next == 'S' && !in_class) {
        out += absl::StrCat("[^", kWhiteSpaceClassBody, "]");
        ++i;
      } else if ((next == 'p' || (next == 'P' && !in_class)) && i + 2 < pattern.size() &&
                 pattern[i + 2] == '{' && pattern.find('}', i + 3) != absl::string_view::npos) {
        const size_t close = pattern.find('}', i + 3);
        const absl::string_view property = pattern.substr(i, close + 1 - i);
        const char* additions = AdditionsFor(pattern.substr(i + 3, close - i - 3));
        if (additions == nullptr || additions[0] == '\0') {
          out.append(property.data(), property.size());
        } else if (in_class) {
          absl::StrAppend(&out, property, additions);
        } else {
          absl::StrAppend(&out, next == 'P' ? "[^\\p" : "[\\p", property.substr(2), additions, "]");
        }
        i = close;
      } else {
        out.append(pattern.data() + i, 2);
        ++i;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t end = pattern.find(":]", i + 2);  // a POSIX class such as [:alpha:]
      if (end != absl::string_view::npos) {
        out.append(pattern.data() + i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(absl::string_view original_pattern) {
  const std::string pattern = TranslatePattern(original_pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("bad regex '", original_pattern, "' at offset ",
                                                   error_offset, ": ",
                                                   reinterpret_cast<const char*>(message)));
  }
  // JIT is an optimisation only; without it (unsupported CPU) matching still works.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(std::string(original_pattern), code));
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
