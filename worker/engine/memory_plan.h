// MemoryPlan: how a rank divides its GPU's memory, decided up front (as vLLM's
// --gpu-memory-utilization does): the weights first, then an activation reserve estimated from
// the step size, and the KV cache gets the rest of `utilization` x total device memory.
//
//   budget   = utilization * total - in use (context, other processes, this rank's weights)
//   KV bytes = budget - activation reserve,  in whole blocks of block_size tokens
//
// CheckWeightsFit runs before anything is loaded (weights sized from the config alone), so a
// model that cannot fit fails with a clear error instead of an allocation crash mid-load;
// PlanKvCache runs after loading, from what the driver reports as free then.
//
// CPU ranks have no device of their own: their weights and KV caches (a fixed number of tokens,
// --kv-cache-tokens) live in host memory, which all ranks of a worker share. HostMemoryPlan
// adds up what all of them will hold and CheckHostMemoryFits compares it with what the machine
// has available (HostMemory, host_memory.h) before any rank loads, so a model that does not fit
// is refused at once instead of filling memory until the machine swaps or the worker is killed.
#ifndef DEEPINFER_WORKER_ENGINE_MEMORY_PLAN_H_
#define DEEPINFER_WORKER_ENGINE_MEMORY_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/backend/backend.h"

namespace deepinfer {

struct MemoryPlanOptions {
  double utilization = 0.9;  // fraction of total device memory this rank may use, (0, 1]
  int32_t block_size = 16;
  int32_t max_batch_tokens = 2048;
};

// A heuristic upper bound on one step's transient device memory for max_batch_tokens new
// tokens: the architecture's live fp32 values per token (Architecture::
// activation_floats_per_token: the largest part of a layer with its dispatched rows and bf16
// operand copies, the residual stream and a full logits row) times the tokens, doubled for
// allocator fragmentation, plus 256 MiB for cuBLAS workspaces and kernels.
int64_t ActivationReserveBytes(int64_t floats_per_token, int32_t max_batch_tokens);

// Decode steps recorded as CUDA graphs keep their activations in the graph allocator, apart
// from the reserve above and for as long as the graphs live: per bucket (batch size, e.g.
// DecodeGraphBuckets), that many tokens' live activations, not doubled (a recorded graph's
// allocations do not fragment) and without the fixed part.
int64_t DecodeGraphReserveBytes(int64_t floats_per_token, const std::vector<int64_t>& buckets);

// RESOURCE_EXHAUSTED, naming every term, when weight_bytes + reserve_bytes exceed
// utilization * total - in use; INVALID_ARGUMENT for a utilization outside (0, 1].
absl::Status CheckWeightsFit(const DeviceMemoryInfo& before_load, int64_t weight_bytes,
                             int64_t reserve_bytes, const MemoryPlanOptions& options);

struct KvCachePlan {
  int64_t total_bytes = 0;
  int64_t in_use_bytes = 0;  // after loading the weights
  int64_t weight_bytes = 0;
  int64_t reserve_bytes = 0;
  int64_t kv_bytes_per_token = 0;  // KvCacheSpec::BytesPerToken
  int32_t num_blocks = 0;
  int64_t tokens() const;
  int64_t kv_bytes() const { return tokens() * kv_bytes_per_token; }
  int32_t block_size = 16;
  // "weights 1.23 GiB, KV cache 4567 blocks x 16 = 73072 tokens (3.45 GiB), activation reserve
  // 512.0 MiB, in use after loading 2.00 GiB of 139.80 GiB, utilization 0.90" (MiB below 1 GiB)
  std::string ToString(double utilization) const;
};

// The KV cache that fits after the weights are loaded. RESOURCE_EXHAUSTED when fewer than two
// blocks fit (the message says how much was available and suggests what to change).
absl::StatusOr<KvCachePlan> PlanKvCache(const DeviceMemoryInfo& after_load, int64_t weight_bytes,
                                        int64_t reserve_bytes, int64_t kv_bytes_per_token,
                                        const MemoryPlanOptions& options);

// What the CPU ranks of one worker hold in host memory, all ranks together. The step's
// activations are not counted.
struct HostMemoryPlan {
  int num_ranks = 0;
  WeightDType weight_dtype = WeightDType::kFloat32;
  int64_t weight_bytes = 0;  // Architecture::weight_bytes, summed over the ranks
  WeightDType kv_cache_dtype = WeightDType::kFloat32;
  int64_t kv_cache_tokens = 0;  // per rank
  int64_t kv_cache_bytes = 0;   // all ranks
  int64_t available_bytes = 0;  // HostMemory::AvailableBytes before loading

  int64_t needed_bytes() const { return weight_bytes + kv_cache_bytes; }
  // "1 rank: weights 3.0 MiB (float32) + KV cache 16384 tokens per rank 36.0 MiB (float32) =
  // 39.0 MiB of 20.61 GiB available"
  std::string ToString() const;
};

// The plan for `num_ranks` ranks that hold `weight_bytes` of weights together and
// `kv_cache_tokens` KV entries of `kv_bytes_per_token` (KvCacheSpec::BytesPerToken, entries in
// `kv_cache_dtype`) each; available_bytes is left 0 for the caller.
HostMemoryPlan PlanHostMemory(int num_ranks, WeightDType weight_dtype, int64_t weight_bytes,
                              WeightDType kv_cache_dtype, int64_t kv_bytes_per_token,
                              int64_t kv_cache_tokens);

// RESOURCE_EXHAUSTED, with every term of the plan and what to change, when the ranks need more
// than is available.
absl::Status CheckHostMemoryFits(const HostMemoryPlan& plan);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_ENGINE_MEMORY_PLAN_H_
