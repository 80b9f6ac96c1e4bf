// PrefixCache: chain hashes, references, the idle LRU and eviction.
#include "worker/kv_cache/prefix_cache.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace deepinfer {

std::string PrefixCacheKey(const std::string& model_fingerprint, WeightDType weights,
                           const KvCacheSpec& spec, int32_t block_size) {
  return absl::StrCat("model=", model_fingerprint, ";weights=", WeightDTypeName(weights),
                      ";cache=", spec.ToString(), ";block=", block_size);
}

namespace {

// Blocks per unit: lcm(block size, entry span) / block size.
int32_t UnitBlocks(const KvBlockPool& pool) {
  const int64_t bs = pool.block_size();
  return static_cast<int32_t>(std::lcm(bs, std::max<int64_t>(1, pool.spec().EntrySpan())) / bs);
}

}  // namespace

PrefixCache::PrefixCache(KvBlockPool* pool, PrefixCacheOptions options)
    : pool_(pool),
      enabled_(options.enabled),
      unit_blocks_(UnitBlocks(*pool)),
      key_(options.key),
      store_(enabled_ && unit_blocks_ == 1 ? options.store : nullptr),
      root_(PrefixRootHash(options.key)),
      blocks_(pool->num_blocks()) {
  if (enabled_ && unit_blocks_ > 1 && options.store != nullptr) {
    LOG(INFO) << "prefix caching in units of " << unit_blocks_ << " blocks (the KV cache "
              << pool->spec().ToString() << " has entries spanning blocks): no lower tiers";
  }
}

PrefixCache::~PrefixCache() {
  CHECK_EQ(referenced_, 0) << "PrefixCache destroyed with referenced blocks";
  if (store_ != nullptr && !idle_.empty() && pool_->backend_status().ok()) {
    // The most recent ones the store can hold, oldest of them first (so they stay in its order).
    const int64_t fit = store_->capacity_bytes() / std::max<size_t>(1, pool_->BlockBytes());
    auto from = idle_.end();
    for (int64_t n = 0; n < fit && from != idle_.begin(); ++n) --from;
    const absl::Time start = absl::Now();
    const int64_t spilled = stats_.spilled;
    for (auto it = from; it != idle_.end(); ++it) Spill(*it);
    if (stats_.spilled > spilled) {
      LOG(INFO) << "prefix cache: " << stats_.spilled - spilled << " of " << idle_.size()
                << " idle cached blocks handed to the store in "
                << absl::StrFormat("%.3f", absl::ToDoubleSeconds(absl::Now() - start)) << " s";
    }
  }
  std::vector<int32_t> idle(idle_.begin(), idle_.end());
  for (int32_t b : idle) Uncache(b);
  if (!idle.empty()) CHECK(pool_->Free(idle).ok());
}

void PrefixCache::ExtendHashes(const std::vector<int32_t>& tokens, int64_t n,
                               std::vector<uint64_t>* hashes) const {
  const int64_t bs = pool_->block_size();
  const int64_t full = std::min<int64_t>(n, static_cast<int64_t>(tokens.size())) / bs;
  for (int64_t i = static_cast<int64_t>(hashes->size()); i < full; ++i) {
    const uint64_t parent = i == 0 ? root_ : (*hashes)[i - 1];
    hashes->push_back(PrefixBlockHash(parent, tokens.data() + i * bs, bs));
  }
}

int32_t PrefixCache::CompleteBlocks(int64_t computed) const {
  const int64_t unit_tokens = int64_t{unit_blocks_} * pool_->block_size();
  return static_cast<int32_t>(computed / unit_tokens * unit_blocks_);
}

std::vector<int32_t> PrefixCache::Acquire(const std::vector<int32_t>& tokens,
                                          const std::vector<uint64_t>& hashes, int64_t max_tokens) {
  std::vector<int32_t> out;
  if (!enabled_) return out;
  const int64_t bs = pool_->block_size(), unit = unit_blocks_;
  int64_t wanted = std::min<int64_t>(static_cast<int64_t>(hashes.size()),
                                     std::min<int64_t>(max_tokens, tokens.size()) / bs);
  wanted -= wanted % unit;
  ++stats_.lookups;
  stats_.lookup_blocks += wanted;
  for (int64_t i = 0; i < wanted; ++i) {
    auto it = by_hash_.find(hashes[i]);
    if (it == by_hash_.end()) {
      const int32_t restored = store_ != nullptr ? Restore(tokens, hashes, i) : -1;
      if (restored < 0) break;
      out.push_back(restored);
      continue;
    }
    Block& b = blocks_[it->second];
    const uint64_t parent = i == 0 ? root_ : hashes[i - 1];
    if (b.parent != parent || b.unit_end != hashes[(i / unit + 1) * unit - 1] ||
        !std::equal(b.tokens.begin(), b.tokens.end(), tokens.begin() + i * bs)) {
      break;
    }
    if (b.refs == 0) {
      idle_.erase(b.idle);
      ++referenced_;
    }
    ++b.refs;
    out.push_back(it->second);
  }
  // Whole units only: the blocks of a unit cut short go back.
  const size_t whole = out.size() - out.size() % unit;
  if (whole < out.size()) {
    Release(std::vector<int32_t>(out.begin() + whole, out.end()));
    out.resize(whole);
  }
  stats_.hit_blocks += static_cast<int64_t>(out.size());
  return out;
}

