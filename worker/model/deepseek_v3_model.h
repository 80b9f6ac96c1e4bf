// DeepseekV3Model: the DeepSeek-V3 forward pass, written once against the Backend interface.
//
// One Step() call runs a batch of sequences through every layer: each sequence brings its new
// tokens (a whole prompt, a prompt chunk, or one decode token), the position of its first new
// token, and its block table in the paged latent KV cache. Prefill and decode therefore share
// one code path, and a batch may mix them. Attention is MLA in the absorbed form: the cache
// holds, per token and layer, the normalised latent (kv_lora_rank) and the rotated rope key;
// queries are projected into the latent space through W_uk and outputs lifted back through W_uv.
// Routed experts go through an ExpertDispatcher (dispatch -> grouped GEMM -> combine): local
// (LocalExpertDispatcher) or expert-parallel over a communicator (EpExpertDispatcher).
// Decode steps that qualify go through a DecodeGraphRunner (padded to a batch-size bucket and
// replayed from ops recorded once per bucket); the model gives it DecodeForward.
// Made by the registry (model_registry.h) for DeepseekV3ForCausalLM; users hold a CausalLm.
#ifndef DEEPINFER_WORKER_MODEL_DEEPSEEK_V3_MODEL_H_
#define DEEPINFER_WORKER_MODEL_DEEPSEEK_V3_MODEL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/architecture.h"
#include "worker/model/causal_lm.h"
#include "worker/model/decode_graph_runner.h"
#include "worker/model/expert_dispatcher.h"
#include "worker/model/model_config.h"
#include "worker/model/model_weights.h"

namespace deepinfer {

class DeepseekV3Model final : public CausalLm {
 public:
  // The dispatcher must serve every expert the router can choose (all of them for a local
  // dispatcher); the weights must hold its local experts.
  static absl::StatusOr<std::unique_ptr<DeepseekV3Model>> Create(
      const ModelConfig& config, std::unique_ptr<ModelWeights> weights, Backend* backend,
      std::unique_ptr<ExpertDispatcher> dispatcher);
  ~DeepseekV3Model();

  // The registry entry (model_registry.cc): build, sizes from the config, cache spec.
  static Architecture Entry();

  // CausalLm.
  const ModelConfig& config() const override { return config_; }
  KvCacheSpec CacheSpec() const override;
  absl::StatusOr<StepOutput> Step(const std::vector<SequenceStep>& batch,
                                  KvBlockPool* cache) override;
  void SetDecodeGraphOptions(const DecodeGraphOptions& options) override;
  const DecodeGraphOptions& decode_graph_options() const override { return graphs_->options(); }
  // Fused ops: each residual add goes into the next norm (Backend::AddRmsNorm), norms and
  // SiLU-mul hand bf16 weights' GEMMs their operand already in bf16, and the shared experts'
  // down projection accumulates into the routed sum. The same values as the unfused ops (every
  // rounding as before; only cuBLAS's kernel choice may differ). Off: the op per step of
  // before, for measurements.
  void SetFusedOps(bool on) override;
  bool fused_ops() const override { return fused_ops_; }
  void SetPrefillAttention(PrefillAttention form) override { prefill_attention_ = form; }
  PrefillAttention prefill_attention() const override { return prefill_attention_; }
  // A bucket whose attention kernel depends on the context (Backend::MlaDecodeContextBreak > 0,
  // e.g. CUDA's one-token kernel) has two graphs, for batches up to the break and above it.
  int64_t decode_graph_steps() const override { return graphs_->steps(); }
  int64_t decode_graphs_recorded() const override { return graphs_->graphs_recorded(); }
  int64_t num_moe_layers() const override { return num_moe_layers_; }
  std::vector<int64_t> TakeExpertCounts() override;
  std::vector<std::vector<int64_t>> MissingExperts(
      const std::vector<std::vector<int64_t>>& needed) const override;
  absl::Status SwitchPlacement(std::shared_ptr<const ExpertPlacement> placement,
                               const std::vector<std::vector<int64_t>>& needed,
                               std::vector<std::map<int64_t, MlpWeights>> loaded) override;

 private:
  DeepseekV3Model(const ModelConfig& config, std::unique_ptr<ModelWeights> weights,
                  Backend* backend, std::unique_ptr<ExpertDispatcher> dispatcher);

