// DeepSeek-V4's hyper-connections on the GPU (the V4Ops HcMix, HcHead and HcExpand of
// worker/backend/v4_ops.h, whose comments define the arithmetic): each op is one launch that
// reads the residual streams once, with no workspace, host synchronisation or allocation (so
// each can be recorded in a CUDA graph). fp32 throughout; the sums run in the CPU reference's
// order with the same roundings (no fused multiply-adds), so the collapse and the expand give
// the CPU's bits and the mixing weights differ only through expf.
#ifndef DEEPINFER_KERNELS_V4_HYPER_CONNECTION_H_
#define DEEPINFER_KERNELS_V4_HYPER_CONNECTION_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "worker/backend/v4_ops.h"

namespace deepinfer {
namespace kernels {

// The most streams the kernels take.
inline constexpr int64_t kMaxHcStreams = 8;

// Every pointer of args is device memory. The collapse of a row is split over blocks along
// hidden; one more block per row computes post and the Sinkhorn-projected comb (a warp, one
// matrix element per lane). cudaErrorInvalidValue for negative sizes, hc outside
// [1, kMaxHcStreams] or sinkhorn_iters < 1; nothing is launched for rows or hidden 0.
cudaError_t HcMixF32(const HcMixArgs& args, cudaStream_t stream);
// The head's collapse (HcMix's collapse with its own weights). Errors as HcMixF32.
cudaError_t HcHeadF32(const HcHeadArgs& args, cudaStream_t stream);
// streams_out = post * block_out + combᵀ · streams_in, one pass over streams_in (each thread
// loads its columns of every stream once and writes them to every output stream). Errors as
// HcMixF32.
cudaError_t HcExpandF32(const HcExpandArgs& args, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_V4_HYPER_CONNECTION_H_
