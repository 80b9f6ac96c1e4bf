// noaux_tc router: one warp per token. A thread per token (the first version) walked the
// experts top_k times from local memory: ~40 us for one token at 64 experts on the H200, on the
// critical path of every MoE layer of a decode step. Here the warp's lanes share the token's
// experts (expert x on lane x % 32), the biased scores sit in shared memory, and each arg-max
// (top groups, top experts) is a warp reduction. The selection rules are the CPU reference's,
// and so are the values: a group's strength is the sum best + second of its two largest biased
// scores (a warp reduction finds the same two values as the reference's scan), ties go to the
// lower group / expert index, and the weights are summed over the chosen experts in ascending
// id order by one lane.
#include <math.h>

#include "kernels/common/launch.cuh"
#include "kernels/moe/noaux_tc_router.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kPerLane = kMaxRouterExperts / 32;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ float Sigmoid(float logit) { return 1.0f / (1.0f + expf(-logit)); }

// (value, index) arg-max over the warp; index < 0 marks "no candidate". Larger value wins,
// equal values go to the lower index (the reference's scan with a strict '>').
__device__ __forceinline__ void WarpArgMax(float* value, int* index) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float v = __shfl_xor_sync(kFull, *value, offset);
    const int i = __shfl_xor_sync(kFull, *index, offset);
    const bool better = i >= 0 && (*index < 0 || v > *value || (v == *value && i < *index));
    if (better) {
      *value = v;
      *index = i;
    }
  }
}

__device__ void NoauxTcRouteBody(NoauxTcRouteParams p) {
  __shared__ float s_choice[kWarps][kMaxRouterExperts];
  __shared__ int s_chosen[kWarps][kMaxRouterTopK];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = blockIdx.x * int64_t{kWarps} + warp;
  if (t >= p.num_tokens) return;  // the whole warp: no block-wide barrier below
  const int E = p.num_experts, G = p.num_groups, per_group = E / G;
  float* choice = s_choice[warp];
  const float* lg = p.router_logits + t * E;
  for (int x = lane; x < E; x += 32) {
    choice[x] = Sigmoid(lg[x]) + (p.correction_bias != nullptr ? p.correction_bias[x] : 0.0f);
  }
  __syncwarp();

  // Group strengths, then the top groups as a bit mask (G <= 64).
  uint64_t keep = 0;
  if (p.topk_groups < G) {
    float strength[kMaxRouterGroups / 32];  // group lane + 32 * j
#pragma unroll
    for (int j = 0; j < kMaxRouterGroups / 32; ++j) strength[j] = -INFINITY;
    for (int g = 0; g < G; ++g) {
      float best = -INFINITY, second = -INFINITY;
      for (int i = lane; i < per_group; i += 32) {
        const float s = choice[g * per_group + i];
        if (s > best) {
          second = best;
          best = s;
        } else if (s > second) {
          second = s;
        }
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        const float ob = __shfl_xor_sync(kFull, best, offset);
        const float os = __shfl_xor_sync(kFull, second, offset);
        // The two largest of {best, second, ob, os} (second <= best, os <= ob).
        second = fmaxf(fminf(best, ob), fmaxf(second, os));
        best = fmaxf(best, ob);
      }
      const float g_strength = per_group >= 2 ? best + second : best;
      if (g % 32 == lane) strength[g / 32] = g_strength;
    }
    for (int i = 0; i < p.topk_groups; ++i) {
      float v = -INFINITY;
      int idx = -1;
#pragma unroll
      for (int j = 0; j < kMaxRouterGroups / 32; ++j) {
        const int g = lane + 32 * j;
        if (g < G && !((keep >> g) & 1) && (idx < 0 || strength[j] > v)) {
          v = strength[j];
          idx = g;
        }
      }
      WarpArgMax(&v, &idx);
      keep |= uint64_t{1} << idx;
    }
  } else {
    keep = G >= 64 ? ~uint64_t{0} : (uint64_t{1} << G) - 1;
  }

  // The lane's experts (x = lane + 32 * j), outside the kept groups at -inf; top_k arg-maxes.
  float mine[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int x = lane + 32 * j;
    mine[j] = x < E && ((keep >> (x / per_group)) & 1) ? choice[x] : -INFINITY;
  }
  uint32_t taken = 0;
  for (int k = 0; k < p.top_k; ++k) {
    float v = -INFINITY;
    int idx = -1;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int x = lane + 32 * j;
      if (x < E && !((taken >> j) & 1) && (idx < 0 || mine[j] > v)) {
        v = mine[j];
        idx = x;
      }
    }
    WarpArgMax(&v, &idx);
    if (idx % 32 == lane) taken |= 1u << (idx / 32);
    if (lane == 0) s_chosen[warp][k] = idx;
  }
  __syncwarp();
  if (lane != 0) return;
  int* chosen = s_chosen[warp];
  // Ascending expert ids (insertion sort of at most kMaxRouterTopK entries).
  for (int k = 1; k < p.top_k; ++k) {
    const int v = chosen[k];
    int m = k - 1;
    while (m >= 0 && chosen[m] > v) {
      chosen[m + 1] = chosen[m];
      --m;
    }
    chosen[m + 1] = v;
  }
  float sum = 0.0f;
  for (int k = 0; k < p.top_k; ++k) sum += Sigmoid(lg[chosen[k]]);
  // The weights use the unbiased scores: the bias only steers selection (load balancing).
  const float denom = p.normalize ? sum + 1e-20f : 1.0f;
  for (int k = 0; k < p.top_k; ++k) {
    p.topk_ids[t * p.top_k + k] = chosen[k];
    p.topk_weights[t * p.top_k + k] = Sigmoid(lg[chosen[k]]) / denom * p.scaling_factor;
  }
}

}  // namespace

cudaError_t NoauxTcRouteF32(const NoauxTcRouteParams& params, cudaStream_t stream) {
  if (params.num_tokens <= 0) return cudaSuccess;
  const NoauxTcRouteParams& p = params;
  if (p.num_experts <= 0 || p.num_experts > kMaxRouterExperts || p.num_groups <= 0 ||
      p.num_groups > kMaxRouterGroups || p.num_experts % p.num_groups != 0 || p.topk_groups <= 0 ||
      p.topk_groups > p.num_groups || p.top_k <= 0 || p.top_k > kMaxRouterTopK ||
      p.top_k > p.num_experts) {
    return cudaErrorInvalidValue;
  }
  const unsigned blocks = static_cast<unsigned>((p.num_tokens + kWarps - 1) / kWarps);
  return LaunchAfterPrecedingGrids<NoauxTcRouteBody, kWarps * 32>(blocks, 0, stream, params);
}

}  // namespace kernels
}  // namespace deepinfer
