// Expert counts: one thread per (token, choice), a 64-bit atomic add per id. A step routes at
// most a few thousand pairs onto 256 counters, so contention is low and a shared-memory
// histogram would not pay for its extra pass.
#include "kernels/common/launch.cuh"
#include "kernels/moe/expert_counts.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;

__device__ void AccumulateExpertCountsBody(int64_t n, const int32_t* ids, int64_t num_experts,
                                           const int32_t* count_limit, unsigned long long* counts) {
  const int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  if (i >= n || (count_limit != nullptr && i >= *count_limit)) return;
  const int32_t e = ids[i];
  if (e >= 0 && e < num_experts) atomicAdd(counts + e, 1ull);
}

}  // namespace

cudaError_t AccumulateExpertCounts(int64_t n, const int32_t* ids, int64_t num_experts,
                                   const int32_t* count_limit, int64_t* counts,
                                   cudaStream_t stream) {
  if (n < 0 || num_experts < 1) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  static_assert(sizeof(unsigned long long) == sizeof(int64_t), "64-bit counters");
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return LaunchAfterPrecedingGrids<AccumulateExpertCountsBody, kThreads>(
      static_cast<unsigned>(blocks), 0, stream, n, ids, num_experts, count_limit,
      reinterpret_cast<unsigned long long*>(counts));
}

}  // namespace kernels
}  // namespace deepinfer