absl::StatusOr<std::vector<int32_t>> PrefixCache::Allocate(int32_t n) {
  if (n < 0 || n > num_available_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("PrefixCache: asked for ", n, " blocks, ",
                                                     num_available_blocks(), " available"));
  }
  const int32_t short_by = n - pool_->num_free_blocks();
  if (short_by > 0) {
    std::vector<int32_t> evicted;
    evicted.reserve(short_by);
    for (int32_t i = 0; i < short_by; ++i) {
      const int32_t b = idle_.front();
      if (store_ != nullptr) Spill(b);
      Uncache(b);
      evicted.push_back(b);
    }
    stats_.evictions += short_by;
    absl::Status freed = pool_->Free(evicted);
    CHECK(freed.ok()) << freed;
  }
  absl::StatusOr<std::vector<int32_t>> out = pool_->Allocate(n);
  if (!out.ok()) return out.status();
  for (int32_t b : *out) blocks_[b].refs = 1;
  referenced_ += n;
  return out;
}

int32_t PrefixCache::RegisterComputed(const std::vector<int32_t>& blocks,
                                      const std::vector<int32_t>& tokens, int64_t computed,
                                      int32_t registered, std::vector<uint64_t>* hashes) {
  if (!enabled_) return registered;
  const int64_t bs = pool_->block_size();
  const int32_t complete = CompleteBlocks(std::min<int64_t>(
      {computed, static_cast<int64_t>(blocks.size()) * bs, static_cast<int64_t>(tokens.size())}));
  if (complete <= registered) return registered;
  ExtendHashes(tokens, complete * bs, hashes);
  for (int32_t i = registered; i < complete; ++i) {
    Register(blocks[i], (*hashes)[i], i == 0 ? root_ : (*hashes)[i - 1], tokens.data() + i * bs,
             (*hashes)[(i / unit_blocks_ + 1) * unit_blocks_ - 1]);
  }
  return complete;
}

void PrefixCache::Register(int32_t block, uint64_t hash, uint64_t parent, const int32_t* tokens,
                           uint64_t unit_end) {
  if (!enabled_) return;
  Block& b = blocks_[block];
  CHECK_GT(b.refs, 0) << "registering block " << block << ", which nobody references";
  if (b.cached) return;
  if (!by_hash_.emplace(hash, block).second) {
    ++stats_.duplicates;
    return;
  }
  b.cached = true;
  b.hash = hash;
  b.parent = parent;
  b.unit_end = unit_end;
  b.tokens.assign(tokens, tokens + pool_->block_size());
  b.index = -1;
  if (parent == root_) {
    b.index = 0;
  } else if (auto p = by_hash_.find(parent); p != by_hash_.end() && blocks_[p->second].index >= 0) {
    b.index = blocks_[p->second].index + 1;
  }
  ++stats_.registered;
}

void PrefixCache::Release(const std::vector<int32_t>& blocks) {
  std::vector<int32_t> to_free;
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    Block& b = blocks_[*it];
    CHECK_GT(b.refs, 0) << "releasing block " << *it << ", which nobody references";
    if (--b.refs > 0) continue;
    --referenced_;
    if (b.cached) {
      b.idle = idle_.insert(idle_.end(), *it);
    } else {
      to_free.push_back(*it);
    }
  }
  if (!to_free.empty()) {
    absl::Status freed = pool_->Free(to_free);
    CHECK(freed.ok()) << freed;
  }
}

std::vector<uint64_t> PrefixCache::ProbeSummary(int32_t max_entries) const {
  std::vector<uint64_t> out;
  if (!enabled_) return out;
  auto add = [&](const Block& b) {
    if (static_cast<int32_t>(out.size()) < max_entries && b.cached && IsPrefixProbeBlock(b.index)) {
      out.push_back(b.hash);
    }
  };
  for (const Block& b : blocks_) {
    if (b.refs > 0) add(b);
  }
  for (auto it = idle_.rbegin(); it != idle_.rend(); ++it) add(blocks_[*it]);
  return out;
}

int32_t PrefixCache::num_available_blocks() const {
  return pool_->num_free_blocks() + static_cast<int32_t>(idle_.size());
}

void PrefixCache::Spill(int32_t block) {
  const Block& b = blocks_[block];
  if (!b.cached) return;
  std::string payload;
  if (before_block_io_) before_block_io_();
  pool_->ReadBlock(block, &payload);
  store_->Put(key_, root_, b.hash, b.parent, b.tokens, std::move(payload));
  ++stats_.spilled;
}

int32_t PrefixCache::Restore(const std::vector<int32_t>& tokens,
                             const std::vector<uint64_t>& hashes, int64_t i) {
  // Leave a block for the tokens the sequence computes after its cached ones.
  if (num_available_blocks() < 2) return -1;
  const int64_t bs = pool_->block_size();
  const uint64_t parent = i == 0 ? root_ : hashes[i - 1];
  std::string payload;
  if (!store_->Lookup(key_, root_, hashes[i], parent, tokens.data() + i * bs,
                      static_cast<int32_t>(bs), pool_->BlockBytes(), &payload)) {
    return -1;
  }
  absl::StatusOr<std::vector<int32_t>> got = Allocate(1);
  CHECK(got.ok()) << got.status();
  const int32_t block = got->front();
  if (before_block_io_) before_block_io_();
  pool_->WriteBlock(block, payload);
  Block& b = blocks_[block];
  CHECK(by_hash_.emplace(hashes[i], block).second);
  b.cached = true;
  b.hash = hashes[i];
  b.parent = parent;
  b.unit_end = hashes[i];  // units of one block (a cache with tiers)
  b.tokens.assign(tokens.begin() + i * bs, tokens.begin() + (i + 1) * bs);
  b.index = static_cast<int32_t>(i);
  ++stats_.restored;
  return block;
}

void PrefixCache::Uncache(int32_t block) {
  Block& b = blocks_[block];
  if (!b.cached) return;
  if (b.refs == 0) idle_.erase(b.idle);
  by_hash_.erase(b.hash);
  b.cached = false;
  b.tokens.clear();
  b.tokens.shrink_to_fit();
}

}  // namespace deepinfer
