// Argmax: one block per row; each thread keeps its best (value, index), then a shuffle and a
// shared-memory reduction combine them with "larger value, else lower index".
#include <math.h>

#include "kernels/sampling/argmax.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ void Better(float v, int32_t i, float* bv, int32_t* bi) {
  if (v > *bv || (v == *bv && i < *bi)) {
    *bv = v;
    *bi = i;
  }
}

__global__ void ArgmaxRowsKernel(int64_t vocab, const float* logits, int32_t* out) {
  __shared__ float wv[kThreads / 32];
  __shared__ int32_t wi[kThreads / 32];
  const float* l = logits + blockIdx.x * vocab;
  float bv = -INFINITY;
  int32_t bi = 0x7fffffff;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads)
    Better(l[i], static_cast<int32_t>(i), &bv, &bi);
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, bv, o);
    const int32_t i = __shfl_xor_sync(0xffffffffu, bi, o);
    Better(v, i, &bv, &bi);
  }
  if ((threadIdx.x & 31) == 0) {
    wv[threadIdx.x / 32] = bv;
    wi[threadIdx.x / 32] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) Better(wv[w], wi[w], &bv, &bi);
    // A row of all -inf (or NaN) has no strict maximum: report index 0 like std::max_element.
    out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
  }
}

}  // namespace

cudaError_t ArgmaxRowsF32(int64_t rows, int64_t vocab, const float* logits, int32_t* out,
                          cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0 || vocab > 0x7fffffff || rows > 0x7fffffff) return cudaErrorInvalidValue;
  ArgmaxRowsKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(vocab, logits, out);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace deepinfer
