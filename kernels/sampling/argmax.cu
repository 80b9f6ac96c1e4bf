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

// Pass 1 as in ArgmaxRowsKernel; pass 2 sums exp(l - max) in double over the same row.
__global__ void GreedySampleKernel(int64_t vocab, const float* logits, int32_t* token,
                                   float* logprob) {
  __shared__ float wv[kThreads / 32];
  __shared__ int32_t wi[kThreads / 32];
  __shared__ double ws[kThreads / 32];
  __shared__ float row_max;
  __shared__ int32_t row_arg;
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
    row_arg = bi == 0x7fffffff ? 0 : bi;
    row_max = bv;
  }
  __syncthreads();
  const double mx = row_max;
  double sum = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) sum += exp(static_cast<double>(l[i]) - mx);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if ((threadIdx.x & 31) == 0) ws[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < kThreads / 32; ++w) total += ws[w];
    token[blockIdx.x] = row_arg;
    logprob[blockIdx.x] = static_cast<float>(l[row_arg] - (mx + log(total)));
  }
}

}  // namespace

cudaError_t GreedySampleRowsF32(int64_t rows, int64_t vocab, const float* logits, int32_t* token,
                                float* logprob, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0 || vocab > 0x7fffffff || rows > 0x7fffffff) return cudaErrorInvalidValue;
  GreedySampleKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(vocab, logits, token,
                                                                           logprob);
  return cudaGetLastError();
}

cudaError_t ArgmaxRowsF32(int64_t rows, int64_t vocab, const float* logits, int32_t* out,
                          cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0 || vocab > 0x7fffffff || rows > 0x7fffffff) return cudaErrorInvalidValue;
  ArgmaxRowsKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(vocab, logits, out);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace deepinfer
