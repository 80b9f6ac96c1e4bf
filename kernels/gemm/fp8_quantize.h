// Activation rows quantised to FP8 for the W8A8 GEMMs (cuBLASLt's block-scaled FP8,
// worker/backend/cuda/cublaslt_fp8_gemm.h): each row's 128-wide k blocks become e4m3 values with
// one fp32 scale per block, s = max(amax / 448, FLT_MIN) and q = e4m3(x / s) (nearest even,
// saturating at 448), amax the block's largest |x|: DeepSeek-V3's activation scheme (1 x 128
// groups, as DeepGEMM and HF transformers' FP8 path quantise). q * s is within 2^-4 relative of
// x (e4m3 keeps 4 significant bits) for |x| >= 2^-6 s, and within 2^-10 s below.
#ifndef DEEPINFER_KERNELS_GEMM_FP8_QUANTIZE_H_
#define DEEPINFER_KERNELS_GEMM_FP8_QUANTIZE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// Rows i < m of a ([m, k], row stride lda; fp32, or bf16 bits with a_bf16) into q ([m_pad, ldq]
// e4m3 bytes) and scales ([ceil(k / 128)][m_pad] fp32: block kb of row i at kb * m_pad + i, rows
// contiguous, cuBLASLt's VEC128_32F layout). Rows m .. m_pad - 1 get zeros and scale 1 (padding
// to the GEMM's row multiple). k must be a multiple of 16, lda and ldq multiples of 16 bytes'
// worth of elements with 16-byte aligned a and q (cudaErrorInvalidValue otherwise, nothing
// launched).
//
// Grouped rows (the routed experts' permuted rows, one GEMM per expert): with group_offsets
// (device [num_groups + 1], non-decreasing, [0] = 0, at most m), row i of group g (offsets[g] <=
// i < offsets[g + 1]) has its block kb's scale at offsets[g] * blocks + kb * count_g +
// (i - offsets[g]), count_g = offsets[g + 1] - offsets[g]: each group's scales packed in the
// layout above for its own rows, so a GEMM over the group reads them at scales +
// offsets[g] * blocks. Rows from offsets[num_groups] on are left untouched; m_pad is not used.
struct Fp8QuantizeParams {
  int64_t m = 0, k = 0;
  const void* a = nullptr;
  bool a_bf16 = false;
  // fp32 rows (a_bf16 false) rounded to bf16 (nearest even) before they are quantised: the
  // values a bf16 copy of the rows (kernels/moe/moe_permute.h's bf16 gather) would hold.
  bool round_bf16 = false;
  int64_t lda = 0;
  uint8_t* q = nullptr;
  int64_t ldq = 0;
  float* scales = nullptr;
  int64_t m_pad = 0;  // >= m
  const int32_t* group_offsets = nullptr;
  int32_t num_groups = 0;
  // SwiGLU's product quantised (the down GEMM's operand): a holds rows [gate | up], width 2 * k
  // (lda >= 2 * k), bf16 with a_bf16 or fp32 without, and the row quantised is x[i, p] =
  // bf16(silu(g) * u), g = a[i, p], u = a[i, k + p], rounded exactly as kernels::SiluMulBf16
  // (bf16 rows) and kernels::SiluMulF32ToBf16 (fp32 rows) round it. round_bf16 not allowed.
  bool silu_mul = false;
  // Rows scattered (the routed experts' permutation, kernels/moe/moe_permute.h's choice_row):
  // source row i < m of a is quantised once and written to rows dest_rows[i * dests_per_row + j]
  // of q (j < dests_per_row <= 32; -1: none), its scales in group_offsets' layout (required;
  // m_pad unused). Rows of q no source row maps to (a group's padding rows) are left untouched.
  const int32_t* dest_rows = nullptr;
  int32_t dests_per_row = 0;
};
// Launched with programmatic dependent launch (kernels/common/launch.cuh): every thread waits
// for the kernels before it first, so the launch overlaps the end of the previous kernel and a
// PDL kernel after it (the swap-AB expert GEMM) may launch while it runs.
cudaError_t Fp8QuantizeRows(const Fp8QuantizeParams& p, cudaStream_t stream);

// c[i, j] = d[i, j] (+ c[i, j] with accumulate, one fp32 addition), i < m, j < n: a GEMM's
// result written to scratch (its rows padded, or c's layout not one cuBLASLt takes) moved into
// place. cudaErrorInvalidValue for negative sizes or ldd < n, ldc < n.
cudaError_t AddRowsF32(int64_t m, int64_t n, const float* d, int64_t ldd, float* c, int64_t ldc,
                       bool accumulate, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_FP8_QUANTIZE_H_
