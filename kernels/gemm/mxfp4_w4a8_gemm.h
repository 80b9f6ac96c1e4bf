// Grouped GEMM against MXFP4 weights (mxfp4_mma_gemm.h's layout) with e4m3 activations on FP8
// tensor cores (mma.sync m16n8k32 e4m3 x e4m3 -> fp32, sm_89+): W4A8. An e2m1 nibble's bits
// (s, e1 e0 m) placed as the e4m3 byte (s << 7) | (e1 e0 m << 2) are the e2m1 value times 2^-6
// exactly (normal and subnormal codes alike), so a 32-bit word of 8 e2m1 values becomes two words
// of e4m3 in a few masks and shifts. One MMA spans one 32-value scale block: its fp32 sum is
// multiplied by the activation row's block scale times 2^6, then added times the weight row's
// 2^(scale - 127) into the running fp32 sum (one rounding each). The products inside the MMA are
// exact; the activations carry e4m3's rounding (Fp8QuantizeRows' 1 x 128 scheme), so the result
// is the W4A16 product of mxfp4_mma_gemm.h to within that rounding, not to fp32 summation.
#ifndef DEEPINFER_KERNELS_GEMM_MXFP4_W4A8_GEMM_H_
#define DEEPINFER_KERNELS_GEMM_MXFP4_W4A8_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// Whether this process has the FP8 tensor-core kernel for the current device (sm_89+ code).
bool Mxfp4W4a8GemmAvailable();

// For group g: c[r, j] = sum_p (q[r, p] * s_r(p)) * w_g(j, p) for rows r in [offsets[g],
// offsets[g + 1]) (clamped to max_rows; rows past offsets[num_groups] untouched), q e4m3
// [max_rows, k] (row stride k bytes) with fp32 scales in Fp8QuantizeRows' grouped layout
// (fp8_quantize.h: row r of group g, 128-wide block kb at a_scales[offsets[g] * ceil(k / 128) +
// kb * count_g + r - offsets[g]]), w_g MXFP4 [n, k] (mxfp4_mma_gemm.h), c fp32 [max_rows, n].
// One block row per non-empty group; no host synchronisation (graph-capturable).
struct Mxfp4W4a8GroupedGemmParams {
  int32_t num_groups = 0;
  int32_t max_rows = 0;
  const int32_t* offsets = nullptr;         // device [num_groups + 1], non-decreasing, [0] = 0
  int64_t n = 0, k = 0;                     // k a multiple of 32
  const uint8_t* a = nullptr;               // e4m3, 8-byte aligned
  const float* a_scales = nullptr;          // Fp8QuantizeRows' grouped layout
  const uint8_t* const* weights = nullptr;  // device [num_groups] pointers, 4-byte aligned
  const uint8_t* const* scales = nullptr;   // device [num_groups] pointers
  int64_t scale_ld = 0;                     // >= k / 32
  float* c = nullptr;
  // Expected most rows in one group (0: unknown, max_rows): only the register tile (8, 16 or 32
  // rows a pass) depends on it; any group size stays correct.
  int32_t rows_per_group_hint = 0;
  // Warps splitting k (1, 2, 4 or 8); 0: chosen from the shapes. The sums depend on it (the
  // k-slices' partial sums are added in warp order), never on the rows or the hint.
  int32_t k_split = 0;
};

// Whether Mxfp4W4a8GroupedGemm takes these arguments and the device has the kernel.
bool Mxfp4W4a8GroupedGemmSupports(const Mxfp4W4a8GroupedGemmParams& p);
// cudaErrorInvalidValue (nothing launched) where Mxfp4W4a8GroupedGemmSupports is false.
cudaError_t Mxfp4W4a8GroupedGemm(const Mxfp4W4a8GroupedGemmParams& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_MXFP4_W4A8_GEMM_H_
