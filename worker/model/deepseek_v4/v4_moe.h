// V4Moe: DeepSeek-V4's MoE block, every layer: the router (sqrtsoftplus or sigmoid scores; top-k
// of scores + e_score_correction_bias, or on hash_moe layers the experts tid2eid[token]; the
// chosen scores renormalised x routed_scaling_factor), the routed experts through the
// ExpertDispatcher (GroupedGemm, SwiGLU clamped at swiglu_limit, GroupedGemm; combined in
// ascending expert order), then the shared expert (clamped too) added after the routed sum.
// Where one rank hosts every expert in bf16, the routed experts (and with fused ops the shared
// one) run as one device op instead (Backend::RoutedExperts / RoutedAndSharedExperts with
// RoutedExpertsArgs::swiglu_limit; the routing stays on the device, as V3's MoeBlock): no host
// synchronisation, so the step can be recorded. Routed experts kept in MXFP4
// (LoadOptions::mxfp4_experts) run only so (Backend::RoutedExperts, the shared expert after it):
// a step the backend refuses them in, an expert-parallel dispatcher and an EPLB placement switch
// are FAILED_PRECONDITION / UNIMPLEMENTED naming MXFP4. Keeps the EPLB expert counts and switches
// placements (MoE layer = index in `layers`: the model's layers, or an MTP module's block, which
// the model runs as a V4Moe of its own).
#ifndef DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_MOE_H_
#define DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_MOE_H_

#include <cstdint>
#include <functional>
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

// One MoE layer's weights: router (+ correction bias), shared and routed experts; the hash
// router's table (int32 [vocab, top_k]) on hash_moe layers, else null.
struct V4MoeLayer {
  LayerWeights* weights = nullptr;
  const DeviceBuffer* hash_table = nullptr;
};

class V4Moe {
 public:
  // `weights` gives the matrices' dtype; `layers` the MoE layers this block runs. `drop_graphs`
  // is called whenever the expert tables (whose addresses recorded decode graphs hold) change.
  V4Moe(const DeepseekV4Config& config, DeepseekV4Weights* weights, std::vector<V4MoeLayer> layers,
        Backend* backend, std::unique_ptr<ExpertDispatcher> dispatcher,
        std::function<void()> drop_graphs);
  // The model's layers (DeepseekV4Weights::moe and the hash tables).
  static std::vector<V4MoeLayer> ModelLayers(DeepseekV4Weights* weights);

  // How Forward runs the experts.
  struct Mode {
    // RoutedAndSharedExperts where the backend takes it; the shared expert's bf16 path (Mlp).
    bool fused = true;
    bool device_only = false;          // a recorded step: FAILED_PRECONDITION unless on the device
    const int32_t* counted = nullptr;  // EPLB counts this many (token, expert) pairs (device)
  };
  // out [rows, H] = the block's output for the normed rows h; ids: the rows' token ids
  // (device), read by hash layers.
  absl::Status Forward(int64_t layer, int64_t rows, const float* h, const int32_t* ids, float* out,
                       const Mode& mode);
  // Whether the routed experts run as one device op (the decode graphs need it).
  bool experts_on_device() const { return !tables_.empty(); }

  std::vector<int64_t> TakeExpertCounts();
  std::vector<std::vector<int64_t>> MissingExperts(
      const std::vector<std::vector<int64_t>>& needed) const;
  absl::Status SwitchPlacement(std::shared_ptr<const ExpertPlacement> placement,
                               const std::vector<std::vector<int64_t>>& needed,
                               std::vector<std::map<int64_t, MlpWeights>> loaded);

 private:
  // out (+)= the clamped SwiGLU MLP w of h; with fused ops from kBf16MlpMinRows rows its gate /
  // up values and activation in bf16 where the backend takes them (Backend::GateUpSiluMulBf16
  // with config swiglu_limit), else in fp32.
  void Mlp(const MlpWeights& w, int64_t rows, const float* h, float* out, bool accumulate,
           bool fused);
  // Prefill sizes (CudaBackend takes GateUpSiluMulBf16 from 512 rows): below, no bf16 buffer is
  // allocated for a try.
  static constexpr int64_t kBf16MlpMinRows = 512;
  // The routed (and shared) experts of `layer` as one device op; false where the backend has
  // none for them (nothing done).
  bool ExpertsOnDevice(int64_t layer, int64_t rows, const float* h, const int32_t* topk_ids,
                       const float* topk_w, float* out, bool fused);
  // Device tables of every layer's experts for Backend::RoutedExperts (expert e in slot e),
  // where one rank hosts every expert in bf16 or MXFP4 (LoadOptions::mxfp4_experts); else none.
  // Rebuilt after a placement switch.
  void BuildExpertTables();
  std::unique_ptr<DeviceBuffer> Pointers(const std::vector<const void*>& host);
  std::unique_ptr<DeviceBuffer> Floats(int64_t n) {
    return backend_->AllocateScratch(std::max<int64_t>(1, n) * sizeof(float));
  }

  const DeepseekV4Config& config_;
  DeepseekV4Weights* weights_;
  const std::vector<V4MoeLayer> layers_;
  Backend* backend_;
  std::unique_ptr<ExpertDispatcher> dispatcher_;
  const std::function<void()> drop_graphs_;
  std::unique_ptr<DeviceBuffer> expert_counts_;  // int64 [layers, experts]
  struct ExpertTables {
    std::unique_ptr<DeviceBuffer> gate_up, down;       // device [E] pointers
    std::vector<const void*> gate_up_host, down_host;  // the same, on the host
    // The experts' storage: the matrix dtype, or kMxfp4E2M1 with device [E] pointers to each
    // expert's UE8M0 scales and the scale rows' strides (the same for every expert).
    WeightDType dtype = WeightDType::kBFloat16;
    std::unique_ptr<DeviceBuffer> gate_up_scales, down_scales;
    int64_t gate_up_scale_ld = 0, down_scale_ld = 0;
  };
  std::unique_ptr<DeviceBuffer> expert_slots_;  // device [E]: slot e holds expert e
  std::vector<ExpertTables> tables_;            // per layer; empty: not on the device
  // Per layer: whether a token's experts are distinct (always for learned routing; for a hash
  // layer, whether its table repeats no expert within a row), which the fused block needs.
  std::vector<bool> distinct_experts_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_MOE_H_
