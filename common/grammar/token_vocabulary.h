// TokenVocabulary: the bytes each token id stands for, sorted so that tokens sharing a prefix
// are neighbours, and the trie of those bytes (walked depth first, a rejected prefix skips its
// whole subtree), plus the stop tokens a grammar allows only once it is
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

  // Tokens with bytes, in byte order.
  const std::vector<int32_t>& sorted() const { return sorted_; }

  // The trie of the tokens' bytes, its nodes (the root excluded) in depth-first order, which
  // is the byte order of sorted(). Node i stands for the byte string of its path; its subtree
  // is the nodes [i, subtree_end) and the tokens sorted()[k] for k in [token_begin,
  // trie_token_end(i)), of which the first trie_tokens_here(i) are exactly its path. A walk
  // skips a subtree by jumping to subtree_end.
  struct TrieNode {
    int32_t subtree_end;
    int32_t token_begin;
    int32_t depth;  // path length, >= 1
    uint8_t byte;   // the path's last byte
  };
  int32_t trie_size() const { return static_cast<int32_t>(trie_.size()); }
  // The longest token, in bytes.
  int32_t trie_max_depth() const { return trie_max_depth_; }
  const TrieNode& trie(int32_t i) const { return trie_[i]; }
  int32_t trie_token_end(int32_t i) const {
    const int32_t end = trie_[i].subtree_end;
    return end < trie_size() ? trie_[end].token_begin : static_cast<int32_t>(sorted_.size());
  }
  int32_t trie_tokens_here(int32_t i) const {
    return (i + 1 < trie_size() ? trie_[i + 1].token_begin : static_cast<int32_t>(sorted_.size())) -
           trie_[i].token_begin;
  }
  // Every byte on a path below node i (i's own byte excluded), as 4 words of 64 bits.
  const uint64_t* trie_subtree_bytes(int32_t i) const { return &trie_subtree_bytes_[4 * i]; }

 private:
  TokenVocabulary() = default;
  void BuildTrie();

  std::vector<std::string> bytes_;
  std::vector<char> stop_;
  std::vector<int32_t> stop_tokens_;
  std::vector<int32_t> sorted_;
  std::vector<TrieNode> trie_;
  int32_t trie_max_depth_ = 0;
  std::vector<uint64_t> trie_subtree_bytes_;
};

}  // namespace deepinfer::grammar

#endif  // DEEPINFER_COMMON_GRAMMAR_TOKEN_VOCABULARY_H_
