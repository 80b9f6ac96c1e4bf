// RMSNorm kernel (fp32): the GPU counterpart of Backend::RmsNorm. C-style API so that any
// backend or test can call it with device pointers and a stream.
#ifndef DEEPINFER_KERNELS_NORM_RMS_NORM_H_
#define DEEPINFER_KERNELS_NORM_RMS_NORM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight, statistics in fp32. Row strides
// ldx / ldout are in elements; out may alias x (each row is read fully before it is written).
// Returns the launch error, if any.
cudaError_t RmsNormF32(int64_t rows, int64_t dim, const float* x, int64_t ldx, const float* weight,
                       float eps, float* out, int64_t ldout, cudaStream_t stream);

// The residual add and RmsNormF32 in one pass over contiguous rows of width dim: when y is not
// null, x += y; then out = RmsNormF32(x) and out_bf16 = out rounded to bf16 (nearest even, as
// RoundF32ToBf16), each only when not null. Bit for bit AddF32 + RmsNormF32 (+ RoundF32ToBf16).
// out / out_bf16 must not alias x or y. Rows with dim % 4 == 0 up to 7168 wide and 16-byte
// aligned pointers (out_bf16: 8) take a 16-byte-access kernel with the same results bit for bit
// (the prefill's 8K-32K rows).
cudaError_t AddRmsNormF32(int64_t rows, int64_t dim, float* x, const float* y, const float* weight,
                          float eps, float* out, uint16_t* out_bf16, cudaStream_t stream);

// The normed rows of AddRmsNormFp8 quantised for a W8A8 GEMM, in kernels::Fp8QuantizeRows' plain
// layout (kernels/gemm/fp8_quantize.h): q [m_pad, ldq] e4m3 bytes, scales [ceil(dim / 128)]
// [m_pad] fp32 (block kb of row i at kb * m_pad + i), rows from `rows` to m_pad - 1 zeros with
// scale 1. from_bf16: the values quantised are the normed rows rounded to bf16 (out_bf16's),
// else the fp32 normed rows (out's).
struct RmsNormFp8Out {
  uint8_t* q = nullptr;
  int64_t ldq = 0;
  float* scales = nullptr;
  int64_t m_pad = 0;
  bool from_bf16 = false;
};

// Whether AddRmsNormFp8 takes these rows: dim % 16 == 0 and dim <= 7168, x, y, weight and out
// 16-byte aligned, out_bf16 8-byte aligned (null pointers pass), q 16-byte aligned with
// ldq >= dim and ldq % 16 == 0, scales set, m_pad >= rows.
bool AddRmsNormFp8Supports(int64_t rows, int64_t dim, const float* x, const float* y,
                           const float* weight, const float* out, const uint16_t* out_bf16,
                           const RmsNormFp8Out& fp8);

// AddRmsNormF32 (x += y, out, out_bf16: each optional as there, the same bits) with the normed
// rows also quantised into fp8 in the same pass: q and scales bit for bit what
// kernels::Fp8QuantizeRows writes for AddRmsNormF32's out_bf16 (from_bf16) or out rows. One
// launch; cudaErrorInvalidValue (nothing launched) where AddRmsNormFp8Supports is false.
cudaError_t AddRmsNormFp8(int64_t rows, int64_t dim, float* x, const float* y, const float* weight,
                          float eps, float* out, uint16_t* out_bf16, const RmsNormFp8Out& fp8,
                          cudaStream_t stream);

// AddRmsNormF32 without y over rows of x at stride ldx >= dim (a column slice of a wider matrix,
// only read), out and out_bf16 contiguous [rows, dim]: bit for bit AddRmsNormF32 on a
// contiguous copy of the rows (the 16-byte-access kernel also needs ldx % 4 == 0).
cudaError_t StridedRmsNormF32(int64_t rows, int64_t dim, const float* x, int64_t ldx,
                              const float* weight, float eps, float* out, uint16_t* out_bf16,
                              cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_NORM_RMS_NORM_H_
