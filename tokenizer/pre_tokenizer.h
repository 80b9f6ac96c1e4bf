// Pre-tokenizers of HF tokenizer.json ("pre_tokenizer"): they cut normalized text into the
// words that the model tokenizes independently. Supported: Sequence, Split (String or Regex
// pattern, every behavior, invert), ByteLevel (with or without its GPT-2 regex, optional prefix
// space) and Digits. Offsets are not tracked: the runtime only needs ids.
#ifndef TOKENIZER_PRE_TOKENIZER_H_
#define TOKENIZER_PRE_TOKENIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tokenizer/regex.h"

namespace deepinfer::tokenizer {

// How Split treats the pieces its pattern matches (HF SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

absl::StatusOr<SplitBehavior> ParseSplitBehavior(const std::string& name);

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces every split by the pieces it is cut into; empty pieces are dropped.
  virtual void PreTokenize(std::vector<std::string>* splits) const = 0;

  // From the tokenizer.json object; a null json yields nullptr (none).
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> FromJson(const nlohmann::json& config);
};

// Cuts `text` with the matches of `pattern` according to `behavior` and appends the non-empty
// pieces to `out`. With `invert`, the matches are the pieces to keep and the rest delimits.
void SplitWithPattern(const std::string& text, const Regex& pattern, SplitBehavior behavior,
                      bool invert, std::vector<std::string>* out);

}  // namespace deepinfer::tokenizer

#endif  // TOKENIZER_PRE_TOKENIZER_H_
