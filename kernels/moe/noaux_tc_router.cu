// noaux_tc router: one warp per token (kernels/moe/noaux_tc_router_warp.cuh), the token's logits
// read from the router GEMM's output. A thread per token (the first version) walked the experts
// top_k times from local memory: ~40 us for one token at 64 experts on the H200.
#include "kernels/common/launch.cuh"
#include "kernels/moe/noaux_tc_router.h"
#include "kernels/moe/noaux_tc_router_warp.cuh"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kWarps = 4;

template <int kPerLane>
__device__ void NoauxTcRouteBody(NoauxTcRouteParams p) {
  const int64_t t = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32;
  if (t >= p.num_tokens) return;  // the whole warp: no block-wide barrier below
  router_internal::RouterRule rule;
  rule.num_experts = p.num_experts;
  rule.correction_bias = p.correction_bias;
  rule.num_groups = p.num_groups;
  rule.topk_groups = p.topk_groups;
  rule.top_k = p.top_k;
  rule.normalize = p.normalize;
  rule.scaling_factor = p.scaling_factor;
  const float* lg = p.router_logits + t * p.num_experts;
  router_internal::TokenOutput out;
  out.ids = p.topk_ids + t * p.top_k;
  out.weights = p.topk_weights + t * p.top_k;
  router_internal::RouteTokenInWarp<kPerLane>(
      rule, [lg](int x) { return __ldg(lg + x); }, out);
}

template <int kPerLane>
cudaError_t Launch(const NoauxTcRouteParams& p, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((p.num_tokens + kWarps - 1) / kWarps);
  return LaunchAfterPrecedingGrids<NoauxTcRouteBody<kPerLane>, kWarps * 32>(blocks, 0, stream, p);
}

}  // namespace

bool NoauxTcRouteShapeSupported(int32_t num_experts, int32_t num_groups, int32_t topk_groups,
                                int32_t top_k) {
  return num_experts > 0 && num_experts <= kMaxRouterExperts && num_groups > 0 &&
         num_groups <= kMaxRouterGroups && num_experts % num_groups == 0 && topk_groups > 0 &&
         topk_groups <= num_groups && top_k > 0 && top_k <= kMaxRouterTopK && top_k <= num_experts;
}

cudaError_t NoauxTcRouteF32(const NoauxTcRouteParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return cudaSuccess;
  if (!NoauxTcRouteShapeSupported(p.num_experts, p.num_groups, p.topk_groups, p.top_k)) {
    return cudaErrorInvalidValue;
  }
  if (p.num_experts <= 64) return Launch<2>(p, stream);
  if (p.num_experts <= 256) return Launch<8>(p, stream);
  return Launch<kMaxRouterExperts / 32>(p, stream);
}

}  // namespace kernels
}  // namespace deepinfer
