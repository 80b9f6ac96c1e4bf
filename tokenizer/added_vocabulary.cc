#include "tokenizer/added_vocabulary.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

size_t PreviousCharStart(absl::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
  return start;
}

// A word character as HF's single_word check sees it: \w of Rust's regex crate
// (Alphabetic, marks, decimal digits, connector punctuation, joiners).
bool IsWordChar(absl::string_view character) {
  static const Regex* word = [] {
    auto compiled = Regex::Compile("[\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]");
    CHECK(compiled.ok()) << compiled.status();
    return compiled->release();
  }();
  return word->FullMatch(character);
}

absl::string_view CharAt(absl::string_view text, size_t pos) {
  const size_t length = ValidUtf8SequenceLength(text, pos);
  return text.substr(pos, length == 0 ? 1 : length);
}

}  // namespace

void AddedVocabulary::Trie::Insert(absl::string_view key, int32_t token_index) {
  int32_t node = 0;
  for (char c : key) {
    const uint64_t edge = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
    auto it = edges.find(edge);
    if (it == edges.end()) {
      const int32_t child = static_cast<int32_t>(token_at.size());
      token_at.push_back(-1);
      it = edges.emplace(edge, child).first;
    }
    node = it->second;
  }
  if (!key.empty()) first_byte[static_cast<uint8_t>(key[0])] = true;
  // The first token given a content wins, as in HF.
  if (token_at[node] < 0) token_at[node] = token_index;
}

int32_t AddedVocabulary::Trie::LongestMatch(absl::string_view text, size_t pos,
                                            size_t* length) const {
  int32_t node = 0, best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = edges.find((static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[i]));
    if (it == edges.end()) break;
    node = it->second;
    if (token_at[node] >= 0) {
      best = token_at[node];
      *length = i + 1 - pos;
    }
  }
  return best;
}

absl::StatusOr<std::vector<AddedToken>> AddedVocabulary::ParseJson(
    const nlohmann::json& added_tokens) {
  std::vector<AddedToken> tokens;
  if (added_tokens.is_null()) return tokens;
  if (!added_tokens.is_array()) return absl::InvalidArgumentError("added_tokens must be a list");
  for (const auto& entry : added_tokens) {
    auto id = entry.find("id");
    auto content = entry.find("content");
    if (!entry.is_object() || id == entry.end() ||
        !(id->is_number_integer() && id->get<int64_t>() >= 0) || content == entry.end() ||
        !content->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("bad added token ", entry.dump()));
    }
    auto flag = [&](const char* key, bool fallback) {
      auto it = entry.find(key);
      return it != entry.end() && it->is_boolean() ? it->get<bool>() : fallback;
    };
    AddedToken token;
    token.id = id->get<uint32_t>();
    token.content = content->get<std::string>();
    token.special = flag("special", false);
    token.lstrip = flag("lstrip", false);
    token.rstrip = flag("rstrip", false);
    token.normalized = flag("normalized", !token.special);
    token.single_word = flag("single_word", false);
    tokens.push_back(std::move(token));
  }
  return tokens;
}

absl::StatusOr<std::unique_ptr<AddedVocabulary>> AddedVocabulary::Create(
    std::vector<AddedToken> tokens, const Normalizer* normalizer) {
  std::unique_ptr<AddedVocabulary> vocabulary(new AddedVocabulary());
  vocabulary->tokens_ = std::move(tokens);
  for (size_t i = 0; i < vocabulary->tokens_.size(); ++i) {
    const AddedToken& token = vocabulary->tokens_[i];
    if (token.content.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("added token ", token.id, " is empty"));
    }
    vocabulary->content_to_id_.emplace(token.content, token.id);
    vocabulary->id_to_index_.emplace(token.id, i);
    if (token.normalized) {
      std::string key = token.content;
      if (normalizer != nullptr) normalizer->Normalize(&key);
      vocabulary->normalized_trie_.Insert(key, static_cast<int32_t>(i));
    } else {
      vocabulary->raw_trie_.Insert(token.content, static_cast<int32_t>(i));
    }
  }
  return vocabulary;
}

void AddedVocabulary::Split(absl::string_view text, bool normalized_pass,
                            std::vector<TextPiece>* pieces) const {
  const Trie& trie = normalized_pass ? normalized_trie_ : raw_trie_;
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (!trie.first_byte[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    size_t length = 0;
    const int32_t index = trie.LongestMatch(text, pos, &length);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[index];
    size_t begin = pos, end = pos + length;
    if (token.single_word) {
      const bool word_before =
          begin > 0 && IsWordChar(CharAt(text, PreviousCharStart(text, begin)));
      const bool word_after = end < text.size() && IsWordChar(CharAt(text, end));
      if (word_before || word_after) {
        // HF's matcher resumes after the rejected match, not inside it.
        pos = end;
        continue;
      }
    }
    if (token.lstrip) {
      while (begin > start_offset) {
        const size_t previous = PreviousCharStart(text, begin);
        size_t n;
        if (!IsUnicodeWhitespace(DecodeCodePoint(text, previous, &n))) break;
        begin = previous;
      }
    }
    if (token.rstrip) {
      while (end < text.size()) {
        size_t n;
        if (!IsUnicodeWhitespace(DecodeCodePoint(text, end, &n))) break;
        end += n;
      }
    }
    if (start_offset < begin) pieces->push_back({start_offset, begin, std::nullopt});
    pieces->push_back({begin, end, token.id});
    start_offset = end;
    pos = end;
  }
  if (start_offset < text.size()) pieces->push_back({start_offset, text.size(), std::nullopt});
}

std::optional<uint32_t> AddedVocabulary::TokenToId(absl::string_view content) const {
  auto it = content_to_id_.find(content);
  if (it == content_to_id_.end()) return std::nullopt;
  return it->second;
}

const AddedToken* AddedVocabulary::FindById(uint32_t id) const {
  auto it = id_to_index_.find(id);
  return it == id_to_index_.end() ? nullptr : &tokens_[it->second];
}

}  // namespace deepinfer::tokenizer
