// Decoders of HF tokenizer.json ("decoder"): turn token strings back into text. Supported:
// ByteLevel, ByteFallback, Fuse, Replace (String pattern), Strip and Sequence; without a
// decoder tokens are joined with spaces, as HF does.
#ifndef TOKENIZER_DECODER_H_
#define TOKENIZER_DECODER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace deepinfer::tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // One step of HF's decode chain: rewrites the list of token strings.
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;

  // The text of `tokens`: the chain, then concatenation. `decoder` may be null.
  static std::string Decode(const Decoder* decoder, std::vector<std::string> tokens);

  // A null json yields nullptr (none).
  static absl::StatusOr<std::unique_ptr<Decoder>> FromJson(const nlohmann::json& config);
};

}  // namespace deepinfer::tokenizer

#endif  // TOKENIZER_DECODER_H_
