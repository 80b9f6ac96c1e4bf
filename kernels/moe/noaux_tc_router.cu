// noaux_tc router: one thread per token. Routing is a few hundred scalar operations per token
// (well under the router GEMM's cost), so a simple sequential selection that mirrors the CPU
// reference step by step is preferred over a warp-cooperative sort here.
#include <math.h>

#include "kernels/moe/noaux_tc_router.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 64;

__global__ void NoauxTcRouteKernel(NoauxTcRouteParams p) {
  const int64_t t = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  if (t >= p.num_tokens) return;
  const int E = p.num_experts, G = p.num_groups, per_group = E / G;
  float score[kMaxRouterExperts], choice[kMaxRouterExperts];
  bool taken[kMaxRouterExperts];
  const float* lg = p.router_logits + t * E;
  for (int x = 0; x < E; ++x) {
    score[x] = 1.0f / (1.0f + expf(-lg[x]));
    choice[x] = score[x] + (p.correction_bias != nullptr ? p.correction_bias[x] : 0.0f);
    taken[x] = false;
  }
  // Group strength: the sum of the group's two best biased scores (one if it has one).
  float group_score[kMaxRouterGroups];
  bool keep[kMaxRouterGroups];
  for (int g = 0; g < G; ++g) {
    float best = -INFINITY, second = -INFINITY;
    for (int i = 0; i < per_group; ++i) {
      const float s = choice[g * per_group + i];
      if (s > best) {
        second = best;
        best = s;
      } else if (s > second) {
        second = s;
      }
    }
    group_score[g] = per_group >= 2 ? best + second : best;
    keep[g] = false;
  }
  // Repeated arg-max with a strict '>' keeps the lower index on ties (= a stable sort).
  for (int i = 0; i < p.topk_groups; ++i) {
    int best = -1;
    for (int g = 0; g < G; ++g) {
      if (!keep[g] && (best < 0 || group_score[g] > group_score[best])) best = g;
    }
    keep[best] = true;
  }
  for (int x = 0; x < E; ++x) {
    if (!keep[x / per_group]) choice[x] = -INFINITY;
  }
  int chosen[kMaxRouterTopK];
  for (int k = 0; k < p.top_k; ++k) {
    int best = -1;
    for (int x = 0; x < E; ++x) {
      if (!taken[x] && (best < 0 || choice[x] > choice[best])) best = x;
    }
    taken[best] = true;
    chosen[k] = best;
  }
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
  for (int k = 0; k < p.top_k; ++k) sum += score[chosen[k]];
  // The weights use the unbiased scores: the bias only steers selection (load balancing).
  const float denom = p.normalize ? sum + 1e-20f : 1.0f;
  for (int k = 0; k < p.top_k; ++k) {
    p.topk_ids[t * p.top_k + k] = chosen[k];
    p.topk_weights[t * p.top_k + k] = score[chosen[k]] / denom * p.scaling_factor;
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
  const unsigned blocks = static_cast<unsigned>((p.num_tokens + kThreads - 1) / kThreads);
  NoauxTcRouteKernel<<<blocks, kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace deepinfer
