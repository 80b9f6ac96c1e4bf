// RouteTokensF32: router logits, noaux_tc routing and expert counts in one launch.
//
// Replaces, per MoE layer of a decode step, cuBLAS's fp32 GEMV for the logits (two kernels at
// one token: dot_kernel + reduce_1Block_kernel), NoauxTcRouteF32 and AccumulateExpertCounts.
//
// Grid: (expert tiles, token tiles); a block of 256 threads computes a tile of TM tokens x TE
// experts over the whole hidden size: thread i takes the float4 columns i, i + 256, ... of the
// tile's weight rows and hidden rows, so one weight load serves TM tokens and one hidden load
// TE experts; warp shuffles and then shared memory (in warp order) add the partial sums. The
// router weight is never written during a step, so each thread's first two float4 of every
// weight row it reads are loaded before the programmatic-dependent-launch wait
// (kernels/common/launch.cuh), under the kernel before it (the norm that produces the rows).
// The tile by size is the fastest one measured (noaux_tc_router_bench, RouteTokensTile): at one
// token a block per expert row (64 blocks of 8 KB at the Moonlight shape); more tokens take
// more tokens and experts per block, but still hundreds of blocks.
//
// The blocks of a token tile hand their logits over through global memory (router_logits): each
// counts itself done on the tile's counter after a fence, and the last one to arrive routes the
// tile's tokens, one warp per token (noaux_tc_router_warp.cuh, NoauxTcRouteF32's code), adds
// the expert counts, and sets the counter back to zero for the next call. No block waits for
// another, so the grid may be of any size.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/launch.cuh"
#include "kernels/common/streaming_load.cuh"
#include "kernels/moe/noaux_tc_router.h"
#include "kernels/moe/noaux_tc_router_fused.h"
#include "kernels/moe/noaux_tc_router_warp.cuh"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPrefetchRounds = 2;  // float4 per weight row and thread loaded before the wait

template <int TE>
struct WeightRounds {
  float4 w[kPrefetchRounds][TE];
};

template <int TM, int TE>
__device__ WeightRounds<TE> PrefetchWeights(RouteTokensParams p) {
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

template <int TM, int TE>
__device__ void RouteTokensBody(const WeightRounds<TE>& first, RouteTokensParams p) {
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
      for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(router_internal::kFullWarp, v, o);
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
  if (!last_block) return;
  __threadfence();  // the other blocks' logits after their counts
  if (threadIdx.x == 0) p.tile_counters[blockIdx.y] = 0;
  const int t = t0 + warp;
  if (warp >= TM || t >= T) return;

  router_internal::RouterRule rule;
  rule.num_experts = E;
  rule.correction_bias = p.correction_bias;
  rule.num_groups = p.num_groups;
  rule.topk_groups = p.topk_groups;
  rule.top_k = p.top_k;
  rule.normalize = p.normalize;
  rule.scaling_factor = p.scaling_factor;
  router_internal::TokenOutput out;
  out.ids = p.topk_ids + static_cast<int64_t>(t) * p.top_k;
  out.weights = p.topk_weights + static_cast<int64_t>(t) * p.top_k;
  out.counts = reinterpret_cast<unsigned long long*>(p.expert_counts);
  out.first_pair = static_cast<int64_t>(t) * p.top_k;
  out.pair_limit = p.count_limit != nullptr ? *p.count_limit : int64_t{T} * p.top_k;
  const float* lg = p.router_logits + static_cast<int64_t>(t) * E;
  // L2 reads: other blocks wrote these during this kernel.
  const auto logit = [lg](int x) { return __ldcg(lg + x); };
  if (E <= 64) {
    router_internal::RouteTokenInWarp<2>(rule, logit, out);
  } else {
    router_internal::RouteTokenInWarp<kMaxFusedRouterExperts / 32>(rule, logit, out);
  }
}

template <int TM, int TE>
cudaError_t Launch(const RouteTokensParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.num_experts + TE - 1) / TE),
                  static_cast<unsigned>((p.num_tokens + TM - 1) / TM));
  return LaunchPrefetchThenAfterPrecedingGrids<PrefetchWeights<TM, TE>, RouteTokensBody<TM, TE>,
                                               kThreads>(grid, 0, stream, p);
}

bool ValidTile(int32_t tm, int32_t te) {
  if (tm == 8) return te == 1 || te == 2 || te == 4 || te == 8;
  return (tm == 1 || tm == 2 || tm == 4) && (te == 1 || te == 2);
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void RouteTokensTile(int32_t tokens, int32_t* tile_tokens, int32_t* tile_experts) {
  if (tokens <= 2) {
    *tile_tokens = std::max(tokens, 1);
    *tile_experts = 1;
  } else if (tokens <= 8) {
    *tile_tokens = 4;
    *tile_experts = 1;
  } else if (tokens <= 64) {
    *tile_tokens = 4;
    *tile_experts = 2;
  } else {
    *tile_tokens = 8;
    *tile_experts = 2;
  }
}

bool RouteTokensSupported(const RouteTokensParams& p) {
  if (p.num_tokens < 0 || p.num_tokens > kMaxFusedRouterTokens) return false;
  if (p.hidden_size <= 0 || p.hidden_size % 4 != 0) return false;
  if (p.router_weight == nullptr || p.router_logits == nullptr || p.tile_counters == nullptr ||
      p.topk_ids == nullptr || p.topk_weights == nullptr) {
    return false;
  }
  if (p.hidden == nullptr || !Aligned16(p.hidden)) return false;
  if (!Aligned16(p.router_weight)) return false;
  if (p.num_experts > kMaxFusedRouterExperts ||
      !NoauxTcRouteShapeSupported(p.num_experts, p.num_groups, p.topk_groups, p.top_k)) {
    return false;
  }
  return (p.tile_tokens == 0 && p.tile_experts == 0) || ValidTile(p.tile_tokens, p.tile_experts);
}

cudaError_t RouteTokensF32(const RouteTokensParams& params, cudaStream_t stream) {
  if (!RouteTokensSupported(params)) return cudaErrorInvalidValue;
  if (params.num_tokens == 0) return cudaSuccess;
  int32_t tm = params.tile_tokens, te = params.tile_experts;
  if (tm == 0) RouteTokensTile(params.num_tokens, &tm, &te);
  switch (tm * 16 + te) {
    case 1 * 16 + 1:
      return Launch<1, 1>(params, stream);
    case 1 * 16 + 2:
      return Launch<1, 2>(params, stream);
    case 2 * 16 + 1:
      return Launch<2, 1>(params, stream);
    case 2 * 16 + 2:
      return Launch<2, 2>(params, stream);
    case 4 * 16 + 1:
      return Launch<4, 1>(params, stream);
    case 4 * 16 + 2:
      return Launch<4, 2>(params, stream);
    case 8 * 16 + 1:
      return Launch<8, 1>(params, stream);
    case 8 * 16 + 2:
      return Launch<8, 2>(params, stream);
    case 8 * 16 + 4:
      return Launch<8, 4>(params, stream);
    case 8 * 16 + 8:
      return Launch<8, 8>(params, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kernels
}  // namespace deepinfer
