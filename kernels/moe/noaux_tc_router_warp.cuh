// The noaux_tc decision for one token by one warp, shared by NoauxTcRouteF32 (logits from
// memory) and RouteTokensF32 (logits it computed itself). Include only from .cu files.
//
// Expert x lives on lane x % 32 as register j = x / 32 (kPerLane registers per lane), so the
// scores never go through memory: the group strengths, the top groups and the top experts are
// warp reductions over registers, and the chosen experts' scores are handed over by shuffles.
// The first version kept the biased scores in shared memory, walked 16 registers per lane
// whatever the expert count, and had lane 0 alone sort the choices and read their logits back
// from global memory twice (12 dependent L2 round trips at top-6): about 9 us per call at one
// token, most of it that serial tail.
//
// Values and rules are the CPU reference's (CpuBackend::NoauxTcRoute): sigmoid scores, the bias
// added for selection only, a group's strength the sum of its two largest biased scores (one if
// a group has one expert), ties to the lower group / expert index, weights from the unbiased
// scores summed in ascending expert order (the same fp32 additions as the reference's loop).
#ifndef DEEPINFER_KERNELS_MOE_NOAUX_TC_ROUTER_WARP_CUH_
#define DEEPINFER_KERNELS_MOE_NOAUX_TC_ROUTER_WARP_CUH_

#include <math.h>

#include <cstdint>

#include "kernels/moe/noaux_tc_router.h"

