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

// The same 1 / rms for a row held by one warp (lane l holding elements l + 32 s in v, padding 0):
// slot s belongs to the 256-thread block's thread l + 32 (s % 8), so the warp adds each virtual
// warp w's slots w, w + 8, ... in order, reduces them by the same butterfly and adds the 8 sums
// in warp order from 0, as thread 0 above does: bit for bit BlockInvRms<8> on the same row.
template <int kPerLane>
__device__ __forceinline__ float WarpRowInvRms(const float (&v)[kPerLane], int64_t dim,
                                               float eps) {
  constexpr int kVirtualWarps = 8;
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kVirtualWarps; ++w) {
    float ss = 0.0f;
#pragma unroll
    for (int s = w; s < kPerLane; s += kVirtualWarps) ss += v[s] * v[s];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    total += ss;
  }
  return 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
}

}  // namespace kernels
}  // namespace deepinfer
