// PrefixCache: who holds the blocks of one rank's KvBlockPool, and which full blocks hold the
// entries of a known token prefix (prefix caching; docs/kv-cache.md).
//
// The pool stores entries and keeps a free list; this class owns the rest of a block's life:
//
//   free (in the pool) --Allocate--> referenced --Register--> referenced + cached
//   referenced --Release, last reference--> free (not cached) | idle (cached, in the LRU)
//   idle --Acquire (a hit)--> referenced + cached
//   idle --Allocate needs room (least recently released first)--> free
//
// A full block is known by a chain hash: the hash of its parent (the block before it in the
// sequence; for the first block, a root hash of the cache key) and its tokens. The key holds
// everything besides the tokens that changes an entry (model fingerprint, weight dtype, cache
// spec and dtype, block size; not the placement of experts, which does not change the values a
// model computes). A hit also compares the block's stored tokens and parent hash, so a wrong hit
// needs two different prefixes with one 64-bit chain hash. Shared blocks are read-only (a
// sequence writes only entries past its hit, which lie in blocks of its own).
//
// Blocks are registered and hit in units of unit_blocks() blocks: the least common multiple of
// the block size and the spec's EntrySpan, in blocks (1 for the paged MLA latent and for V4
// specs whose compress ratios divide the block size). A compressed entry that spans blocks
// (ratio > block size) is written when its window closes and depends on the tokens up to there,
// past the block's end: a unit's blocks are registered once the whole unit is computed, each
// tagged with the chain hash of the unit's last block, and a hit takes a unit only when every
// block found for it carries the tag of the sequence's own tokens (so its entries are those the
// sequence would compute). A hit is a whole number of units. Kinds with per-sequence state
// (PrefixReuse::kBoundedReplay) reuse the shared entries and rebuild that state by a bounded
// replay (the engine does, docs/kv-cache.md).
//
// With a KvBlockStore (PrefixCacheOptions::store), an idle cached block that is evicted is first
// copied to the store (host memory, then disk), and so are the idle cached blocks left when the
// cache is destroyed (most recent first, as many as the store holds). Acquire, finding no block
// of a hash here, asks the store and copies a block it finds into a new block of the pool
// (restored: cached again, as if computed here), while that leaves a block available.
//
// Lower tiers hold single blocks keyed by their chain hash, so a cache whose units are several
// blocks has none (PrefixCacheOptions::store is ignored).
//
// Disabled (PrefixCacheOptions::enabled false), nothing is registered, Acquire finds nothing,
// and blocks go back to the pool on their last Release: exactly the pool's own allocation.
//
// Not thread-safe: the rank's engine thread owns it.
#ifndef DEEPINFER_WORKER_KV_CACHE_PREFIX_CACHE_H_
#define DEEPINFER_WORKER_KV_CACHE_PREFIX_CACHE_H_

#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/kv/prefix_hash.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/kv_cache/kv_block_store.h"

namespace deepinfer {

struct PrefixCacheOptions {
  bool enabled = true;
  // Everything besides the tokens that changes the entries (see the top comment); hashed into
  // the root of every chain.
  std::string key;
  // Lower tiers for evicted blocks (shared by a worker's ranks, outlives the cache); null:
  // none.
  KvBlockStore* store = nullptr;
};

struct PrefixCacheStats {
  int64_t lookups = 0;        // Acquire calls
  int64_t lookup_blocks = 0;  // full blocks they asked for
  int64_t hit_blocks = 0;     // of those, found cached
  int64_t evictions = 0;      // idle cached blocks handed back to the pool for new blocks
  int64_t registered = 0;     // blocks that became cached
  int64_t duplicates = 0;     // full blocks not registered: another block held their hash
  int64_t spilled = 0;        // blocks copied to the store (evicted, or left at destruction)
  int64_t restored = 0;       // of hit_blocks, copied back from the store
};

class PrefixCache {
 public:
  // `pool` must outlive the cache. Blocks already allocated (a model's decode graphs keep one for
  // their padding rows) are not the cache's: it never hands them out nor frees them.
  PrefixCache(KvBlockPool* pool, PrefixCacheOptions options);
  ~PrefixCache();  // hands idle cached blocks back to the pool (referenced ones are a bug)

  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // Whether hits are possible (PrefixCacheOptions::enabled).
  bool enabled() const { return enabled_; }
  // Called before a block's bytes are copied to or from the store (null: nothing), so that an
  // owner stepping on another thread can have that thread idle first (worker/engine/engine.h).
  void set_before_block_io(std::function<void()> f) { before_block_io_ = std::move(f); }
  int32_t block_size() const { return pool_->block_size(); }
  // Blocks per unit of registration and hits (top comment).
  int32_t unit_blocks() const { return unit_blocks_; }
  // The leading blocks of a sequence with `computed` positions computed whose units are
  // complete: the blocks RegisterComputed may offer.
  int32_t CompleteBlocks(int64_t computed) const;

