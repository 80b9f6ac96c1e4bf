// GEMM for a few activation rows against a bf16 weight matrix (decode at batch 1..4): the
// weights are streamed once, 16 bytes per lane, and every loaded weight row is used for all m
// activation rows. cuBLAS's choices for M = 1 launch more kernels and read the weights below
// HBM bandwidth; this kernel is the CudaBackend's Gemm / BatchedGemm for small m.
#ifndef DEEPINFER_KERNELS_GEMM_SMALL_M_GEMM_H_
#define DEEPINFER_KERNELS_GEMM_SMALL_M_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// The largest m SmallMGemmBf16 takes.
inline constexpr int64_t kSmallMGemmMaxRows = 4;

// How the weight rows are spread over the GPU.
enum class SmallMGemmAlgo {
  kAuto,  // SmallMGemmAutoIsSplitK: where kSplitK measured faster on the H200
  // One group of up to 32 lanes per weight row, looping over k: few blocks for short n, and a
  // warp's loads for long k come in several dependent rounds.
  kRowPerGroup,
  // A weight row's k split over 1, 2, 4 or 8 warps of one block (chosen so a warp has at most
  // 4 KiB of the row, all its 16-byte loads issued before the first is used); the warps' partial
  // sums are added in warp order through shared memory, so the result is deterministic.
  kSplitK,
};

// c_b[i, j] (+)= sum_p bf16(a_b[i, p]) * w_b[j, p] for i < m, j < n, p < k and every product b
// of `batch` (a_b = a + b*stride_a, w_b = w + b*stride_w, c_b = c + b*stride_c, in elements).
// a is fp32 (each value rounded to bf16 to nearest even as it is read, exactly as
// RoundF32ToBf16) or, with a_bf16, bf16 bits; w is bf16 bits; c is fp32, accumulated in fp32.
// So every product is exact and only the order of the sums differs from cuBLAS.
struct SmallMGemmParams {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  bool a_bf16 = false;
  int64_t lda = 0;
  const uint16_t* w = nullptr;
  int64_t ldw = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_w = 0, stride_c = 0;
  SmallMGemmAlgo algo = SmallMGemmAlgo::kAuto;  // a performance choice only
};

// Whether SmallMGemmBf16 takes these arguments: 1 <= m <= kSmallMGemmMaxRows, k a multiple of
// 8, w, a and their row and batch strides 16-byte aligned, and m rows of a small enough to be
// re-read from L1 (m * k * sizeof(a value) <= 96 KiB).
bool SmallMGemmSupports(const SmallMGemmParams& p);

// kAuto's choice, from small_m_gemm_bench on the H200 (back-to-back launches in a CUDA graph,
// docs/kernels.md): kSplitK from k = 1024 when the row-per-group grid is short (n * batch <=
// 1024 weight rows: under one block per SM), and at m = 1 also for n * batch <= 2048, for
// k > 2048 (several dependent rounds of loads per row) and for very wide matrices (n * batch >=
// 65536, the LM head); for 512 <= k < 1024 with n * batch <= 2048 (W_uv: 1.74 vs 2.13 us at
// m = 1, 2.96 vs 3.97 at m = 4); kRowPerGroup otherwise (at m = 1 for n = 3072 .. 22528 with
// k = 2048 it was as fast or faster, and at m = 4 for every n above 1024; W_uk, k = 128).
bool SmallMGemmAutoIsSplitK(const SmallMGemmParams& p);

// Returns cudaErrorInvalidValue (launching nothing) where SmallMGemmSupports is false.
cudaError_t SmallMGemmBf16(const SmallMGemmParams& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_SMALL_M_GEMM_H_
