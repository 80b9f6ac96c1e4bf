// Normalizers of HF tokenizer.json ("normalizer"): text rewrites applied before
// pre-tokenization. Supported: Sequence, Prepend, Replace (String or Regex pattern), Strip.
// Unicode normalization forms (NFC, NFKC, ...) and Lowercase are rejected at load time with
// kUnimplemented rather than approximated.
#ifndef TOKENIZER_NORMALIZER_H_
#define TOKENIZER_NORMALIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace deepinfer::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites `text` (valid UTF-8) in place.
  virtual void Normalize(std::string* text) const = 0;

  // Builds a normalizer from its tokenizer.json object. A null json yields nullptr (none).
  static absl::StatusOr<std::unique_ptr<Normalizer>> FromJson(const nlohmann::json& config);
};

}  // namespace deepinfer::tokenizer

#endif  // TOKENIZER_NORMALIZER_H_
