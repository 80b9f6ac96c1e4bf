#include "tokenizer/bpe_model.h"

#include <queue>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

// A symbol of the word being merged, in a doubly linked list over a vector.
struct Symbol {
  uint32_t id;
  int prev, next;
  size_t length;  // bytes of the word it covers; 0 once merged into its left neighbour
};

struct Candidate {
  uint32_t rank;
  int position;
  uint32_t new_id;
  // Lowest rank first, then leftmost: the order HF applies merges in.
  bool operator<(const Candidate& other) const {
    return rank != other.rank ? rank > other.rank : position > other.position;
  }
};

absl::StatusOr<std::pair<std::string, std::string>> ParseMerge(const nlohmann::json& merge) {
  if (merge.is_string()) {
    const std::string& text = merge.get_ref<const std::string&>();
    const size_t space = text.find(' ', 1);
    if (space == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("bad merge '", text, "'"));
    }
    return std::make_pair(text.substr(0, space), text.substr(space + 1));
  }
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
    return std::make_pair(merge[0].get<std::string>(), merge[1].get<std::string>());
  }
  return absl::InvalidArgumentError(absl::StrCat("bad merge ", merge.dump()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const nlohmann::json& config) {
  auto type = config.find("type");
  if (type != config.end() && !(type->is_string() && *type == "BPE")) {
    return absl::UnimplementedError(absl::StrCat("model type ", type->dump(), " not supported"));
  }
  auto dropout = config.find("dropout");
  if (dropout != config.end() && dropout->is_number() && dropout->get<double>() > 0) {
    return absl::UnimplementedError("BPE dropout is not supported (not deterministic)");
  }
  std::unique_ptr<BpeModel> model(new BpeModel());
  auto vocab = config.find("vocab");
  if (vocab == config.end() || !vocab->is_object()) {
    return absl::InvalidArgumentError("BPE model: missing 'vocab' object");
  }
  for (const auto& [token, id] : vocab->items()) {
    if (!(id.is_number_integer() && id.get<int64_t>() >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat("BPE vocab: bad id for '", token, "'"));
    }
    const uint32_t value = id.get<uint32_t>();
    model->vocab_[token] = value;
    if (model->id_to_token_.size() <= value) model->id_to_token_.resize(value + 1);
    model->id_to_token_[value] = token;
  }
  auto field = [&](const char* key) -> std::string {
    auto it = config.find(key);
    return it != config.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  model->continuing_subword_prefix_ = field("continuing_subword_prefix");
  model->end_of_word_suffix_ = field("end_of_word_suffix");
  const std::string unk = field("unk_token");
  if (!unk.empty()) {
    auto it = model->vocab_.find(unk);
    if (it == model->vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unk_token '", unk, "' not in vocab"));
    }
    model->unk_id_ = it->second;
  }
  auto flag = [&](const char* key) {
    auto it = config.find(key);
    return it != config.end() && it->is_boolean() && it->get<bool>();
  };
  model->fuse_unk_ = flag("fuse_unk");
  model->byte_fallback_ = flag("byte_fallback");
  model->ignore_merges_ = flag("ignore_merges");
  for (int b = 0; b < 256; ++b) {
    auto it = model->vocab_.find(absl::StrFormat("<0x%02X>", b));
    model->byte_ids_[b] = it == model->vocab_.end() ? int64_t{-1} : int64_t{it->second};
  }

  auto merges = config.find("merges");
  if (merges == config.end() || !merges->is_array()) {
    return absl::InvalidArgumentError("BPE model: missing 'merges' array");
  }
  const size_t prefix_length = model->continuing_subword_prefix_.size();
  uint32_t rank = 0;
  for (const auto& merge_json : *merges) {
    auto merge = ParseMerge(merge_json);
    if (!merge.ok()) return merge.status();
    const auto& [left, right] = *merge;
    auto left_id = model->vocab_.find(left);
    auto right_id = model->vocab_.find(right);
    // The merged token drops the right part's continuation prefix.
    std::string merged = left;
    if (prefix_length > 0 &&
        absl::string_view(right).substr(0, prefix_length) == model->continuing_subword_prefix_) {
      merged += right.substr(prefix_length);
    } else {
      merged += right;
    }
    auto merged_id = model->vocab_.find(merged);
    if (left_id == model->vocab_.end() || right_id == model->vocab_.end() ||
        merged_id == model->vocab_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("merge '", left, " ", right, "' uses a token missing from the vocab"));
    }
    model->merges_.emplace(PairKey(left_id->second, right_id->second),
                           Merge{rank++, merged_id->second});
  }
  return model;
}

std::optional<uint32_t> BpeModel::TokenToId(absl::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(uint32_t id) const {
  if (id >= id_to_token_.size()) return nullptr;
  // Holes in a sparse vocabulary are empty strings, which are never real tokens.
  if (id_to_token_[id].empty() && !vocab_.contains("")) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::Tokenize(absl::string_view word, std::vector<uint32_t>* ids) const {
  if (word.empty()) return;
  if (word.size() > kMaxCachedWordBytes) {
    TokenizeUncached(word, ids);
    return;
  }
  {
    absl::MutexLock lock(&cache_mutex_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids->size();
  TokenizeUncached(word, ids);
  absl::MutexLock lock(&cache_mutex_);
  if (cache_.size() < kCacheCapacity) {
    cache_.emplace(word, std::vector<uint32_t>(ids->begin() + first, ids->end()));
  }
}

void BpeModel::TokenizeUncached(absl::string_view word, std::vector<uint32_t>* ids) const {
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  bool previous_unk = false;
  std::string scratch;
  auto push = [&symbols](uint32_t id, size_t length) {
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, length});
  };
  for (size_t pos = 0; pos < word.size();) {
    size_t length = ValidUtf8SequenceLength(word, pos);
    if (length == 0) length = 1;  // cannot happen after RepairUtf8; stay in bounds anyway
    absl::string_view piece = word.substr(pos, length);
    const bool first = pos == 0, last = pos + length == word.size();
    if ((!first && !continuing_subword_prefix_.empty()) || (last && !end_of_word_suffix_.empty())) {
      scratch.assign(first ? "" : continuing_subword_prefix_);
      scratch.append(piece.data(), piece.size());
      if (last) scratch += end_of_word_suffix_;
      piece = scratch;
    }
    auto it = vocab_.find(piece);
    if (it != vocab_.end()) {
      push(it->second, length);
      previous_unk = false;
    } else {
      bool handled = false;
      if (byte_fallback_) {
        handled = true;
        for (size_t i = 0; i < length; ++i) {
          if (byte_ids_[static_cast<uint8_t>(word[pos + i])] < 0) handled = false;
        }
        if (handled) {
          for (size_t i = 0; i < length; ++i) {
            push(static_cast<uint32_t>(byte_ids_[static_cast<uint8_t>(word[pos + i])]), 1);
          }
          previous_unk = false;
        }
      }
      if (!handled && unk_id_.has_value()) {
        if (fuse_unk_ && previous_unk) {
          symbols.back().length += length;
        } else {
          push(*unk_id_, length);
        }
        previous_unk = true;
      }
      // Without unk, HF drops the character.
    }
    pos += length;
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  std::priority_queue<Candidate> queue;
  auto consider = [&](int position) {
    const int next = symbols[position].next;
    if (next < 0) return;
    auto it = merges_.find(PairKey(symbols[position].id, symbols[next].id));
    if (it != merges_.end()) queue.push({it->second.rank, position, it->second.new_id});
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) consider(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.position];
    if (left.length == 0 || left.next < 0) continue;
    // Stale entry: one side was merged with something else since it was queued.
    auto it = merges_.find(PairKey(left.id, symbols[left.next].id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    Symbol& right = symbols[left.next];
    left.id = top.new_id;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.position;
    if (left.prev >= 0) consider(left.prev);
    consider(top.position);
  }
  for (int i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

}  // namespace deepinfer::tokenizer
