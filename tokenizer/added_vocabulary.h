// Added tokens of HF tokenizer.json ("added_tokens"): they are cut out of the input before the
// model sees it. Tokens with normalized=false are matched on the raw text, the others on the
// normalized text (HF's two passes). Matching is leftmost-longest; single_word, lstrip and
// rstrip behave as in HF tokenizers.
#ifndef TOKENIZER_ADDED_VOCABULARY_H_
#define TOKENIZER_ADDED_VOCABULARY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "tokenizer/normalizer.h"

namespace deepinfer::tokenizer {

struct AddedToken {
  uint32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool single_word = false;
};

// A piece of text: either an added token or text for the model.
struct TextPiece {
  size_t begin = 0, end = 0;
  std::optional<uint32_t> token_id;
};

class AddedVocabulary {
 public:
  // `normalizer` (may be null) is applied to the content of normalized tokens, since they are
  // matched against normalized text.
  static absl::StatusOr<std::unique_ptr<AddedVocabulary>> Create(std::vector<AddedToken> tokens,
                                                                 const Normalizer* normalizer);
  static absl::StatusOr<std::vector<AddedToken>> ParseJson(const nlohmann::json& added_tokens);

  // Cuts `text` into pieces covering it in order: matches of the normalized=false tokens
  // (`normalized_pass` false) or of the normalized=true ones (true).
  void Split(absl::string_view text, bool normalized_pass, std::vector<TextPiece>* pieces) const;

  std::optional<uint32_t> TokenToId(absl::string_view content) const;
  const AddedToken* FindById(uint32_t id) const;
  bool empty() const { return tokens_.empty(); }

 private:
  // A byte trie over token contents for one pass.
  struct Trie {
    absl::flat_hash_map<uint64_t, int32_t> edges;  // (node << 8 | byte) -> child
    std::vector<int32_t> token_at;                 // node -> index into tokens_, or -1
    bool first_byte[256] = {};
    Trie() : token_at(1, -1) {}
    void Insert(absl::string_view key, int32_t token_index);
    // Longest token starting at text[pos]: index into tokens_ and its length, or -1.
    int32_t LongestMatch(absl::string_view text, size_t pos, size_t* length) const;
  };

  AddedVocabulary() = default;

  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<std::string, uint32_t> content_to_id_;
  absl::flat_hash_map<uint32_t, size_t> id_to_index_;
  Trie raw_trie_, normalized_trie_;
};

}  // namespace deepinfer::tokenizer

#endif  // TOKENIZER_ADDED_VOCABULARY_H_
