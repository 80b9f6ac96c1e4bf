// fp8_gemm_bench --variants: the FP8 and MXFP4 tensor-core kernels' tile-loop variants still in
// question (kernels::MmaTileOptions) side by side with bf16 at the decode row counts: see
// fp8_mma_variants_bench.cc.
#ifndef DEEPINFER_WORKER_BACKEND_CUDA_FP8_MMA_VARIANTS_BENCH_H_
#define DEEPINFER_WORKER_BACKEND_CUDA_FP8_MMA_VARIANTS_BENCH_H_

#include <vector>

#include "kernels/testing/gemm_bench_shapes.h"

namespace deepinfer {

// Prints one line per (dense shape, m in 1, 8, 16, 32, 64, 128) and per (expert shape, rows per
// expert in 1, 8, 16); exits with status 1 on a CUDA error.
void RunTileVariants(const std::vector<bench::GemmShape>& dense,
                     const std::vector<bench::MoeShape>& moe);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_CUDA_FP8_MMA_VARIANTS_BENCH_H_
