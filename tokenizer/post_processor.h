// Post-processors of HF tokenizer.json ("post_processor"), as far as they change ids of a
// single sequence: ByteLevel (offsets only, so ids pass through), TemplateProcessing (its
// "single" template) and Sequence. They run only when special tokens are requested.
#ifndef TOKENIZER_POST_PROCESSOR_H_
#define TOKENIZER_POST_PROCESSOR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace deepinfer::tokenizer {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Rewrites the ids of one encoded sequence.
  virtual void Process(std::vector<uint32_t>* ids) const = 0;

  // A null json yields nullptr (none).
  static absl::StatusOr<std::unique_ptr<PostProcessor>> FromJson(const nlohmann::json& config);

  // TemplateProcessing "prefix $A suffix" with the given special token ids, the post-processor
  // transformers installs for Llama-style tokenizers from add_bos_token / add_eos_token.
  static std::unique_ptr<PostProcessor> Surround(std::vector<uint32_t> prefix,
                                                 std::vector<uint32_t> suffix);
};

}  // namespace deepinfer::tokenizer

#endif  // TOKENIZER_POST_PROCESSOR_H_
