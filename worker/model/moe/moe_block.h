// MoeBlock: the MoE layers of a model: the router (noaux_tc_router.h), then the routed and
// shared experts, added as HF and DeepSeek add them: on the device where one rank hosts every
// expert in bf16 (ExpertsOnDevice, backend/ops/moe_ops.h, which picks the backend's fused
// block or its routed-expert op and the shared MLP), else dispatch -> grouped GEMM -> combine
// through an ExpertDispatcher (local or expert-parallel) and the shared MLP. It also keeps the EPLB
// state of those layers: the expert counts on the device and the placement switch (CausalLm's EPLB
// half).
#ifndef DEEPINFER_WORKER_MODEL_MOE_MOE_BLOCK_H_
#define DEEPINFER_WORKER_MODEL_MOE_MOE_BLOCK_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/eplb/expert_placement.h"
#include "worker/backend/backend.h"
#include "worker/model/expert_dispatcher.h"
#include "worker/model/layer_context.h"
#include "worker/model/layers/residual_stream.h"
#include "worker/model/model_config.h"
#include "worker/model/model_weights.h"

namespace deepinfer {

class MoeBlock {
 public:
  // `weights` (the model's; its routed experts change on a placement switch) must outlive the
  // block. The dispatcher must serve every expert the router can choose. `drop_graphs` is
  // called whenever the expert tables (whose addresses recorded decode graphs hold) change.
  // The block serves the MoE layers among model layers [first_layer, first_layer + num_layers)
  // (num_layers < 0: every decoder layer from first_layer; an MTP module's layer is a block of
  // its own, ModelConfig::num_draft_layers).
  MoeBlock(const ModelConfig& config, ModelWeights* weights, Backend* backend,
           std::unique_ptr<ExpertDispatcher> dispatcher, std::function<void()> drop_graphs,
           int64_t first_layer = 0, int64_t num_layers = -1);

  // out = routed experts (ascending) + shared experts of `rows` rows. h: fp32 (router, routed
  // experts); h_gemm: the same rows for the shared experts' GEMM. With norm (its out is h, its
  // out_bf16 h_gemm's bf16 rows if any), the rows are normed by the routing op first
  // (Backend::RouteTokens); null: h is normed already. FAILED_PRECONDITION in a device-only step
  // the backend cannot run on the device; the dispatcher's errors as they are.
  absl::Status Forward(int64_t layer, int64_t rows, const float* h, ActivationView h_gemm,
                       float* out, const LayerContext& ctx, const ResidualNorm* norm = nullptr);

  // Forward in three parts around the dispatcher's two exchanges, so that two micro-batches can
  // overlap one's exchange with the other's compute (DeepseekV3Model's two micro-batches):
  // BeginStaged routes and stages the dispatch, ExpertsStaged finishes it, runs this rank's
  // experts and stages the combine, FinishStaged adds the combine and the shared experts into
  // out. Each of the first two returns the exchange to run (on any thread) before the next part
  // (empty: none). A layer that takes a device path is done in BeginStaged (Staged::done). The
  // arguments of BeginStaged must stay valid until FinishStaged; Forward is the three in a row.
  struct Staged {
    int64_t layer = 0, rows = 0;
    ActivationView h_gemm{static_cast<const float*>(nullptr)};
    float* out = nullptr;
    OpMode mode;
    bool done = false;
    std::unique_ptr<DeviceBuffer> topk_ids, topk_w, expert_out;
    DispatchedTokens dispatched;
  };
  absl::StatusOr<ExpertDispatcher::Exchange> BeginStaged(int64_t layer, int64_t rows,
                                                         const float* h, ActivationView h_gemm,
                                                         float* out, const LayerContext& ctx,
                                                         const ResidualNorm* norm, Staged* s);
  absl::StatusOr<ExpertDispatcher::Exchange> ExpertsStaged(Staged* s);
  absl::Status FinishStaged(Staged* s);

