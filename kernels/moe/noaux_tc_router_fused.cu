// RouteTokensF32: router logits, noaux_tc routing and expert counts in one launch.
//
// Replaces, per MoE layer of a decode step, cuBLAS's fp32 GEMV for the logits (two kernels at
// one token: dot_kernel + reduce_1Block_kernel), NoauxTcRouteF32 and AccumulateExpertCounts.
//
// The logits of a tile of tokens x experts and their hand-over to the token tile's last block:
// router_logits_tile.cuh. The last block routes the tile's tokens, one warp per token
// (noaux_tc_router_warp.cuh, NoauxTcRouteF32's code), and adds the expert counts.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/launch.cuh"
#include "kernels/moe/noaux_tc_router.h"
#include "kernels/moe/noaux_tc_router_fused.h"
#include "kernels/moe/noaux_tc_router_warp.cuh"
#include "kernels/moe/router_logits_tile.cuh"

namespace deepinfer {
namespace kernels {
namespace {

using router_logits::kThreads;

__device__ __forceinline__ router_logits::Tile TileOf(const RouteTokensParams& p) {
  router_logits::Tile t;
  t.num_tokens = p.num_tokens;
  t.num_experts = p.num_experts;
  t.hidden_size = p.hidden_size;
  t.hidden = p.hidden;
  t.router_weight = p.router_weight;
  t.router_logits = p.router_logits;
  t.tile_counters = p.tile_counters;
  return t;
}

template <int TM, int TE>
__device__ router_logits::WeightRounds<TE> PrefetchWeights(RouteTokensParams p) {
  return router_logits::PrefetchWeights<TE>(TileOf(p));
}

template <int TM, int TE>
__device__ void RouteTokensBody(const router_logits::WeightRounds<TE>& first,
                                RouteTokensParams p) {
  if (!router_logits::LogitsTileIsLast<TM, TE>(first, TileOf(p))) return;
  const int warp = threadIdx.x / 32;
  const int T = p.num_tokens, E = p.num_experts;
  const int t = blockIdx.y * TM + warp;
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
