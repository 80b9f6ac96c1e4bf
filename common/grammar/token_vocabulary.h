// TokenVocabulary: the bytes each token id stands for, sorted so that tokens sharing a prefix
// are neighbours (a trie walked in order), plus the stop tokens a grammar allows only once it is
// complete. Built once per model; shared by every matcher.
#ifndef DEEPINFER_COMMON_GRAMMAR_TOKEN_VOCABULARY_H_
#define DEEPINFER_COMMON_GRAMMAR_TOKEN_VOCABULARY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::grammar {

class TokenVocabulary {
 public:
  // token_bytes[i]: the bytes of token i; an empty string marks a token a grammar never allows
  // (special tokens, embedding rows without a token). stop_tokens: ids that end a request.
  static std::shared_ptr<const TokenVocabulary> Create(std::vector<std::string> token_bytes,
                                                       std::vector<int32_t> stop_tokens);

  // The vocabulary of a byte-level BPE tokenizer (GPT-2 alphabet, as DeepSeek's): regular
  // tokens are mapped back to their bytes, added tokens that are not special stand for their
  // text, special tokens and ids in [tokenizer size, vocab_size) are never allowed.
  // INVALID_ARGUMENT when a stop token is outside [0, vocab_size).
  static absl::StatusOr<std::shared_ptr<const TokenVocabulary>> FromTokenizer(
      const tokenizer::Tokenizer& tokenizer, int32_t vocab_size, std::vector<int32_t> stop_tokens);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  // Number of 32-bit words in a token bitmask.
  int32_t mask_words() const { return (size() + 31) / 32; }
  const std::string& bytes(int32_t token) const { return bytes_[token]; }
  bool is_stop(int32_t token) const { return token >= 0 && token < size() && stop_[token]; }
  const std::vector<int32_t>& stop_tokens() const { return stop_tokens_; }

  // Tokens with bytes, in byte order, and for each position k the length of the common prefix
  // of sorted()[k - 1] and sorted()[k] (0 for k = 0).
  const std::vector<int32_t>& sorted() const { return sorted_; }
  const std::vector<uint16_t>& common_prefix() const { return common_prefix_; }
  // The bytes of sorted()[k], from one contiguous buffer in sorted order (walks in that order
  // read memory sequentially).
  absl::string_view sorted_bytes(size_t k) const {
    return absl::string_view(sorted_data_)
        .substr(sorted_offset_[k], sorted_offset_[k + 1] - sorted_offset_[k]);
  }

 private:
  TokenVocabulary() = default;

  std::vector<std::string> bytes_;
  std::vector<char> stop_;
  std::vector<int32_t> stop_tokens_;
  std::vector<int32_t> sorted_;
  std::vector<uint16_t> common_prefix_;
  std::string sorted_data_;
  std::vector<uint32_t> sorted_offset_;
};

}  // namespace deepinfer::grammar

#endif  // DEEPINFER_COMMON_GRAMMAR_TOKEN_VOCABULARY_H_
