// KvBlockPool: the paged KV cache of one rank, laid out by the model's KvCacheSpec. Per layer it
// holds num_blocks blocks of block_size token entries of that layer's group (kv_cache_spec.h:
// for kPagedLatent the normalised MLA latent followed by the rotated rope key, float32,
// bfloat16 or FP8). Block ids are shared by every group: sequences own lists of block ids (block
// tables), and the pool only hands blocks out and takes them back. Memory is a backend buffer,
// so the same pool serves the CPU and CUDA backends.
#ifndef DEEPINFER_WORKER_KV_CACHE_KV_BLOCK_POOL_H_
#define DEEPINFER_WORKER_KV_CACHE_KV_BLOCK_POOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/backend/backend.h"
#include "worker/kv_cache/kv_cache_spec.h"

namespace deepinfer {

struct KvBlockPoolOptions {
  KvCacheSpec spec;  // CausalLm::CacheSpec (with the --kv-cache-dtype chosen)
  int32_t num_blocks = 0;
  int32_t block_size = 16;
  // Sequences that may hold per-sequence state at once (specs with state: V4's kinds); 0: the
  // smaller of num_blocks and 64.
  int32_t max_sequences = 0;
};

// The cache element type a --kv-cache-dtype value selects: "auto" (or empty) = weight_dtype, the
// backend's; "bfloat16" / "float32" (also "bf16" / "fp32"); "fp8" (also "fp8_e4m3",
// "float8_e4m3": kFp8E4M3, the MLA latent in e4m3 with a per-token scale); INVALID_ARGUMENT
// naming the value otherwise.
absl::StatusOr<WeightDType> ResolveKvCacheDType(const std::string& name, WeightDType weight_dtype);

class KvBlockPool {
 public:
  // INVALID_ARGUMENT for a spec that does not validate or a non-positive size.
  static absl::StatusOr<std::unique_ptr<KvBlockPool>> Create(Backend* backend,
                                                             const KvBlockPoolOptions& options);

  // Takes n blocks, or none and RESOURCE_EXHAUSTED if fewer than n are free.
  absl::StatusOr<std::vector<int32_t>> Allocate(int32_t n);
  // Returns blocks; INVALID_ARGUMENT (and nothing freed) on an unknown or already free id. A
  // state slot bound to one of them (SequenceSlot) is released with it.
  absl::Status Free(const std::vector<int32_t>& blocks);
  // The state slot of the sequence keyed by `key_block` (allocated): the first block of its
  // table that it does not share with other sequences (SequenceStep::shared_blocks; its first
  // block without prefix caching). Bound on first use, released when that block is freed or by
  // ReleaseSequenceSlot. *fresh is set when the slot was bound by this call.
  // RESOURCE_EXHAUSTED when every slot is bound, INVALID_ARGUMENT for a block that is not
  // allocated, FAILED_PRECONDITION for a spec without state.
  absl::StatusOr<int32_t> SequenceSlot(int32_t key_block, bool* fresh = nullptr);
  // Releases the slot bound to `key_block`, if one is (a no-op otherwise, and for a spec
  // without state): a sequence that ends while its key block stays allocated (the prefix cache
  // keeps it) gives its state back this way.
  void ReleaseSequenceSlot(int32_t key_block);
  int32_t num_state_slots() const { return num_state_slots_; }
  // A layer's per-sequence state (KvCacheGroupSpec::StateFloats floats) in slot `slot`.
  float* SequenceState(int32_t layer, int32_t slot) const {
    return static_cast<float*>(state_[layer]->data()) + slot * LayerGroup(layer).StateFloats();
  }
  // The paged bytes `blocks` hold in every layer, copied to host memory (a preempted V4
  // sequence keeps its compressed entries this way: CausalLm::BoundedReplayStart), and such
  // bytes copied into other blocks (as many as were read). INVALID_ARGUMENT for a block that is
  // not allocated or bytes of another size.
  absl::StatusOr<std::vector<char>> ReadBlocks(const std::vector<int32_t>& blocks) const;
  absl::Status WriteBlocks(const std::vector<int32_t>& blocks, const std::vector<char>& bytes);
  // Bytes of one block over every layer: what ReadBlock gives and WriteBlock takes.
  size_t BlockBytes() const;
  // Copies the entries of `block` (every layer, in layer order; within a V4 layer its
  // compressed entries, then its indexer keys) to host memory (*out is resized to
  // BlockBytes()), and back; for the prefix cache's lower tiers (kv_block_store.h). Blocks
  // only: a kind's per-sequence state is not part of them.
  void ReadBlock(int32_t block, std::string* out) const;
  void WriteBlock(int32_t block, const std::string& data) const;
  // The backend's status (a failed device cannot be read back).
  absl::Status backend_status() const { return backend_->status(); }
  Backend* backend() const { return backend_; }
  // Number of blocks a sequence of num_tokens tokens needs.
  int32_t BlocksFor(int64_t num_tokens) const;

  int32_t num_free_blocks() const;
  int32_t num_blocks() const { return options_.num_blocks; }
  int32_t block_size() const { return options_.block_size; }
  const KvBlockPoolOptions& options() const { return options_; }
  const KvCacheSpec& spec() const { return options_.spec; }
  // The group of `layer` in the spec.
  const KvCacheGroupSpec& LayerGroup(int32_t layer) const {
    return options_.spec.groups[group_of_[layer]];
  }
  // The device memory of one layer: num_blocks * block_size entries of its group.
  void* LayerData(int32_t layer) const { return layers_[layer]->data(); }
  // A kPagedLatent layer's view for the attention ops (CHECK: the layer is one).
  PagedLatentCacheView LayerView(int32_t layer) const;
  // Different for every pool this process creates: lets a user of a pool's addresses (the
  // model's recorded decode graphs) notice that it was handed another pool.
  uint64_t id() const { return id_; }

 private:
  KvBlockPool(Backend* backend, const KvBlockPoolOptions& options,
              std::vector<std::unique_ptr<DeviceBuffer>> layers,
              std::vector<std::unique_ptr<DeviceBuffer>> state, int32_t num_state_slots);

  // Per layer, the bytes one block takes in each of the layer buffer's regions (a region holds
  // num_blocks such runs: the MLA entries, or a V4 layer's compressed then indexer streams).
  std::vector<int64_t> BlockRegions(int32_t layer) const;
  // Checks that every block is allocated.
  absl::Status CheckAllocated(const std::vector<int32_t>& blocks) const;

  Backend* const backend_;
  const KvBlockPoolOptions options_;
  std::vector<size_t> group_of_;  // per layer, its index in options_.spec.groups
  const uint64_t id_;
  std::vector<std::unique_ptr<DeviceBuffer>> layers_;
  std::vector<std::unique_ptr<DeviceBuffer>> state_;  // per layer (null: no state)
  const int32_t num_state_slots_;
  mutable absl::Mutex mu_;
  std::vector<int32_t> slot_of_block_ ABSL_GUARDED_BY(mu_);  // -1: none bound
  std::vector<int32_t> free_slots_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> free_ ABSL_GUARDED_BY(mu_);  // used as a stack: LIFO reuse
  std::vector<char> in_use_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_KV_CACHE_KV_BLOCK_POOL_H_
