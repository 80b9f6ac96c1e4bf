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

// The vocabulary's tokens read as units of a JSON string's inside, for masks at a position
// inside a string (grammar_matcher.cc). A unit is a character other than '"', '\\' and the
// controls U+0000-U+001F, as exact UTF-8 (no overlong forms, no surrogates), or an escape
// (\" \\ \/ \b \f \n \r \t \uXXXX). Each token is read unit by unit from its first byte: a
// whole token is made of complete units only; any other token leaves the units at its exit,
// the start of the first unit that is not complete within it (a '"', a control, a byte that
// cannot continue a unit, a character or escape cut by the token's end), or its first
// kMaxUnits units (the few tokens that hold more; a mask explores that many units ahead).
class StringUnitTable {
 public:
  static constexpr int kBoundary = 0;  // the automaton's state between units
  static constexpr int kNumStates = 13;
  // 16 covers all but 154 of DeepSeek-V3's 124,947 whole tokens.
  static constexpr int32_t kMaxUnits = 16;

  // The unit automaton: the state after `byte`, or -1 when the byte cannot continue the unit
  // begun (from kBoundary: cannot begin one).
  int next(int state, uint8_t byte) const { return next_[state][byte]; }
  // The most complete units a token holds before its exit (or in all, when whole), at most
  // kMaxUnits.
  int32_t max_units() const { return max_units_; }
  // Bitmask (TokenVocabulary::mask_words() words) of the whole tokens of at most `units`
  // units, for units in [0, max_units()].
  const uint32_t* whole_up_to(int32_t units) const {
    return &whole_up_to_[static_cast<size_t>(units) * mask_words_];
  }
  struct Leaving {
    int32_t token;
    int32_t units;  // complete units before the exit
    int32_t begin;  // leaving_bytes() offset of the token's bytes from its exit on
    int32_t end;
    int32_t shared;  // of those bytes, how many begin the previous entry's too (same units)
  };
  // The tokens that are not whole, by units and then by their bytes from the exit (so that
  // a walk shares prefixes, as over a trie), those bytes side by side in leaving_bytes().
  const std::vector<Leaving>& leaving() const { return leaving_; }
  const std::string& leaving_bytes() const { return leaving_bytes_; }

 private:
  friend class TokenVocabulary;
  void Build(const std::vector<std::string>& bytes, const std::vector<int32_t>& sorted,
             int32_t mask_words);

  int8_t next_[kNumStates][256];
  int32_t max_units_ = 0;
  int32_t mask_words_ = 0;
  std::vector<uint32_t> whole_up_to_;
  std::vector<Leaving> leaving_;
  std::string leaving_bytes_;
};

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

  // The tokens read as JSON string units (built with the vocabulary).
  const StringUnitTable& string_units() const { return string_units_; }

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
  StringUnitTable string_units_;
};

}  // namespace deepinfer::grammar

#endif  // DEEPINFER_COMMON_GRAMMAR_TOKEN_VOCABULARY_H_
