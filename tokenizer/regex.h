// A compiled PCRE2 pattern (UTF + Unicode properties, JIT when available) with the
// non-overlapping "find all" iteration that HF tokenizers' Split pre-tokenizer relies on.
#ifndef TOKENIZER_REGEX_H_
#define TOKENIZER_REGEX_H_

#define PCRE2_CODE_UNIT_WIDTH 8

#include <pcre2.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deepinfer::tokenizer {

class Regex {
 public:
  // PCRE2 syntax, compiled with PCRE2_UTF | PCRE2_UCP so that \s, \w and
  // \p{..} have their Unicode meaning, as in Oniguruma (which HF tokenizers uses).
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(absl::string_view original_pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Byte ranges [begin, end) of all non-overlapping matches of `text` (valid UTF-8), left to
  // right. After an empty match the search resumes one character later.
  void FindAll(absl::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const;

  // Whether the pattern matches the whole of `text`.
  bool FullMatch(absl::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex(std::string pattern, pcre2_code* code) : pattern_(std::move(pattern)), code_(code) {}

  std::string pattern_;
  pcre2_code* code_;
};

}  // namespace deepinfer::tokenizer

#endif  // TOKENIZER_REGEX_H_
