// fp8_gemm_bench --swap-pdl: kernels::Fp8WgmmaSwapGroupedGemm behind the kernel that makes its
// inputs, with programmatic dependent launch and without: see fp8_swap_pdl_bench.cc.
#ifndef DEEPINFER_WORKER_BACKEND_CUDA_FP8_SWAP_PDL_BENCH_H_
#define DEEPINFER_WORKER_BACKEND_CUDA_FP8_SWAP_PDL_BENCH_H_

#include <cstdint>
#include <vector>

#include "kernels/testing/gemm_bench_shapes.h"

namespace deepinfer {

// A routed MoE layer and its shared MLP run as `shared_parts` more groups of inter rows each
// (CudaBackend's shared groups: every token in each).
struct SwapPdlShape {
  bench::MoeShape moe;
  int32_t shared_parts = 0;
};

// Prints one line per (shape, gate_up / down, token count); exits with status 1 on a CUDA error
// and prints nothing for a device the swap kernel does not run on.
void RunSwapPdlBench(const std::vector<SwapPdlShape>& shapes, const std::vector<int32_t>& tokens);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_CUDA_FP8_SWAP_PDL_BENCH_H_
