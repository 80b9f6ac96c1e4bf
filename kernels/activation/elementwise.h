// Elementwise fp32 kernels of the forward pass: residual add and SwiGLU's SiLU-and-multiply
// (the GPU counterparts of Backend::Add and Backend::SiluMul), and the fp32 -> bf16 rounding
// of a bf16 GEMM's activation operand.
#ifndef DEEPINFER_KERNELS_ACTIVATION_ELEMENTWISE_H_
#define DEEPINFER_KERNELS_ACTIVATION_ELEMENTWISE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// out[i] = a[i] + b[i] for i < n; out may alias a or b.
cudaError_t AddF32(int64_t n, const float* a, const float* b, float* out, cudaStream_t stream);

// out[r, i] = silu(x[r, i]) * x[r, inter + i]; rows of x are [gate | up], width 2*inter.
cudaError_t SiluMulF32(int64_t rows, int64_t inter, const float* x, float* out,
                       cudaStream_t stream);

// SiluMulF32 with the result rounded to bf16 (nearest even) in the same pass: the activation
// operand of a bf16 down-projection GEMM, without an fp32 intermediate in memory.
cudaError_t SiluMulF32ToBf16(int64_t rows, int64_t inter, const float* x, uint16_t* out,
                             cudaStream_t stream);

// out[i] = bf16 bits of x[i], rounded to nearest even (as worker/backend/bf16.h on the host).
cudaError_t RoundF32ToBf16(int64_t n, const float* x, uint16_t* out, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_ACTIVATION_ELEMENTWISE_H_
