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

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_ENGINE_MEMORY_PLAN_H_
