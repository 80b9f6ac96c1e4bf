// Expert load counting for EPLB: how many (token, choice) pairs each expert received, added
// into a device array that stays on the GPU across steps. The GPU counterpart of
// Backend::AccumulateExpertCounts.
#ifndef DEEPINFER_KERNELS_MOE_EXPERT_COUNTS_H_
#define DEEPINFER_KERNELS_MOE_EXPERT_COUNTS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// counts[ids[i]] += 1 for i in [0, n) (atomics; ids outside [0, num_experts) are skipped).
// ids and counts are device pointers. count_limit (device, may be null): only i < *count_limit
// is counted, read when the kernel runs (a replayed graph of fixed n skips its padding rows).
// cudaErrorInvalidValue for n < 0 or num_experts < 1.
cudaError_t AccumulateExpertCounts(int64_t n, const int32_t* ids, int64_t num_experts,
                                   const int32_t* count_limit, int64_t* counts,
                                   cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_EXPERT_COUNTS_H_