  // Appends to `hashes` the chain hashes of the full blocks of tokens[0, n) it lacks (so a
  // sequence keeps its hashes as it grows; they stay valid across preemption).
  void ExtendHashes(const std::vector<int32_t>& tokens, int64_t n,
                    std::vector<uint64_t>* hashes) const;

  // The longest run of cached blocks that starts the sequence with `tokens` (whose first
  // hashes.size() full blocks have these chain hashes), a whole number of units of at most
  // max_tokens tokens, each with a reference taken. Empty when disabled.
  std::vector<int32_t> Acquire(const std::vector<int32_t>& tokens,
                               const std::vector<uint64_t>& hashes, int64_t max_tokens);

  // n new blocks, one reference each, evicting idle cached blocks (least recently released
  // first) when the pool has too few free ones. RESOURCE_EXHAUSTED, nothing taken, when
  // num_available_blocks() < n.
  absl::StatusOr<std::vector<int32_t>> Allocate(int32_t n);

  // Offers to the cache the blocks of one sequence (its block table `blocks`, its `tokens`)
  // from index `registered` up to CompleteBlocks(computed), extending `hashes` (the sequence's
  // chain hashes, ExtendHashes) as needed; returns the new count of offered blocks (the
  // sequence's next `registered`). Blocks a hit took count as offered.
  int32_t RegisterComputed(const std::vector<int32_t>& blocks, const std::vector<int32_t>& tokens,
                           int64_t computed, int32_t registered, std::vector<uint64_t>* hashes);
  // Offers `block`, referenced and holding the written entries of `tokens` (block_size of
  // them) at the position whose chain hash is `hash`, to the cache (`parent`: the chain hash of
  // the block before it, or root_hash() for the first; `unit_end`: the chain hash of the last
  // block of its unit, `hash` itself for units of one block). No-op when disabled or when
  // another block already holds the hash (then this one stays private and is freed on its last
  // Release).
  void Register(int32_t block, uint64_t hash, uint64_t parent, const int32_t* tokens,
                uint64_t unit_end);

  // Drops one reference on each block. A block without references goes to the idle LRU when
  // cached, else back to the pool. Blocks are released last to first, so that the tail of a
  // sequence is evicted before its head. CHECK: each block is referenced.
  void Release(const std::vector<int32_t>& blocks);

  // The chain hashes of cached probe blocks (IsPrefixProbeBlock of their index in their
  // sequence), at most max_entries: those of referenced blocks first, then idle ones, most
  // recently released first. What the rank tells the coordinator it holds.
  std::vector<uint64_t> ProbeSummary(int32_t max_entries) const;
  // Blocks Allocate can hand out: free in the pool plus idle cached ones.
  int32_t num_available_blocks() const;
  // Blocks some sequence references.
  int32_t num_referenced_blocks() const { return referenced_; }
  // Cached blocks (referenced or idle).
  int32_t num_cached_blocks() const { return static_cast<int32_t>(by_hash_.size()); }
  int32_t num_idle_blocks() const { return static_cast<int32_t>(idle_.size()); }
  uint64_t root_hash() const { return root_; }
  const PrefixCacheStats& stats() const { return stats_; }

 private:
  struct Block {
    int32_t refs = 0;
    bool cached = false;
    uint64_t hash = 0;
    uint64_t parent = 0;
    uint64_t unit_end = 0;              // the chain hash of its unit's last block
    std::vector<int32_t> tokens;        // when cached
    int32_t index = -1;                 // its index in its sequence when known (cached)
    std::list<int32_t>::iterator idle;  // when cached and refs == 0
  };

  // Removes the block from the hash table (an idle block also from the LRU).
  void Uncache(int32_t block);
  // Copies a cached block to the store (before it is uncached).
  void Spill(int32_t block);
  // A new block holding the store's copy of the block with chain hash hashes[i] of `tokens`,
  // referenced and cached; -1 when the store has none or no block is left to spare.
  int32_t Restore(const std::vector<int32_t>& tokens, const std::vector<uint64_t>& hashes,
                  int64_t i);

  KvBlockPool* const pool_;
  const bool enabled_;
  const int32_t unit_blocks_;
  const std::string key_;
  KvBlockStore* const store_;
  std::function<void()> before_block_io_;
  const uint64_t root_;
  std::vector<Block> blocks_;
  absl::flat_hash_map<uint64_t, int32_t> by_hash_;
  std::list<int32_t> idle_;  // front: least recently released
  int32_t referenced_ = 0;
  PrefixCacheStats stats_;
};

// A rank's cache key: the model's fingerprint (ModelFiles::fingerprint), the weights' dtype, the
// cache spec (kinds, geometry, entry dtype) and the block size. Nothing about where the rank
// runs or which experts it hosts.
std::string PrefixCacheKey(const std::string& model_fingerprint, WeightDType weights,
                           const KvCacheSpec& spec, int32_t block_size);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_KV_CACHE_PREFIX_CACHE_H_
