// 1 / rms of a row from each thread's partial sum of squares, for kernels that normalise one
// row per block (AddRmsNormF32, the staged GEMV's norm prologue, the router's folded norm): the
// same reduction order everywhere, so their normed rows agree bit for bit. Include only from .cu
// files.
#pragma once

#include <cstdint>

namespace deepinfer {
namespace kernels {

// Every thread of the block (kWarps warps) calls it with its partial sum ss: warp butterflies,
// then the warps' sums in order by thread 0, published through shared memory. 1/sqrt rather
// than rsqrtf: rsqrtf is approximate (2 ulp), the CPU reference is exact.
template <int kWarps>
__device__ __forceinline__ float BlockInvRms(float ss, int64_t dim, float eps) {
  __shared__ float partial[kWarps];
  __shared__ float inv_rms;
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kWarps; ++w) total += partial[w];
    inv_rms = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
  }
  __syncthreads();
  return inv_rms;
}

}  // namespace kernels
}  // namespace deepinfer
