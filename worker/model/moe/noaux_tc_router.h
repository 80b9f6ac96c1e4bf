// The noaux_tc router of DeepSeek-V3 (sigmoid scores, a correction bias for selection only,
// top-2-sum group scores, top-k groups, then top-k experts with unbiased weights, normalised and
// scaled): the arguments of Backend::RouteTokens for one MoE layer. Another router (hash
// routing, sqrtsoftplus scoring) is another file here with its backend op.
#ifndef DEEPINFER_WORKER_MODEL_MOE_NOAUX_TC_ROUTER_H_
#define DEEPINFER_WORKER_MODEL_MOE_NOAUX_TC_ROUTER_H_

#include <cstdint>

#include "worker/backend/backend.h"
#include "worker/model/model_config.h"
#include "worker/model/model_weights.h"

namespace deepinfer {

// Routing of `rows` rows of h [rows, hidden] (fp32) into topk_ids / topk_weights [rows, top_k];
// no input norm and no expert counts (the MoE block sets those).
RouteTokensArgs NoauxTcRouteArgs(const ModelConfig& c, const LayerWeights& L, int64_t rows,
                                 const float* h, int32_t* topk_ids, float* topk_weights);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_MOE_NOAUX_TC_ROUTER_H_