  struct StepContext;  // per-step device metadata (positions, slots, block tables)
  // The step's tail after the LM head: samples the sequences that want no logits on the device
  // (DeviceSampler), copies the other rows to the host (Sampler picks there), and checks the
  // backend's status. logits: [rows, vocab], each sequence's rows in batch order.
  absl::StatusOr<StepOutput> SampleOrCopyLogits(const std::vector<SequenceStep>& batch,
                                                const float* logits, int64_t rows);
  // Embedding and every layer for ctx's tokens (ids: device [T]); x [T, hidden] ends as the
  // residual stream after the last layer, except that when ResidualPending() the last layer's
  // output, left in y [T, hidden], is still to be added (the caller fuses it into the final
  // norm).
  absl::Status Layers(const StepContext& ctx, const int32_t* ids, float* x, float* y);
  bool ResidualPending() const { return fused_ops_ && config_.num_hidden_layers > 0; }
  // The final norm of `rows` rows of x (contiguous): into out, or with fused ops and bf16
  // weights into out_bf16 (the LM head's operand); returns the LM head's operand. y: with
  // fused ops, the last layer's output still to be added to x (null: already added).
  ActivationView FinalNorm(int64_t rows, float* x, const float* y, float* out, uint16_t* out_bf16);
  // The device-only decode step of one bucket (DecodeGraphModel::forward): what is recorded
  // and replayed.
  absl::Status DecodeForward(const DecodeGraphInputs& in);
  // The layer's input norm, when Attention applies it: x += y (y optional), then the normed
  // rows into normed_bf16 if set, else normed (h's buffer; scratch of AddRmsNormGemms).
  struct InputNorm {
    float* x;
    const float* y;
    const float* weight;
    float eps;
    float* normed;
    uint16_t* normed_bf16;
  };
  // h: the normed rows as the GEMMs take them (bf16 with fused ops and bf16 weights). With
  // `norm`, h is not yet written: the norm and the GEMMs that read h (q or q_a, kv_a) run as one
  // Backend::AddRmsNormGemms, h its scratch.
  void Attention(int64_t layer, const StepContext& ctx, ActivationView h, float* out,
                 const InputNorm* norm = nullptr);
  // Whether this step's attention takes the non-absorbed form (prefill_attention_, the spans).
  bool UsesMhaPrefill(const StepContext& ctx) const;
  // The non-absorbed attention and o_proj of one layer, after the cache holds this step's keys
  // (q: [T, heads, nope | rotated rope]): false, doing nothing, when the backend declines.
  bool MhaPrefillAttention(int64_t layer, const StepContext& ctx, const float* q,
                           const PagedLatentCacheView& view, float* out);
  // out = MLP(h), or out += MLP(h) with accumulate.
  absl::Status Mlp(const MlpWeights& w, int64_t rows, ActivationView h, float* out,
                   bool accumulate);
  // h: fp32 (router, routed experts); h_gemm: the same rows for the shared experts' GEMM. With
  // norm (its out is h, its out_bf16 h_gemm's bf16 rows if any), the rows are normed by the
  // routing op first (Backend::RouteTokens); null: h is normed already.
  absl::Status Moe(int64_t layer, int64_t rows, const float* h, ActivationView h_gemm, float* out,
                   const StepContext& ctx, const RouteTokensArgs::Norm* norm = nullptr);
  // With fused ops and bf16 weights: a bf16 copy of the normed rows feeds the GEMMs.
  bool Bf16Operands() const {
    return fused_ops_ && weights_->matrix_dtype == WeightDType::kBFloat16;
  }
  // Backend::RoutedExperts for one rank hosting every expert; false: use the dispatcher. With
  // fused ops and shared experts, Backend::RoutedAndSharedExperts first: *shared_done tells
  // whether out already holds the shared experts too.
  bool RoutedExpertsOnDevice(int64_t layer, int64_t rows, const float* h, const int32_t* topk_ids,
                             const float* topk_w, float* out, bool* shared_done);
  void BuildExpertTables();
  absl::Status SharedExperts(const LayerWeights& L, int64_t rows, ActivationView h, float* out);
  // Per-step temporaries, written by an op before they are read (not zeroed).
  std::unique_ptr<DeviceBuffer> Floats(int64_t n) {
    return backend_->AllocateScratch(n * sizeof(float));
  }

  const ModelConfig config_;
  std::unique_ptr<ModelWeights> weights_;
  Backend* backend_;
  std::unique_ptr<ExpertDispatcher> dispatcher_;
  std::unique_ptr<DeviceBuffer> inv_freq_;
  // Device tables for Backend::RoutedExperts (empty unless one rank hosts every expert):
  // expert -> slot map, and per MoE layer the experts' gate_up / down weight pointers.
  struct ExpertTables {
    std::unique_ptr<DeviceBuffer> gate_up, down;
    std::vector<const void*> gate_up_host, down_host;  // the same pointers, on the host
  };
  std::unique_ptr<DeviceBuffer> expert_slots_;
  std::vector<ExpertTables> expert_tables_;
  float rope_attention_factor_ = 1.0f;
  float softmax_scale_ = 1.0f;
  // Per model layer, its index among the MoE layers (-1 for a dense layer).
  std::vector<int64_t> moe_index_;
  int64_t num_moe_layers_ = 0;
  std::unique_ptr<DeviceBuffer> expert_counts_;  // int64 [num_moe_layers, n_routed_experts]
  // Batch sizes whose routed experts Backend::RoutedExperts ran in a device-only step: such a
  // step of these sizes counts the experts inside Backend::RouteTokens (see Moe).
  std::set<int64_t> device_expert_rows_;

  bool fused_ops_ = true;
  PrefillAttention prefill_attention_ = PrefillAttention::kAuto;
  // Last: destroyed first, it waits for recorded graphs, which hold the expert tables' addresses
  // (BuildExpertTables drops them).
  std::unique_ptr<DecodeGraphRunner> graphs_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_DEEPSEEK_V3_MODEL_H_
