// The router logits of a tile of tokens x experts, handed over to the last block of the token
// tile, which then routes the tile's tokens: the first part of the one-launch routers
// RouteTokensF32 (noaux_tc_router_fused.cu: DeepSeek-V3's noaux_tc routing) and
// V4RouteFromHiddenF32 (kernels/v4/v4_router.cu: DeepSeek-V4's routing). Include only from those.
//
// Grid: (expert tiles, token tiles); a block of kThreads threads computes a tile of TM tokens x
// TE experts over the whole hidden size: thread i takes the float4 columns i, i + kThreads, ...
// of the tile's weight rows and hidden rows, so one weight load serves TM tokens and one hidden
// load TE experts; warp shuffles and then shared memory (in warp order) add the partial sums.
// The sum order of a logit is the same for every tile and token count. The router weight is
// never written during a step, so each thread's first kPrefetchRounds float4 of every weight
// row it reads are loaded before the programmatic-dependent-launch wait (PrefetchWeights, run
// under the kernel before it).
//
// The blocks of a token tile hand their logits over through global memory (router_logits): each
// counts itself done on the tile's counter after a fence, and the last one to arrive resets the
// counter for the next call and routes the tile. No block waits for another, so the grid may be
// of any size.
#ifndef DEEPINFER_KERNELS_MOE_ROUTER_LOGITS_TILE_CUH_
#define DEEPINFER_KERNELS_MOE_ROUTER_LOGITS_TILE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/streaming_load.cuh"

namespace deepinfer {
namespace kernels {
namespace router_logits {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPrefetchRounds = 2;  // float4 per weight row and thread loaded before the wait

struct Tile {
  int32_t num_tokens = 0, num_experts = 0;
  int32_t hidden_size = 0;               // a multiple of 4
  const float* hidden = nullptr;         // [tokens, hidden_size], 16-byte aligned
  const float* router_weight = nullptr;  // [experts, hidden_size], 16-byte aligned
  float* router_logits = nullptr;        // [tokens, experts], written
  uint32_t* tile_counters = nullptr;     // one per token tile, zero before and after each call
};

template <int TE>
struct WeightRounds {
  float4 w[kPrefetchRounds][TE];
};

template <int TE>
__device__ WeightRounds<TE> PrefetchWeights(const Tile& p) {
  WeightRounds<TE> first;
  const int64_t h4 = p.hidden_size / 4;
  const int e0 = blockIdx.x * TE;
  const float4* w = reinterpret_cast<const float4*>(p.router_weight);
#pragma unroll
  for (int r = 0; r < kPrefetchRounds; ++r) {
    const int64_t c = threadIdx.x + r * kThreads;
#pragma unroll
    for (int e = 0; e < TE; ++e) {
      first.w[r][e] = e0 + e < p.num_experts && c < h4 ? LoadStreamingFloat4(w + (e0 + e) * h4 + c)
                                                       : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  return first;
}

// acc[m][e] += hidden row t0 + m . weight row e0 + e over the float4 column c.
template <int TM, int TE>
__device__ __forceinline__ void AccumulateColumn(const float4* hidden, int64_t h4, int t0,
                                                 int tokens, int64_t c, const float4 (&w)[TE],
                                                 float (&acc)[TM][TE]) {
#pragma unroll
  for (int m = 0; m < TM; ++m) {
    if (t0 + m >= tokens) continue;
    const float4 h = __ldg(hidden + (t0 + m) * h4 + c);
#pragma unroll
    for (int e = 0; e < TE; ++e) {
      float a = acc[m][e];
      a = fmaf(h.x, w[e].x, a);
      a = fmaf(h.y, w[e].y, a);
      a = fmaf(h.z, w[e].z, a);
      a = fmaf(h.w, w[e].w, a);
      acc[m][e] = a;
    }
  }
}

// Writes this block's tile of logits and counts the block done. True in the token tile's last
// block (every thread of it), which has reset the counter and may then read the tile's tokens'
// logits of every expert from router_logits (with __ldcg: other blocks wrote them in this
// kernel).
template <int TM, int TE>
__device__ bool LogitsTileIsLast(const WeightRounds<TE>& first, const Tile& p) {
  __shared__ float partial[kWarps][TM * TE];
  __shared__ bool last_block;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int T = p.num_tokens, E = p.num_experts;
  const int64_t h4 = p.hidden_size / 4;
  const int e0 = blockIdx.x * TE, t0 = blockIdx.y * TM;
  const float4* hidden = reinterpret_cast<const float4*>(p.hidden);
  const float4* weight = reinterpret_cast<const float4*>(p.router_weight);

  float acc[TM][TE];
#pragma unroll
  for (int m = 0; m < TM; ++m) {
#pragma unroll
    for (int e = 0; e < TE; ++e) acc[m][e] = 0.0f;
  }
#pragma unroll
  for (int r = 0; r < kPrefetchRounds; ++r) {
    const int64_t c = threadIdx.x + r * kThreads;
    if (c < h4) AccumulateColumn<TM, TE>(hidden, h4, t0, T, c, first.w[r], acc);
  }
  for (int64_t c = threadIdx.x + kPrefetchRounds * kThreads; c < h4; c += kThreads) {
    float4 w[TE];
#pragma unroll
    for (int e = 0; e < TE; ++e) {
      w[e] = e0 + e < E ? LoadStreamingFloat4(weight + (e0 + e) * h4 + c)
                        : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    AccumulateColumn<TM, TE>(hidden, h4, t0, T, c, w, acc);
  }
#pragma unroll
  for (int m = 0; m < TM; ++m) {
#pragma unroll
    for (int e = 0; e < TE; ++e) {
      float v = acc[m][e];
#pragma unroll
      for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) partial[warp][m * TE + e] = v;
    }
  }
  __syncthreads();
  if (threadIdx.x < TM * TE) {
    const int m = threadIdx.x / TE, e = threadIdx.x % TE;
    if (t0 + m < T && e0 + e < E) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += partial[w][threadIdx.x];
      p.router_logits[static_cast<int64_t>(t0 + m) * E + e0 + e] = sum;
    }
    __threadfence();  // the logits before this block counts itself done
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned done = atomicAdd(p.tile_counters + blockIdx.y, 1u);
    last_block = done == gridDim.x - 1;
  }
  __syncthreads();
  if (!last_block) return false;
  __threadfence();  // the other blocks' logits after their counts
  if (threadIdx.x == 0) p.tile_counters[blockIdx.y] = 0;
  return true;
}

}  // namespace router_logits
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_ROUTER_LOGITS_TILE_CUH_
