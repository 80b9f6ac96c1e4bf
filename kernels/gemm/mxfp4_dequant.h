// MXFP4 matrices (mxfp4_mma_gemm.h's layout: e2m1 nibbles, one UE8M0 scale per 32 values along k)
// widened to bf16 [n, k] row-major, for GEMMs that take bf16 weights (the routed experts' cuBLAS
// path at prefill sizes, CudaBackend::RoutedExperts).
//
// Element (j, p) becomes e2m1(j, p) * 2^(scale - 127) rounded to bf16, which is exact wherever
// bf16 can hold the product: an e2m1 value has at most two significant bits, and bf16 has fp32's
// exponent range with 7 mantissa bits, so every product from 0.5 * 2^-127 (scale byte 0: the bf16
// subnormal 2^-128) up to 1.5 * 2^127 is a bf16 value, subnormals included. Where it cannot:
//  * the product is 2^128 or more (scale byte 254 with |e2m1| >= 2, 253 with |e2m1| >= 4): +-inf,
//    what round-to-nearest gives for it (bf16's largest finite value is (2 - 2^-7) * 2^127);
//  * scale byte 0xFF (NaN in the spec, never stored by our loader): a quiet NaN for each of the
//    block's elements, zeros included.
// Zero keeps its sign (e2m1 code 8 is -0).
#ifndef DEEPINFER_KERNELS_GEMM_MXFP4_DEQUANT_H_
#define DEEPINFER_KERNELS_GEMM_MXFP4_DEQUANT_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// Matrices first .. first + num_matrices - 1 of the pointer tables, each [n, k], written one after
// the other to out: matrix first + i at out + i * n * k.
struct Mxfp4DequantParams {
  int32_t first = 0;
  int32_t num_matrices = 0;
  const uint8_t* const* weights = nullptr;  // device pointers, each [n, k / 2] bytes, 16-aligned
  const uint8_t* const* scales = nullptr;   // device pointers, each [n, scale_ld] UE8M0 bytes
  int64_t n = 0, k = 0;                     // k a multiple of 32
  int64_t scale_ld = 0;                     // >= k / 32
  uint16_t* out = nullptr;                  // device bf16 [num_matrices, n, k], 16-aligned
};

// cudaErrorInvalidValue (nothing launched) for sizes out of range (num_matrices up to 65535),
// missing or unaligned pointers; otherwise the launch's status. No host synchronisation.
cudaError_t Mxfp4DequantToBf16(const Mxfp4DequantParams& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_MXFP4_DEQUANT_H_
