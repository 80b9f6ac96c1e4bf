#include "common/grammar/token_vocabulary.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>

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
  v->string_units_.Build(v->bytes_, v->sorted_, v->mask_words());
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

void StringUnitTable::Build(const std::vector<std::string>& bytes,
                            const std::vector<int32_t>& sorted, int32_t mask_words) {
  // States: 0 between units; 1 after '\\'; 2-5 after "\\u" and 0-3 hex digits; 6 and 7 one
  // and two continuation bytes (80-BF) to go; 8 after E0 (A0-BF next), 9 after ED (80-9F
  // next, no surrogates), 10 after F0 (90-BF next), 11 after F1-F3 (80-BF next), 12 after
  // F4 (80-8F next): the lead bytes' exact second-byte ranges.
  std::memset(next_, -1, sizeof(next_));
  auto set = [&](int state, int lo, int hi, int to) {
    for (int b = lo; b <= hi; ++b) next_[state][b] = static_cast<int8_t>(to);
  };
  set(0, 0x20, 0x7F, 0);
  next_[0]['"'] = -1;
  next_[0]['\\'] = 1;
  set(0, 0xC2, 0xDF, 6);
  set(0, 0xE0, 0xE0, 8);
  set(0, 0xE1, 0xEC, 7);
  set(0, 0xED, 0xED, 9);
  set(0, 0xEE, 0xEF, 7);
  set(0, 0xF0, 0xF0, 10);
  set(0, 0xF1, 0xF3, 11);
  set(0, 0xF4, 0xF4, 12);
  for (char c : std::string("\"\\/bfnrt")) next_[1][static_cast<uint8_t>(c)] = 0;
  next_[1]['u'] = 2;
  for (int s = 2; s <= 5; ++s) {
    const int to = s == 5 ? 0 : s + 1;
    set(s, '0', '9', to);
    set(s, 'a', 'f', to);
    set(s, 'A', 'F', to);
  }
  set(6, 0x80, 0xBF, 0);
  set(7, 0x80, 0xBF, 6);
  set(8, 0xA0, 0xBF, 6);
  set(9, 0x80, 0x9F, 6);
  set(10, 0x90, 0xBF, 7);
  set(11, 0x80, 0xBF, 7);
  set(12, 0x80, 0x8F, 7);

  mask_words_ = mask_words;
  std::vector<std::pair<int32_t, int32_t>> whole;              // (units, token)
  std::vector<std::tuple<int32_t, int32_t, int32_t>> pending;  // (units, token, exit)
  leaving_.clear();
  leaving_bytes_.clear();
  max_units_ = 0;
  for (int32_t token : sorted) {
    const std::string& b = bytes[token];
    int state = kBoundary;
    int32_t units = 0, boundary = 0;
    bool left = false;
    for (size_t j = 0; j < b.size(); ++j) {
      if (units == kMaxUnits) {
        left = true;
        break;
      }
      state = next_[state][static_cast<uint8_t>(b[j])];
      if (state < 0) {
        left = true;
        break;
      }
      if (state == kBoundary) {
        ++units;
        boundary = static_cast<int32_t>(j + 1);
      }
    }
    if (state != kBoundary) left = true;  // a cut unit
    max_units_ = std::max(max_units_, units);
    if (left) {
      pending.push_back({units, token, boundary});
    } else {
      whole.push_back({units, token});
    }
  }
  // Leaving tokens by units, then by their bytes from the exit, each with the bytes it shares
  // with the one before.
  auto suffix = [&](const std::tuple<int32_t, int32_t, int32_t>& e) {
    return absl::string_view(bytes[std::get<1>(e)]).substr(std::get<2>(e));
  };
  std::sort(pending.begin(), pending.end(), [&](const auto& a, const auto& b) {
    if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) < std::get<0>(b);
    return suffix(a) < suffix(b);
  });
  absl::string_view previous;
  int32_t previous_units = -1;
  for (const auto& e : pending) {
    const absl::string_view bytes_from_exit = suffix(e);
    int32_t shared = 0;
    if (std::get<0>(e) == previous_units) {
      while (shared < static_cast<int32_t>(std::min(previous.size(), bytes_from_exit.size())) &&
             previous[shared] == bytes_from_exit[shared]) {
        ++shared;
      }
    }
    const int32_t begin = static_cast<int32_t>(leaving_bytes_.size());
    leaving_bytes_.append(bytes_from_exit.data(), bytes_from_exit.size());
    leaving_.push_back({std::get<1>(e), std::get<0>(e), begin,
                        static_cast<int32_t>(leaving_bytes_.size()), shared});
    previous = bytes_from_exit;
    previous_units = std::get<0>(e);
  }
  // Each whole token in the bitmask of its unit count, then each bitmask ORed with the one
  // before.
  whole_up_to_.assign(static_cast<size_t>(max_units_ + 1) * mask_words_, 0);
  for (const auto& [units, token] : whole) {
    whole_up_to_[static_cast<size_t>(units) * mask_words_ + (token >> 5)] |= 1u << (token & 31);
  }
  for (size_t w = mask_words_; w < whole_up_to_.size(); ++w) {
    whole_up_to_[w] |= whole_up_to_[w - mask_words_];
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
