// SwiGLU's SiLU-and-multiply between the two bf16-output expert GEMMs of the MoE paths
// (kernels/moe/expert_gemm_cublas.h, expert_gemm_planned.h): gate_up rows in bf16 in, the down
// GEMM's bf16 operand out. The fp32-in variants (SiluMulF32, SiluMulF32ToBf16) are in
// kernels/activation/elementwise.h.
#ifndef DEEPINFER_KERNELS_MOE_EXPERT_ACTIVATION_H_
#define DEEPINFER_KERNELS_MOE_EXPERT_ACTIVATION_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// out[r, i] = bf16(silu(g) * u) with g = x[r, i], u = x[r, inter + i] widened exactly to fp32,
// silu(g) = g / (1 + expf(-g)) in fp32 (as SiluMulF32ToBf16), rounded to nearest even; rows of x
// are [gate | up], width 2 * inter, all values bf16 bits. Device pointers; one launch on
// `stream` (8 values per thread when inter % 8 == 0 and both pointers are 16-byte aligned).
// cudaErrorInvalidValue for negative sizes.
// With `device_rows` (a device int32), only the first min(rows, *device_rows) rows are computed,
// the rest left as they are: a launch sized for a capacity (a CUDA graph) whose rows in use are
// known on the device only (the decode MoE's padded expert layout, kernels/moe/expert_gemm_plan.h).
// limit > 0: DeepSeek-V4's clamped SwiGLU, g = min(g, limit) and u = clamp(u, -limit, limit)
// before the product (V4Ops::SwiGluClamped); 0: none.
cudaError_t SiluMulBf16(int64_t rows, int64_t inter, const uint16_t* x, uint16_t* out,
                        cudaStream_t stream, const int32_t* device_rows = nullptr,
                        float limit = 0.0f);

// SiluMulBf16 over listed rows only: for i < listed with row_of[i] >= 0 (device int32s),
// out[row_of[i], :] from x[row_of[i], :] as above; every other row left as it is. The decode
// MoE's padded expert layout passes MoePermuteF32's choice_row (tokens x top_k entries, each
// real row once), so the padding rows of its chunks cost nothing. Rows listed twice are written
// twice with the same values. cudaErrorInvalidValue for negative sizes or a null row_of with
// listed > 0.
// limit: as SiluMulBf16's.
cudaError_t SiluMulBf16ListedRows(int64_t listed, const int32_t* row_of, int64_t inter,
                                  const uint16_t* x, uint16_t* out, cudaStream_t stream,
                                  float limit = 0.0f);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_EXPERT_ACTIVATION_H_
