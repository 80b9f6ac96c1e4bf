// KvCacheSpec: what a model needs from the KV cache, per group of layers that cache the same
// kind of entry. The model states it (CausalLm::CacheSpec), the memory plan sums it (bytes per
// token), and KvBlockPool allocates it; nobody else knows the entry layout.
//
// Every group is paged by the same block ids: block b of a sequence covers the same positions in
// every group, so one block table serves all of them and a block is allocated and freed once.
// A kind decides what an entry holds and how many bytes a block of it takes:
//
//   kind            entry per token and layer                            view the attention op gets
//   kPagedLatent    MLA latent (latent_dim) + rotated rope key (rope_dim)  PagedLatentCacheView
//
// A new kind (a sliding-window ring whose blocks wrap after `window` positions, a compressed
// cache holding one entry per `ratio` positions, an indexer cache of small keys) is a new enum
// value with its geometry fields, its BlockBytes, and its view in KvBlockPool: the pool, the
// block tables and the memory plan stay as they are.
#ifndef DEEPINFER_WORKER_KV_CACHE_KV_CACHE_SPEC_H_
#define DEEPINFER_WORKER_KV_CACHE_KV_CACHE_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/backend/backend.h"

namespace deepinfer {

enum class KvCacheKind {
  // Paged MLA cache: per token, the normalised latent followed by the rotated rope key.
  kPagedLatent,
};
const char* KvCacheKindName(KvCacheKind kind);

// Whether a sequence may reuse another's entries of a kind for the same leading tokens
// (prefix caching, worker/kv_cache/prefix_cache.h).
enum class PrefixReuse {
  // An entry depends only on the tokens up to its position and is never overwritten once
  // written: full blocks are shared read-only between sequences.
  kShareBlocks,
  // Entries are overwritten or carry per-sequence state (a sliding-window ring, a compressor's
  // running state): a reuse must rebuild that state by replaying a bounded window of tokens.
  // The prefix cache does not do that yet and declines hits for a spec with such a group.
  kBoundedReplay,
};
PrefixReuse KvCacheKindPrefixReuse(KvCacheKind kind);

// One group of layers with the same cache entry.
struct KvCacheGroupSpec {
  KvCacheKind kind = KvCacheKind::kPagedLatent;
  std::vector<int32_t> layers;  // model layer indices, ascending
  // kPagedLatent geometry.
  int32_t latent_dim = 0;  // kv_lora_rank
  int32_t rope_dim = 0;    // qk_rope_head_dim
  // Element type of the entries (bf16 halves the bytes attention reads per token).
  WeightDType dtype = WeightDType::kFloat32;

  // Bytes of one layer's entry for one token.
  int64_t EntryBytes() const;
  // Bytes of one block (block_size tokens) in one layer of this group.
  int64_t BlockBytes(int32_t block_size) const;
};

struct KvCacheSpec {
  std::vector<KvCacheGroupSpec> groups;

  // Bytes one token takes over every layer of every group (the memory plan's divisor).
  int64_t BytesPerToken() const;
  // Bytes one block takes over every layer of every group.
  int64_t BytesPerBlock(int32_t block_size) const;
  // The number of model layers some group covers (layers are 0 .. num_layers() - 1).
  int32_t num_layers() const;
  // INVALID_ARGUMENT naming the problem: no group, a group without layers, a layer in two
  // groups or in none below num_layers(), a geometry a kind cannot have.
  absl::Status Validate() const;
  // Whether every group's kind is PrefixReuse::kShareBlocks (prefix caching may share blocks).
  bool SharesPrefixBlocks() const;
  // The same spec with every group's entries in `dtype` (--kv-cache-dtype).
  KvCacheSpec WithDType(WeightDType dtype) const;
  // "paged_latent x3 layers (512+64, bfloat16)".
  std::string ToString() const;
};

// One group of kPagedLatent entries for layers 0 .. num_layers - 1 (the MLA models' cache).
KvCacheSpec PagedLatentSpec(int32_t num_layers, int32_t latent_dim, int32_t rope_dim,
                            WeightDType dtype);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_KV_CACHE_KV_CACHE_SPEC_H_