namespace deepinfer {
namespace kernels {
namespace router_internal {

constexpr unsigned kFullWarp = 0xffffffffu;

// The selection settings of a call (NoauxTcRouteParams without its pointers to rows).
struct RouterRule {
  int32_t num_experts = 0;
  const float* correction_bias = nullptr;
  int32_t num_groups = 1;
  int32_t topk_groups = 1;
  int32_t top_k = 1;
  bool normalize = true;
  float scaling_factor = 1.0f;
};

// Where one token's choices go. counts (may be null): counts[id] += 1 for each choice whose
// pair index first_pair + position (position in the ascending output row) is below pair_limit.
struct TokenOutput {
  int32_t* ids = nullptr;    // [top_k] of this token
  float* weights = nullptr;  // [top_k] of this token
  unsigned long long* counts = nullptr;
  int64_t first_pair = 0;
  int64_t pair_limit = 0;
};

__device__ __forceinline__ float Sigmoid(float logit) { return 1.0f / (1.0f + expf(-logit)); }

// (value, index) arg-max over the warp; index < 0 marks "no candidate". Larger value wins,
// equal values go to the lower index (the reference's scan with a strict '>').
__device__ __forceinline__ void WarpArgMax(float* value, int* index) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float v = __shfl_xor_sync(kFullWarp, *value, offset);
    const int i = __shfl_xor_sync(kFullWarp, *index, offset);
    const bool better = i >= 0 && (*index < 0 || v > *value || (v == *value && i < *index));
    if (better) {
      *value = v;
      *index = i;
    }
  }
}

// Routes one token; every lane of the warp must call it (no block-wide barrier inside). `logit`
// reads the token's logit of expert x (a functor, so that callers choose how: __ldg from an
// earlier kernel's output, __ldcg from another block's). kPerLane * 32 >= rule.num_experts.
template <int kPerLane, typename LogitOf>
__device__ void RouteTokenInWarp(const RouterRule& rule, const LogitOf& logit,
                                 const TokenOutput& out) {
  const int lane = threadIdx.x % 32;
  const int E = rule.num_experts, G = rule.num_groups, per_group = E / G;
  float score[kPerLane], choice[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int x = lane + 32 * j;
    score[j] = 0.0f;
    choice[j] = -INFINITY;
    if (x < E) {
      score[j] = Sigmoid(logit(x));
      choice[j] = score[j] + (rule.correction_bias != nullptr ? rule.correction_bias[x] : 0.0f);
    }
  }

  // Group strengths, then the top groups as a bit mask (G <= 64); experts of other groups
  // stay candidates at -inf, as in the reference.
  if (rule.topk_groups < G) {
    float strength[kMaxRouterGroups / 32];  // group lane + 32 * i
#pragma unroll
    for (int i = 0; i < kMaxRouterGroups / 32; ++i) strength[i] = -INFINITY;
    for (int g = 0; g < G; ++g) {
      float best = -INFINITY, second = -INFINITY;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const int x = lane + 32 * j;
        if (x < E && x / per_group == g) {
          const float s = choice[j];
          if (s > best) {
            second = best;
            best = s;
          } else if (s > second) {
            second = s;
          }
        }
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        const float ob = __shfl_xor_sync(kFullWarp, best, offset);
        const float os = __shfl_xor_sync(kFullWarp, second, offset);
        // The two largest of {best, second, ob, os} (second <= best, os <= ob).
        second = fmaxf(fminf(best, ob), fmaxf(second, os));
        best = fmaxf(best, ob);
      }
      const float g_strength = per_group >= 2 ? best + second : best;
#pragma unroll
      for (int i = 0; i < kMaxRouterGroups / 32; ++i) {
        if (g == lane + 32 * i) strength[i] = g_strength;
      }
    }
    uint64_t keep = 0;
    for (int k = 0; k < rule.topk_groups; ++k) {
      float v = -INFINITY;
      int idx = -1;
#pragma unroll
      for (int i = 0; i < kMaxRouterGroups / 32; ++i) {
        const int g = lane + 32 * i;
        if (g < G && !((keep >> g) & 1) && (idx < 0 || strength[i] > v)) {
          v = strength[i];
          idx = g;
        }
      }
      WarpArgMax(&v, &idx);
      keep |= uint64_t{1} << idx;
    }
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int x = lane + 32 * j;
      if (x < E && !((keep >> (x / per_group)) & 1)) choice[j] = -INFINITY;
    }
  }

  // top_k arg-maxes; lane k keeps the k-th choice and its unbiased score.
  uint32_t taken = 0;
  int my_id = -1;
  float my_score = 0.0f;
  for (int k = 0; k < rule.top_k; ++k) {
    float v = -INFINITY;
    int idx = -1;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int x = lane + 32 * j;
      if (x < E && !((taken >> j) & 1) && (idx < 0 || choice[j] > v)) {
        v = choice[j];
        idx = x;
      }
    }
    WarpArgMax(&v, &idx);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      if (lane + 32 * j == idx) {
        s = score[j];
        taken |= 1u << j;
      }
    }
    s = __shfl_sync(kFullWarp, s, idx % 32);
    if (lane == k) {
      my_id = idx;
      my_score = s;
    }
  }

  // Ascending expert ids: lane k's position is the number of smaller chosen ids (ids are
  // distinct). The sum runs over the positions in order on every lane, as the reference adds.
  const int K = rule.top_k;
  int position = 0;
  for (int k = 0; k < K; ++k) {
    const int other = __shfl_sync(kFullWarp, my_id, k);
    position += lane < K && other < my_id;
  }
  float sum = 0.0f;
  for (int r = 0; r < K; ++r) {
    const unsigned at = __ballot_sync(kFullWarp, lane < K && position == r);
    sum += __shfl_sync(kFullWarp, my_score, __ffs(at) - 1);
  }
  if (lane >= K) return;
  // The weights use the unbiased scores: the bias only steers selection (load balancing).
  const float denom = rule.normalize ? sum + 1e-20f : 1.0f;
  out.ids[position] = my_id;
  out.weights[position] = my_score / denom * rule.scaling_factor;
  if (out.counts != nullptr && out.first_pair + position < out.pair_limit && my_id >= 0 &&
      my_id < E) {
    atomicAdd(out.counts + my_id, 1ull);
  }
}

}  // namespace router_internal
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_NOAUX_TC_ROUTER_WARP_CUH_
