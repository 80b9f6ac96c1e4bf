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
  v->sorted_offset_.assign(1, 0);
  for (int32_t t : v->sorted_) {
    v->sorted_data_ += v->bytes_[t];
    v->sorted_offset_.push_back(static_cast<uint32_t>(v->sorted_data_.size()));
  }
  v->common_prefix_.assign(v->sorted_.size(), 0);
  for (size_t k = 1; k < v->sorted_.size(); ++k) {
    const std::string& a = v->bytes_[v->sorted_[k - 1]];
    const std::string& b = v->bytes_[v->sorted_[k]];
    size_t l = 0;
    while (l < a.size() && l < b.size() && a[l] == b[l] && l < 0xFFFF) ++l;
    v->common_prefix_[k] = static_cast<uint16_t>(l);
  }
  return v;
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
