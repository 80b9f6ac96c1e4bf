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

// AddRmsNormF32 without y over rows of x at stride ldx >= dim (a column slice of a wider matrix,
// only read), out and out_bf16 contiguous [rows, dim]: bit for bit AddRmsNormF32 on a
// contiguous copy of the rows (the 16-byte-access kernel also needs ldx % 4 == 0).
cudaError_t StridedRmsNormF32(int64_t rows, int64_t dim, const float* x, int64_t ldx,
                              const float* weight, float eps, float* out, uint16_t* out_bf16,
                              cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_NORM_RMS_NORM_H_
