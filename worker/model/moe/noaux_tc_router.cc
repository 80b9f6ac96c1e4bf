// NoauxTcRouteArgs.
#include "worker/model/moe/noaux_tc_router.h"

namespace deepinfer {

RouteTokensArgs NoauxTcRouteArgs(const ModelConfig& c, const LayerWeights& L, int64_t rows,
                                 const float* h, int32_t* topk_ids, float* topk_weights) {
  RouteTokensArgs ra;
  ra.hidden_size = c.hidden_size;
  ra.hidden = h;
  ra.router_weight = L.router->as<float>();
  ra.route.num_tokens = static_cast<int32_t>(rows);
  ra.route.num_experts = static_cast<int32_t>(c.n_routed_experts);
  ra.route.correction_bias = L.router_bias->as<float>();
  ra.route.num_groups = static_cast<int32_t>(c.n_group);
  ra.route.topk_groups = static_cast<int32_t>(c.topk_group);
  ra.route.top_k = static_cast<int32_t>(c.num_experts_per_tok);
  ra.route.normalize = c.norm_topk_prob;
  ra.route.scaling_factor = static_cast<float>(c.routed_scaling_factor);
  ra.route.topk_ids = topk_ids;
  ra.route.topk_weights = topk_weights;
  return ra;
}

}  // namespace deepinfer
