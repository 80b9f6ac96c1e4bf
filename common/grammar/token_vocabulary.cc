#include "common/grammar/token_vocabulary.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tokenizer/utf8.h"

namespace deepinfer::grammar {
namespace {

// The bytes a byte-level token string stands for, or false when a character is outside the
// GPT-2 alphabet.
bool ByteLevelBytes(const std::string& token, std::string* out) {
  const tokenizer::ByteLevelAlphabet& alphabet = tokenizer::ByteLevelAlphabet::Get();
  out->clear();
  size_t i = 0;
  while (i < token.size()) {
    const unsigned char c = token[i];
    char32_t cp;
    int len;
    if (c < 0x80) {
      cp = c;
      len = 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < token.size()) {
      cp = ((c & 0x1F) << 6) | (token[i + 1] & 0x3F);
      len = 2;
    } else {
      return false;  // the alphabet only uses code points below U+0800
    }
    const int b = alphabet.ByteFor(cp);
    if (b < 0) return false;
    out->push_back(static_cast<char>(b));
    i += len;
  }
  return true;
}

}  // namespace

std::shared_ptr<const TokenVocabulary> TokenVocabulary::Create(std::vector<std::string> token_bytes,
                                                               std::vector<int32_t> stop_tokens) {
  std::shared_ptr<TokenVocabulary> v(new TokenVocabulary());
  v->bytes_ = std::move(token_bytes);
  v->stop_.assign(v->bytes_.size(), 0);
  for (int32_t t : stop_tokens) {
    if (t >= 0 && t < v->size()) {
      v->stop_[t] = 1;
      v->bytes_[t].clear();
      v->stop_tokens_.push_back(t);
    }
  }
  for (int32_t t = 0; t < v->size(); ++t) {
    if (!v->bytes_[t].empty()) v->sorted_.push_back(t);
  }
  std::sort(v->sorted_.begin(), v->sorted_.end(),
            [&](int32_t a, int32_t b) { return v->bytes_[a] < v->bytes_[b]; });
  v->BuildTrie();
  return v;
}

void TokenVocabulary::BuildTrie() {
  // path[d]: the node at depth d on the previous token's path (path[0] stands for the root).
  std::vector<int32_t> path(1, -1);
  const std::string* previous = nullptr;
  for (size_t k = 0; k < sorted_.size(); ++k) {
    const std::string& bytes = bytes_[sorted_[k]];
    size_t shared = 0;
    if (previous != nullptr) {
      while (shared < previous->size() && shared < bytes.size() &&
             (*previous)[shared] == bytes[shared]) {
        ++shared;
      }
    }
    path.resize(shared + 1);
    for (size_t d = shared; d < bytes.size(); ++d) {
      path.push_back(trie_size());
      trie_.push_back({0, static_cast<int32_t>(k), static_cast<int32_t>(d + 1),
                       static_cast<uint8_t>(bytes[d])});
    }
    previous = &bytes;
    trie_max_depth_ = std::max(trie_max_depth_, static_cast<int32_t>(bytes.size()));
  }
  // Subtree ends, then subtree byte sets children first (reverse order).
  const int32_t n = trie_size();
  std::vector<int32_t> parent(n, -1);
  std::vector<int32_t> open;  // the current path's nodes
  for (int32_t i = 0; i < n; ++i) {
    while (!open.empty() && trie_[open.back()].depth >= trie_[i].depth) {
      trie_[open.back()].subtree_end = i;
      open.pop_back();
    }
    if (!open.empty()) parent[i] = open.back();
    open.push_back(i);
  }
  for (int32_t i : open) trie_[i].subtree_end = n;
  trie_subtree_bytes_.assign(4 * static_cast<size_t>(n), 0);
  for (int32_t i = n - 1; i >= 0; --i) {
    if (parent[i] < 0) continue;
    uint64_t* into = &trie_subtree_bytes_[4 * static_cast<size_t>(parent[i])];
    const uint64_t* from = &trie_subtree_bytes_[4 * static_cast<size_t>(i)];
    for (int w = 0; w < 4; ++w) into[w] |= from[w];
    into[trie_[i].byte >> 6] |= uint64_t{1} << (trie_[i].byte & 63);
  }
}

absl::StatusOr<std::shared_ptr<const TokenVocabulary>> TokenVocabulary::FromTokenizer(
    const tokenizer::Tokenizer& tokenizer, int32_t vocab_size, std::vector<int32_t> stop_tokens) {
  for (int32_t t : stop_tokens) {
    if (t < 0 || t >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop token ", t, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  std::vector<std::string> bytes(vocab_size);
  std::string decoded;
  for (int32_t id = 0; id < vocab_size; ++id) {
    const std::string* token = tokenizer.IdToToken(static_cast<uint32_t>(id));
    if (token == nullptr || tokenizer.IsSpecial(static_cast<uint32_t>(id))) continue;
    bytes[id] = ByteLevelBytes(*token, &decoded) ? decoded : *token;
  }
  return Create(std::move(bytes), std::move(stop_tokens));
}

}  // namespace deepinfer::grammar