  // Whether the routed experts run as one device op (the decode graph path needs it).
  bool experts_on_device() const { return !expert_tables_.empty(); }
  int64_t num_moe_layers() const { return num_moe_layers_; }
  // See CausalLm.
  std::vector<int64_t> TakeExpertCounts();
  std::vector<std::vector<int64_t>> MissingExperts(
      const std::vector<std::vector<int64_t>>& needed) const;
  absl::Status SwitchPlacement(std::shared_ptr<const ExpertPlacement> placement,
                               const std::vector<std::vector<int64_t>>& needed,
                               std::vector<std::map<int64_t, MlpWeights>> loaded);

 private:
  // The device op's arguments for one rank hosting every expert (expert_tables_ built), the
  // shared experts included.
  RoutedExpertsArgs DeviceExpertsArgs(int64_t layer, int64_t rows, const float* h,
                                      const int32_t* topk_ids, const float* topk_w,
                                      float* out) const;
  void BuildExpertTables();
  struct ExpertTables;
  // Fills *t with the tables of layer `L`'s experts `ids` (slot s: expert ids[s]); false where
  // the experts mix FP8 and other storage (the dispatcher's per-expert GEMMs take the layer).
  bool LayerTables(const LayerWeights& L, const std::vector<int64_t>& ids, ExpertTables* t);
  // A device copy of a host table of device pointers.
  std::unique_ptr<DeviceBuffer> Pointers(const std::vector<const void*>& host);
  // DeviceExperts of the device exchange for MoE model layer `layer` (Backend::RoutedExperts).
  bool ReceivedRowsExperts(int64_t layer, int64_t rows, const float* x, const int32_t* slot,
                           float* y);
  // Per-step temporaries, written by an op before they are read (not zeroed).
  std::unique_ptr<DeviceBuffer> Floats(int64_t n) {
    return backend_->AllocateScratch(n * sizeof(float));
  }

  const ModelConfig& config_;
  ModelWeights* const weights_;
  Backend* const backend_;
  std::unique_ptr<ExpertDispatcher> dispatcher_;
  const std::function<void()> drop_graphs_;
  // Device tables for Backend::RoutedExperts (empty unless one rank hosts every expert, or the
  // dispatcher exchanges on the device):
  // expert -> slot map, and per MoE layer the experts' gate_up / down weight pointers.
  struct ExpertTables {
    std::unique_ptr<DeviceBuffer> gate_up, down;
    std::vector<const void*> gate_up_host, down_host;  // the same pointers, on the host
    // The layer's experts' storage: matrix_dtype, or kFp8E4M3 / kMxfp4E2M1 with the scale
    // tables below.
    WeightDType dtype = WeightDType::kBFloat16;
    // Device [E] pointers to each expert's scales (FP8: fp32, MXFP4: UE8M0 bytes).
    std::unique_ptr<DeviceBuffer> gate_up_scales, down_scales;
    int64_t gate_up_scale_ld = 0, down_scale_ld = 0;  // shared by the E experts
  };
  std::unique_ptr<DeviceBuffer> expert_slots_;
  std::vector<ExpertTables> expert_tables_;
  // With a device expert exchange (ExpertDispatcher::device_exchange_slots() > 0) the tables hold
  // this rank's local slots instead (slot -> slot identity map), Backend::RoutedExperts runs on
  // the received rows, each with weight 1 (ones_).
  int64_t exchange_slots_ = 0;
  std::unique_ptr<DeviceBuffer> ones_;
  int64_t ones_rows_ = 0;
  // The model layers served: [first_layer_, end_layer_).
  int64_t first_layer_ = 0, end_layer_ = 0;
  // Per model layer, its index among the block's MoE layers (-1 for a dense layer or one outside
  // the block).
  std::vector<int64_t> moe_index_;
  int64_t num_moe_layers_ = 0;
  std::unique_ptr<DeviceBuffer> expert_counts_;  // int64 [num_moe_layers, n_routed_experts]
  // Batch sizes whose routed experts Backend::RoutedExperts ran in a device-only step: such a
  // step of these sizes counts the experts inside Backend::RouteTokens (see Forward).
  std::set<int64_t> device_expert_rows_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_MOE_MOE_BLOCK_H_
