// DeepSeek-V4's hyper-connections on the GPU (the V4Ops HcMix, HcHead and HcExpand of
// worker/backend/v4_ops.h, whose comments define the arithmetic): each op is one launch that
// reads the residual streams once, with no workspace, host synchronisation or allocation (so
// each can be recorded in a CUDA graph); HcMixFromStreamsF32 (two launches, a workspace) is the
// exception. fp32 throughout; the sums run in the CPU reference's order with the same
// roundings (no fused multiply-adds), so the collapse and the expand give the CPU's bits and the
// mixing weights differ only through expf.
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
// HcMixF32 with the norm and the mixing GEMM before it: args.mixes is not read but computed
// from the streams, mixes = RmsNorm_unweighted(flatten(streams), args.norm_eps) · args.fnᵀ, in
// two launches. The first computes the rows' dot products with fn and their sums of squares
// into `workspace` (HcMixFromStreamsWorkspaceFloats floats). Below 2048 rows, and from there
// with HcMixGemm::kFp32, in one order for every row count (hc_mix_partials.cuh: fmaf chains over
// 512-float slices of the flattened row, 128 where 512 does not divide it, added in groups of 4
// where 4 divide their count): a block per slice (up to 8 rows also per fifth of the 25 sums, a
// chain a thread, fn read before the PDL wait; from 9 rows 16 rows a block, 2 x 2 chains a
// thread), from 2048 rows a register-tiled fp32 GEMM. From 2048 rows with HcMixGemm::kAuto
// (where the device runs sm_80 code) or kTensorCores, a 3xTF32 tensor-core GEMM
// (hc_mix_tensor_cores.cuh: the dot products to about 22 significant bits a product, summed in
// an order of its own, so a row's bits there differ from its bits below 2048 rows). The second
// adds a row's groups in order, scales the dot products by 1 / rms, and runs two kinds of
// blocks: warps that compute post and the Sinkhorn-projected comb, a row a warp, and a block per
// row that loads the row's streams once, computes pre and collapses the row from registers: the
// normed rows are never written, and a row's results do not depend on the batch around it
// (among calls that take the same kind of partials kernel). With args.normed and/or
// args.normed_bf16, the row blocks also write the collapsed row's RmsNorm (args.out_norm_weight,
// args.out_norm_eps), bit for bit RmsNormF32's (and AddRmsNormF32's out_bf16), and
// args.collapsed may be null. Takes 4 streams, hidden % 32 == 0 and hidden <= 8192, 16-byte
// aligned streams, fn, collapsed, normed and out_norm_weight, 8-byte aligned normed_bf16
// (HcMixFromStreamsSupported); cudaErrorInvalidValue for anything else, cudaErrorNotSupported
// for HcMixGemm::kTensorCores at 2048 rows or more where the device does not run sm_80 code.
enum class HcMixGemm {
  kAuto,         // tensor cores where the device runs sm_80 code, else fp32
  kTensorCores,  // 3xTF32 mma.sync
  kFp32,         // the register-tiled fp32 GEMM
};
bool HcMixFromStreamsSupported(const HcMixArgs& args);
int64_t HcMixFromStreamsWorkspaceFloats(int64_t rows, int64_t hc, int64_t hidden);
cudaError_t HcMixFromStreamsF32(const HcMixArgs& args, float* workspace, cudaStream_t stream,
                                HcMixGemm gemm = HcMixGemm::kAuto);
// The head's collapse (HcMix's collapse with its own weights). Errors as HcMixF32.
cudaError_t HcHeadF32(const HcHeadArgs& args, cudaStream_t stream);
// streams_out = post * block_out + combᵀ · streams_in, one pass over streams_in (each thread
// loads its columns of every stream once and writes them to every output stream). Errors as
// HcMixF32.
cudaError_t HcExpandF32(const HcExpandArgs& args, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_V4_HYPER_CONNECTION_H_
