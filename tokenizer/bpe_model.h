// The BPE model of HF tokenizer.json ("model": {"type": "BPE"}): vocabulary, merge ranks,
// unk / fuse_unk, byte_fallback, continuing_subword_prefix, end_of_word_suffix and
// ignore_merges. Turns one pre-tokenized word into ids by applying merges lowest rank first.
#ifndef TOKENIZER_BPE_MODEL_H_
#define TOKENIZER_BPE_MODEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"

namespace deepinfer::tokenizer {

class BpeModel {
 public:
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& config);

  // Appends the ids of `word` to `ids`. Thread-safe.
  void Tokenize(absl::string_view word, std::vector<uint32_t>* ids) const;

  std::optional<uint32_t> TokenToId(absl::string_view token) const;
  // nullptr for ids outside the vocabulary.
  const std::string* IdToToken(uint32_t id) const;
  // Number of vocabulary entries (HF's get_vocab_size, which sizes new added-token ids).
  size_t VocabSize() const { return vocab_.size(); }

 private:
  struct Merge {
    uint32_t rank;
    uint32_t new_id;
  };

  BpeModel() = default;
  void TokenizeUncached(absl::string_view word, std::vector<uint32_t>* ids) const;
  static uint64_t PairKey(uint32_t left, uint32_t right) {
    return (static_cast<uint64_t>(left) << 32) | right;
  }

  absl::flat_hash_map<std::string, uint32_t> vocab_;
  std::vector<std::string> id_to_token_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::optional<uint32_t> unk_id_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  // Byte-fallback token ids "<0x00>".."<0xFF>", -1 where absent.
  int64_t byte_ids_[256];

  // Words seen before (HF caches too); bounded so memory stays flat on long runs.
  static constexpr size_t kCacheCapacity = 1 << 17;
  static constexpr size_t kMaxCachedWordBytes = 256;
  mutable absl::Mutex cache_mutex_;
  mutable absl::flat_hash_map<std::string, std::vector<uint32_t>> cache_
      ABSL_GUARDED_BY(cache_mutex_);
};

}  // namespace deepinfer::tokenizer

#endif  // TOKENIZER_BPE_MODEL_H_
