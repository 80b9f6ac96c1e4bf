// A text tokenizer loaded from a HF model directory (tokenizer.json + tokenizer_config.json),
// producing the same ids as HF tokenizers / transformers: added-token splitting, normalizer,
// pre-tokenizer, BPE model, post-processor, decoder. Thread-safe after construction.
//
// Input that is not valid UTF-8 is repaired first: every maximal invalid subsequence becomes
// U+FFFD, which is what HF gets for the same bytes decoded lossily (Python's
// errors="replace", Node's Buffer.toString, Rust's from_utf8_lossy).
#ifndef TOKENIZER_TOKENIZER_H_
#define TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"
#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"

namespace deepinfer::tokenizer {

class Tokenizer {
 public:
  // `tokenizer_json` is the text of tokenizer.json. `tokenizer_config` is the parsed
  // tokenizer_config.json (null if absent); its add_bos_token / add_eos_token replace the
  // post-processor for Llama-family tokenizer classes, as transformers does.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(
      absl::string_view tokenizer_json, const nlohmann::json& tokenizer_config);
  // The same from an already parsed tokenizer.json.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromParsedJson(
      const nlohmann::json& root, const nlohmann::json& tokenizer_config);

  // Loads `directory`/tokenizer.json and, if present, `directory`/tokenizer_config.json.
  // kNotFound when the directory has no tokenizer.json.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromDirectory(const std::string& directory);

  std::vector<uint32_t> Encode(absl::string_view text, bool add_special_tokens) const;

  // kOutOfRange for an id that is neither in the vocabulary nor an added token: for ids that
  // must all name tokens.
  absl::StatusOr<std::string> Decode(absl::Span<const uint32_t> ids,
                                     bool skip_special_tokens) const;
  // What HF tokenizers' decode does: ids that are neither in the vocabulary nor added tokens
  // contribute nothing. For ids a model generated: its embedding may have more rows than the
  // tokenizer has tokens (DeepSeek-V3: 129,280 rows, 128,815 tokens), and sampling can pick
  // any row.
  std::string DecodeSkippingUnknown(absl::Span<const uint32_t> ids, bool skip_special_tokens) const;

  std::optional<uint32_t> TokenToId(absl::string_view token) const;
  // nullptr for unknown ids.
  const std::string* IdToToken(uint32_t id) const;
  bool IsSpecial(uint32_t id) const;

  // tokenizer_config.json as loaded (null when there was none).
  const nlohmann::json& config() const { return config_; }

 private:
  Tokenizer() = default;
  void EncodeText(absl::string_view text, std::vector<uint32_t>* ids) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  std::unique_ptr<AddedVocabulary> added_vocabulary_;
  nlohmann::json config_;
};

// The content of a tokenizer_config.json token entry: a string or {"content": ...}.
std::optional<std::string> TokenContent(const nlohmann::json& config, const char* key);

}  // namespace deepinfer::tokenizer

#endif  // TOKENIZER_TOKENIZER_H_
