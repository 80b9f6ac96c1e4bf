// Grid-stride elementwise kernels; 64-bit indices because expert activations can exceed 2^31.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/activation/elementwise.h"
#include "kernels/common/launch.cuh"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;

unsigned GridFor(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
}

__device__ void AddBody(int64_t n, const float* a, const float* b, float* out) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    out[i] = a[i] + b[i];
  }
}

__device__ void SiluMulBody(int64_t rows, int64_t inter, const float* x, float* out) {
  const int64_t n = rows * inter;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t r = i / inter, c = i % inter;
    const float g = x[r * 2 * inter + c];
    const float u = x[r * 2 * inter + inter + c];
    // expf (not __expf): the fast intrinsic is off by several ulp for large |g|.
    out[i] = g / (1.0f + expf(-g)) * u;
  }
}

__device__ void SiluMulToBf16Body(int64_t rows, int64_t inter, const float* x, uint16_t* out) {
  const int64_t n = rows * inter;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t r = i / inter, c = i % inter;
    const float g = x[r * 2 * inter + c];
    const float u = x[r * 2 * inter + inter + c];
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(g / (1.0f + expf(-g)) * u));
  }
}

__device__ void RoundToBf16Body(int64_t n, const float* x, uint16_t* out) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
  }
}

}  // namespace

cudaError_t RoundF32ToBf16(int64_t n, const float* x, uint16_t* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return LaunchAfterPrecedingGrids<RoundToBf16Body, kThreads>(GridFor(n), 0, stream, n, x, out);
}

cudaError_t AddF32(int64_t n, const float* a, const float* b, float* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return LaunchAfterPrecedingGrids<AddBody, kThreads>(GridFor(n), 0, stream, n, a, b, out);
}

cudaError_t SiluMulF32(int64_t rows, int64_t inter, const float* x, float* out,
                       cudaStream_t stream) {
  if (rows <= 0 || inter <= 0) return cudaSuccess;
  return LaunchAfterPrecedingGrids<SiluMulBody, kThreads>(GridFor(rows * inter), 0, stream, rows,
                                                          inter, x, out);
}

cudaError_t SiluMulF32ToBf16(int64_t rows, int64_t inter, const float* x, uint16_t* out,
                             cudaStream_t stream) {
  if (rows <= 0 || inter <= 0) return cudaSuccess;
  return LaunchAfterPrecedingGrids<SiluMulToBf16Body, kThreads>(GridFor(rows * inter), 0, stream,
                                                                rows, inter, x, out);
}

}  // namespace kernels
}  // namespace deepinfer
