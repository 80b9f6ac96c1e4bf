// V4Moe: DeepSeek-V4's MoE block, every layer: the router (sqrtsoftplus or sigmoid scores; top-k
// of scores + e_score_correction_bias, or on hash_moe layers the experts tid2eid[token]; the
// chosen scores renormalised x routed_scaling_factor), the routed experts through the
// ExpertDispatcher (GroupedGemm, SwiGLU clamped at swiglu_limit, GroupedGemm; combined in
// ascending expert order), then the shared expert (clamped too) added after the routed sum.
// Keeps the EPLB expert counts and switches placements (MoE layer = layer).
#ifndef DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_MOE_H_
#define DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_MOE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/eplb/expert_placement.h"
#include "worker/backend/backend.h"
#include "worker/model/deepseek_v4/v4_config.h"
#include "worker/model/deepseek_v4/v4_weights.h"
#include "worker/model/expert_dispatcher.h"

namespace deepinfer {

class V4Moe {
 public:
  V4Moe(const DeepseekV4Config& config, DeepseekV4Weights* weights, Backend* backend,
        std::unique_ptr<ExpertDispatcher> dispatcher);

  // out [rows, H] = the block's output for the normed rows h; ids: the rows' token ids
  // (device), read by hash layers.
  absl::Status Forward(int64_t layer, int64_t rows, const float* h, const int32_t* ids, float* out);

  std::vector<int64_t> TakeExpertCounts();
  std::vector<std::vector<int64_t>> MissingExperts(
      const std::vector<std::vector<int64_t>>& needed) const;
  absl::Status SwitchPlacement(std::shared_ptr<const ExpertPlacement> placement,
                               const std::vector<std::vector<int64_t>>& needed,
                               std::vector<std::map<int64_t, MlpWeights>> loaded);

 private:
  // out (+)= the clamped SwiGLU MLP w of h.
  void Mlp(const MlpWeights& w, int64_t rows, const float* h, float* out, bool accumulate);
  std::unique_ptr<DeviceBuffer> Floats(int64_t n) {
    return backend_->AllocateScratch(std::max<int64_t>(1, n) * sizeof(float));
  }

  const DeepseekV4Config& config_;
  DeepseekV4Weights* weights_;
  Backend* backend_;
  std::unique_ptr<ExpertDispatcher> dispatcher_;
  std::unique_ptr<DeviceBuffer> expert_counts_;  // int64 [layers, experts]
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_MOE_H_
