// DeepSeek "noaux_tc" MoE router (fp32): sigmoid scores, correction bias for selection only,
// group scores from the top-2 biased scores, top-k groups, top-k experts, unbiased weights
// normalised and scaled. The GPU counterpart of Backend::NoauxTcRoute.
#ifndef DEEPINFER_KERNELS_MOE_NOAUX_TC_ROUTER_H_
#define DEEPINFER_KERNELS_MOE_NOAUX_TC_ROUTER_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// Limits of this implementation (DeepSeek-V3: 256 experts, 8 groups, top-8; Kimi-K2: 384).
constexpr int32_t kMaxRouterExperts = 512;
constexpr int32_t kMaxRouterGroups = 64;
constexpr int32_t kMaxRouterTopK = 32;

struct NoauxTcRouteParams {
  int32_t num_tokens = 0;
  int32_t num_experts = 0;
  const float* router_logits = nullptr;    // [tokens, experts]
  const float* correction_bias = nullptr;  // [experts] or null
  int32_t num_groups = 1;
  int32_t topk_groups = 1;
  int32_t top_k = 1;
  bool normalize = true;
  float scaling_factor = 1.0f;
  int32_t* topk_ids = nullptr;    // [tokens, top_k], ascending expert id within a token
  float* topk_weights = nullptr;  // [tokens, top_k]
};

// Whether the limits above take this router (and the experts split into equal groups).
bool NoauxTcRouteShapeSupported(int32_t num_experts, int32_t num_groups, int32_t topk_groups,
                                int32_t top_k);

// Ties (equal group scores, equal biased expert scores) go to the lower index, as in the CPU
// reference. cudaErrorInvalidValue where NoauxTcRouteShapeSupported does not hold.
cudaError_t NoauxTcRouteF32(const NoauxTcRouteParams& params, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_NOAUX_TC_ROUTER_H_
