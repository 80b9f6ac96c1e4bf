// The split combine of the MLA decode kernels (FlashDecoding): the splits of a (token, head)
// wrote their unnormalised output and (max, sum) to the workspace; MlaCombineKernel (fewer than
// kWideCombineMinSplits splits) or MlaCombineWideKernel merges them into the output. Included
// only by mla_attention.cu.
#ifndef DEEPINFER_KERNELS_ATTENTION_MLA_SPLIT_COMBINE_CUH_
#define DEEPINFER_KERNELS_ATTENTION_MLA_SPLIT_COMBINE_CUH_

#include <math.h>

#include <cstdint>

#include "kernels/attention/mla_attention.h"

namespace deepinfer {
namespace kernels {
namespace mla {

// Warp 0 of a merge block: the weight w_s = exp(m_s - max m) of each split (ml: the splits'
// (m, l) pairs) into weight[], and sum_s w_s l_s into *denom.
__device__ __forceinline__ void SplitWeights(const float* ml, int num_splits, float* weight,
                                             float* denom) {
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < num_splits; s += 32) mx = fmaxf(mx, ml[2 * s]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.0f;
  for (int s = threadIdx.x; s < num_splits; s += 32) {
    // Empty splits (l = 0, m = -inf) get weight 0 without evaluating exp(-inf - -inf).
    const float w = ml[2 * s + 1] > 0.0f ? expf(ml[2 * s] - mx) : 0.0f;
    weight[s] = w;
    sum += w * ml[2 * s + 1];
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (threadIdx.x == 0) *denom = sum;
}

// One block per (token, head): out = sum_s w_s O_s / sum_s w_s l_s, w_s = exp(m_s - max m).
__global__ void MlaCombineKernel(const float* ws_out, const float* ws_ml, int num_splits,
                                 int latent, float* out) {
  __shared__ float weight[kMaxMlaSplits];
  __shared__ float denom;
  const int64_t th = blockIdx.x;
  const float* ml = ws_ml + th * num_splits * 2;
  if (threadIdx.x < 32) SplitWeights(ml, num_splits, weight, &denom);
  __syncthreads();
  const float* part = ws_out + th * num_splits * latent;
  for (int c = threadIdx.x; c < latent; c += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < num_splits; ++s) {
      if (weight[s] != 0.0f) acc = fmaf(weight[s], part[static_cast<int64_t>(s) * latent + c], acc);
    }
    out[th * latent + c] = acc / denom;
  }
}

// The same merge for many splits (kWideCombineMinSplits or more: few decode tokens): a block
// per (token x head, 32 columns), its 8 warps summing splits w, w + 8, ... of the lane's column.
// Every partial is loaded before the weights are needed, so those loads and the weights'
// overlap, and the 8 sums are added in warp order. MlaCombineKernel's block per (token x head)
// loads its splits one after another: at one decode token (16 blocks, 64 splits) that took
// 27.5 us of a 1 x 1024 call in a CUDA graph, this one 19 us (docs/kernels/attention.md). With few
// splits (2-4: many tokens) most of this kernel's loads would be predicated off; MlaCombineKernel
// serves those.
constexpr int kWideCombineMinSplits = 8;
constexpr int kWideCombineRows = 8;
constexpr int kWideCombineCols = 32;
constexpr int kWideCombinePerThread = kMaxMlaSplits / kWideCombineRows;

__global__ void __launch_bounds__(kWideCombineRows* kWideCombineCols)
    MlaCombineWideKernel(const float* ws_out, const float* ws_ml, int num_splits, int latent,
                         float* out) {
  __shared__ float weight[kMaxMlaSplits];
  __shared__ float denom;
  __shared__ float row_sum[kWideCombineRows][kWideCombineCols];
  const int64_t th = blockIdx.x;
  const int row = threadIdx.x / kWideCombineCols, lane = threadIdx.x % kWideCombineCols;
  const int col = blockIdx.y * kWideCombineCols + lane;
  // Loads regardless of the split's weight (an empty split's partial is never written, so it
  // may be anything); weight 0 discards it below.
  float x[kWideCombinePerThread];
  const float* part = ws_out + th * num_splits * latent + col;
#pragma unroll
  for (int i = 0; i < kWideCombinePerThread; ++i) {
    const int s = row + i * kWideCombineRows;
    x[i] = s < num_splits && col < latent ? part[static_cast<int64_t>(s) * latent] : 0.0f;
  }
  if (threadIdx.x < 32) SplitWeights(ws_ml + th * num_splits * 2, num_splits, weight, &denom);
  __syncthreads();
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < kWideCombinePerThread; ++i) {
    const int s = row + i * kWideCombineRows;
    if (s < num_splits && weight[s] != 0.0f) acc = fmaf(weight[s], x[i], acc);
  }
  row_sum[row][lane] = acc;
  __syncthreads();
  if (row == 0 && col < latent) {
    float total = 0.0f;
#pragma unroll
    for (int r = 0; r < kWideCombineRows; ++r) total += row_sum[r][lane];
    out[th * latent + col] = total / denom;
  }
}

}  // namespace mla
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_ATTENTION_MLA_SPLIT_COMBINE_CUH_
