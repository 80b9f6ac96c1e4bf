// Internal to fp8_block_gemm: Fp8SmallMGemm's pipelined 1- and 2-row GEMV
// (Fp8GemvForm::kPipelined1 / kPipelined2; see fp8_block_gemm.h).
#ifndef DEEPINFER_KERNELS_GEMM_FP8_BLOCK_GEMM_VEC_H_
#define DEEPINFER_KERNELS_GEMM_FP8_BLOCK_GEMM_VEC_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/gemm/fp8_block_gemm.h"

namespace deepinfer {
namespace kernels {

// c rows row0 .. row0 + rows - 1 (rows 1 or 2) of Fp8SmallMGemm(p) with chunks_per_batch (1 or
// 2) 16-byte chunks of each weight row a lane and batch. The caller has checked p
// (Fp8SmallMGemmSupports) and its vector-path alignment (k a multiple of 16, 16-byte aligned
// weight rows and activation rows).
cudaError_t Fp8PipelinedGemv(const Fp8SmallMGemmParams& p, int64_t row0, int rows,
                             int chunks_per_batch, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_FP8_BLOCK_GEMM_VEC_H_
