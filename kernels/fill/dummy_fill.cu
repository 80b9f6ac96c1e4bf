// A grid-stride loop, one element per thread and step: Philox (10 rounds) per value, then one
// 4- or 2-byte store. Memory-bound only for constants; ~15 G values of a Moonlight-sized model
// take well under a second.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/fill/dummy_fill.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ T Convert(float v);
template <>
__device__ __forceinline__ float Convert<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ uint16_t Convert<uint16_t>(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

template <typename T>
__global__ void __launch_bounds__(kThreads) FillDummyKernel(DummyFill fill, int64_t n, T* out) {
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n; i += stride) {
    out[i] = Convert<T>(DummyFillValue(fill, i));
  }
}

template <typename T>
cudaError_t Launch(const DummyFill& fill, int64_t n, T* out, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{1} << 16);
  FillDummyKernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(fill, n, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t FillDummyF32(const DummyFill& fill, int64_t n, float* out, cudaStream_t stream) {
  return Launch(fill, n, out, stream);
}

cudaError_t FillDummyBf16(const DummyFill& fill, int64_t n, uint16_t* out, cudaStream_t stream) {
  return Launch(fill, n, out, stream);
}

}  // namespace kernels
}  // namespace deepinfer
