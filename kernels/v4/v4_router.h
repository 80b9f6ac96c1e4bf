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
// The most experts (the selection keeps two fp32 values per expert and token in shared memory).
inline constexpr int64_t kMaxV4RouteExperts = 4096;

// Every pointer of args is device memory. One warp per token: the scores of its experts in
// shared memory, top_k rounds of a warp arg-max (the choices as the CPU's partial sort orders
// them), then lane 0 sums the chosen scores in that order, divides and sorts the pairs by id
// (stable), from shared memory only. The weights are the CPU's up to expf / log1pf / sqrtf
// rounding; the ids are the CPU's unless two scores + bias are within that rounding of each
// other.
// cudaErrorInvalidValue for negative rows, experts outside [1, kMaxV4RouteExperts], top_k
// outside [1, min(experts, kMaxV4RouteTopK)], or a hash table without token ids; nothing is
// launched for rows 0.
cudaError_t V4RouteF32(const V4RouteArgs& args, cudaStream_t stream);

// The most tokens and experts V4RouteFromHiddenF32 takes (decode batches: a block keeps the
// scores of its tokens in static shared memory; larger batches are a GEMM's job).
inline constexpr int64_t kMaxV4RouteFromHiddenTokens = 256;
inline constexpr int64_t kMaxV4RouteFromHiddenExperts = 256;

struct V4RouteFromHiddenParams {
  V4RouteFromHiddenArgs args;  // args.route.logits is not read
  float* logits = nullptr;     // [rows, experts]: the logits, written (the blocks' hand-over)
  // At least ceil(rows / V4RouteFromHiddenTileTokens(rows)) zeros, left zero by every call
  // (which block of a token tile comes last). One array per stream: calls must not overlap.
  uint32_t* tile_counters = nullptr;
};

// Tokens per block of V4RouteFromHiddenF32 for `rows` tokens (1, 2, 4 or 8).
int32_t V4RouteFromHiddenTileTokens(int64_t rows);

// Whether V4RouteFromHiddenF32 takes these arguments: V4RouteF32's limits, at most
// kMaxV4RouteFromHiddenTokens rows and kMaxV4RouteFromHiddenExperts experts, hidden_size a
// positive multiple of 4, hidden and router_weight 16-byte aligned, the pointers set.
bool V4RouteFromHiddenSupported(const V4RouteFromHiddenArgs& args);

// The router logits of the hidden rows (fp32 dot products with the router weight's rows, in an
// order of the kernel's own, the same for every row count: kernels/moe/router_logits_tile.cuh)
// and V4RouteF32's routing of them, bit for bit, in one launch; the logits are left in p.logits.
// cudaErrorInvalidValue where V4RouteFromHiddenSupported(p.args) is false or p.logits or
// p.tile_counters is null (rows 0: nothing launched).
cudaError_t V4RouteFromHiddenF32(const V4RouteFromHiddenParams& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_V4_V4_ROUTER_H_
