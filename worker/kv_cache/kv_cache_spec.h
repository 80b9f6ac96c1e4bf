// KvCacheSpec: what a model needs from the KV cache, per group of layers that cache the same
// kind of entry. The model states it (CausalLm::CacheSpec), the memory plan sums it (bytes per
// token), and KvBlockPool allocates it; nobody else knows the entry layout.
//
// Every group is paged by the same block ids: block b of a sequence covers the same positions in
// every group, so one block table serves all of them and a block is allocated and freed once.
// A kind decides what an entry holds and how many bytes a block of it takes:
//
//   kind               paged, per token and layer            per sequence and layer (state)
//   kPagedLatent       MLA latent + rotated rope key          -
//   kSlidingWindow     -                                      ring of the last `window` keys
//   kCompressed        head_dim / ratio (one entry per ratio) ring + compressor rows (HCA)
//   kCompressedSparse  (head_dim + index_dim) / ratio         ring + compressor and indexer rows
//
// Paged entries live in the sequence's blocks (block ids shared by every group). A compressed
// layer's entries form one stream of head_dim-wide entries per sequence, paged by elements:
// block b of the table holds elements [b * P, (b + 1) * P) of the stream, P = block_size *
// head_dim / ratio (so an entry may span blocks when ratio > block_size); the indexer's keys
// are a second stream beside it (index_dim wide, the same ratio).
//
// Per-sequence state is bounded whatever the sequence's length: the sliding-window ring holds
// the last `window` keys (position p at row p % window_rows()), the compressor holds its source
// rows not yet pooled (a ring of `ratio` rows for kCompressed; 2 * ratio for kCompressedSparse,
// whose windows overlap the previous one), each row its projected kv then gate. With
// speculative decoding each ring keeps `spare_rows` rows more: a verification step writes the
// rows of up to spare_rows drafts past the accepted tokens, and with the spare rows those land
// only on rows of positions no later query or window reads (docs/model.md, "Verification and
// rollback"). The pool keeps one state slot per live sequence (KvBlockPool::SequenceSlot). The
// V4 kinds are float32.
#ifndef DEEPINFER_WORKER_KV_CACHE_KV_CACHE_SPEC_H_
#define DEEPINFER_WORKER_KV_CACHE_KV_CACHE_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/backend/backend.h"

namespace deepinfer {

enum class KvCacheKind {
  // Paged MLA cache: per token, the normalised latent followed by the rotated rope key.
  kPagedLatent,
  // DeepSeek-V4 attention layers (the table above).
  kSlidingWindow,
  kCompressed,
  kCompressedSparse,
};
const char* KvCacheKindName(KvCacheKind kind);

// How a sequence reuses another's entries of a kind for the same leading tokens (prefix
// caching, worker/kv_cache/prefix_cache.h).
enum class PrefixReuse {
  // An entry depends only on the tokens up to its position and is never overwritten once
  // written: full blocks are shared read-only between sequences, and nothing else is needed.
  kShareBlocks,
  // The kind also keeps per-sequence state (a sliding-window ring, a compressor's open-window
  // rows) that blocks do not hold: the paged entries of the shared blocks are reused read-only
  // and the reusing sequence rebuilds its state by a bounded replay of the tokens before the
  // hit's end (CausalLm::BoundedReplayStart), which writes no shared block.
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
  // V4 geometry: key width (K = V), ring length, positions per compressed entry, indexer key
  // width (kCompressedSparse).
  int32_t head_dim = 0;
  int32_t window = 0;
  int32_t ratio = 0;
  int32_t index_dim = 0;
  // V4 kinds: rows every ring keeps beyond what the window and the compressor need, for the
  // drafts of a verification step that may be rejected (at most spare_rows per sequence).
  int32_t spare_rows = 0;
  // Element type of the entries (bf16 halves the bytes attention reads per token; kFp8E4M3 is
  // the latent in e4m3 with a per-token scale and the rope key in bf16,
  // worker/backend/fp8_latent_entry.h). The V4 kinds are float32 whatever this says.
  WeightDType dtype = WeightDType::kFloat32;

  // Paged bytes of one layer per token (rounded up where an entry covers several tokens).
  int64_t EntryBytes() const;
  // Bytes of one block (block_size tokens) in one layer of this group.
  int64_t BlockBytes(int32_t block_size) const;
  // Floats of the paged compressed / indexer streams per block (V4 kinds).
  int64_t CompressedFloatsPerBlock(int32_t block_size) const;
  int64_t IndexFloatsPerBlock(int32_t block_size) const;
  // Per-sequence state of one layer (V4 kinds), in floats: the window ring (window_rows() x
  // head_dim), then compressor_rows() rows of compressor_width() (kv then gate), then as many rows
  // of indexer_width() (kCompressedSparse).
  int64_t StateFloats() const;
  int64_t StateBytes() const { return StateFloats() * static_cast<int64_t>(sizeof(float)); }
  // Rows of the window ring (window + spare_rows) and of the compressor rings (ratio or
  // 2 * ratio, + spare_rows; 0 for kinds without a compressor).
  int64_t window_rows() const { return int64_t{window} + spare_rows; }
  int64_t compressor_rows() const;
  int64_t compressor_width() const;
  int64_t indexer_width() const;
  int64_t compressor_state_offset() const { return window_rows() * head_dim; }
  int64_t indexer_state_offset() const {
    return compressor_state_offset() + compressor_rows() * compressor_width();
  }
};

struct KvCacheSpec {
  std::vector<KvCacheGroupSpec> groups;

  // Bytes one token takes over every layer of every group (the memory plan's divisor).
  int64_t BytesPerToken() const;
  // Bytes one block takes over every layer of every group.
  int64_t BytesPerBlock(int32_t block_size) const;
  // Bytes of one sequence's state over every layer (0 for paged-only specs).
  int64_t StateBytesPerSequence() const;
  // The number of model layers some group covers (layers are 0 .. num_layers() - 1).
  int32_t num_layers() const;
  // INVALID_ARGUMENT naming the problem: no group, a group without layers, a layer in two
  // groups or in none below num_layers(), a geometry a kind cannot have.
  absl::Status Validate() const;
  // Whether every group's kind is PrefixReuse::kShareBlocks: a prefix-cache hit needs its
  // shared blocks only (else it also needs a bounded replay to rebuild per-sequence state).
  bool SharesPrefixBlocks() const;
  // The least common multiple over the groups of the positions one paged entry covers (a
  // compressed group's ratio; 1 for per-token entries and groups with no paged entries). A
  // block's entries are all written, and depend only on the tokens before its end, when that
  // end is a multiple of it (an entry that spans blocks is written when its window closes).
  int64_t EntrySpan() const;
  // INVALID_ARGUMENT if a paged stream does not split evenly into blocks of block_size.
  absl::Status ValidateBlockSize(int32_t block_size) const;
  // The same spec with every group's entries in `dtype` (--kv-cache-dtype; the V4 kinds stay
  // float32 for bfloat16). UNIMPLEMENTED naming the kind for kFp8E4M3 when a group is not
  // kPagedLatent (only the MLA latent has an FP8 layout, fp8_latent_entry.h).
  absl::StatusOr<KvCacheSpec> WithDType(WeightDType dtype) const;
  // "paged_latent x3 layers (512+64, bfloat16)".
  std::string ToString() const;
};

// One group of kPagedLatent entries for layers 0 .. num_layers - 1 (the MLA models' cache).
KvCacheSpec PagedLatentSpec(int32_t num_layers, int32_t latent_dim, int32_t rope_dim,
                            WeightDType dtype);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_KV_CACHE_KV_CACHE_SPEC_H_
