// DeepSeek-V4's router on the GPU (V4Ops::Route, worker/backend/v4_ops.h): sqrtsoftplus or
// sigmoid scores, the top-k of scores + bias (ties to the lower expert id) or the hash table's
// row of the token, the chosen scores renormalised and scaled, the pairs sorted by expert id
// within a token. One launch, no workspace (capturable in a CUDA graph).
#ifndef DEEPINFER_KERNELS_V4_V4_ROUTER_H_
#define DEEPINFER_KERNELS_V4_V4_ROUTER_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "worker/backend/v4_ops.h"

namespace deepinfer {
namespace kernels {

// The most experts a token chooses.
inline constexpr int64_t kMaxV4RouteTopK = 32;
// The most experts (the selection keeps one fp32 score per expert in shared memory).
inline constexpr int64_t kMaxV4RouteExperts = 8192;

// Every pointer of args is device memory. One warp per token: the scores of its experts in
// shared memory, top_k rounds of a warp arg-max (the choices as the CPU's partial sort orders
// them), then lane 0 sums the chosen scores in that order, divides and sorts the pairs by id
// (stable). The weights are the CPU's up to expf / log1pf / sqrtf rounding; the ids are the
// CPU's unless two scores + bias are within that rounding of each other.
// cudaErrorInvalidValue for negative rows, experts outside [1, kMaxV4RouteExperts], top_k
// outside [1, min(experts, kMaxV4RouteTopK)], or a hash table without token ids; nothing is
// launched for rows 0.
cudaError_t V4RouteF32(const V4RouteArgs& args, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_V4_V4_ROUTER_H_
