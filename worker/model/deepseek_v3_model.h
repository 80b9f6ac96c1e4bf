// DeepseekV3Model: the DeepSeek-V3 forward pass as a composition of layer components, written
// once against the Backend interface and its op providers (backend/ops/): the token embedding,
// per layer MlaAttention (attention/) and either a SwiGLU MLP (layers/) or the MoeBlock (moe/:
// noaux_tc router, routed experts on the device or through an ExpertDispatcher, shared experts),
// each block behind its norm on a plain residual stream (layers/residual_stream.h), then the LM
// head (final norm and head GEMM) and the step's sampling (layers/step_sampling.h). With
// ModelConfig::num_draft_layers the model also has its MTP modules as a draft head (Draft).
//
// One Step() call runs a batch of sequences through every layer: each sequence brings its new
// tokens (a whole prompt, a prompt chunk, or one decode token), the position of its first new
// token, and its block table in the paged latent KV cache. Prefill and decode therefore share
// one code path, and a batch may mix them. Decode steps that qualify go through a
// DecodeGraphRunner (padded to a batch-size bucket and replayed from ops recorded once per
// bucket); the model gives it DecodeForward.
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
#include "worker/backend/ops/op_mode.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/architecture.h"
#include "worker/model/attention/mla_attention.h"
#include "worker/model/causal_lm.h"
#include "worker/model/decode_graph_runner.h"
#include "worker/model/expert_dispatcher.h"
#include "worker/model/layer_context.h"
#include "worker/model/layers/embedding.h"
#include "worker/model/layers/lm_head.h"
#include "worker/model/layers/residual_stream.h"
#include "worker/model/model_config.h"
#include "worker/model/model_weights.h"
#include "worker/model/moe/exchange_thread.h"
#include "worker/model/moe/moe_block.h"

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
  void SetPrefillAttention(PrefillAttention form) override {
    attention_->set_prefill_attention(form);
  }
  PrefillAttention prefill_attention() const override { return attention_->prefill_attention(); }
  // A bucket whose attention kernel depends on the context (Backend::MlaDecodeContextBreak > 0,
  // e.g. CUDA's one-token kernel) has two graphs, for batches up to the break and above it.
  int32_t num_draft_layers() const override {
    return static_cast<int32_t>(config_.num_draft_layers);
  }
  // The MTP module (DeepSeek-V3 section 2.2): rows = eh_proj([enorm(embed(token)); hnorm(h)]),
  // one decoder layer (layer num_hidden_layers + module, its own MLA cache entries; its routed
  // experts through a local dispatcher on every rank), then shared_head.norm and the main
  // model's LM head; the draft is the greedy token.
  absl::StatusOr<DraftOutput> Draft(const std::vector<DraftStep>& batch,
                                    KvBlockPool* cache) override;
  // Two micro-batches (n = 2): the step's sequences split in two halves of about equal tokens
  // that run through each MoE layer interleaved, one's expert exchange (on an ExchangeThread)
  // overlapping the other's compute; the same values per sequence as one batch. No decode graphs
  // then. Every rank of an expert-parallel group must use the same n (the exchanges per layer
  // double). INVALID_ARGUMENT for n other than 1 or 2.
  absl::Status SetMicroBatches(int n) override;
  int micro_batches() const override { return micro_batches_; }
  void PrepareCache(KvBlockPool* cache) override { graphs_->Prepare(cache); }
  absl::StatusOr<int> CaptureDecodeGraphs(KvBlockPool* cache) override {
    if (absl::Status st = CheckCache(*cache, "CaptureDecodeGraphs"); !st.ok()) return st;
    return graphs_->Capture(cache);
  }
  int64_t decode_graph_steps() const override { return graphs_->steps(); }
  int64_t decode_graphs_recorded() const override { return graphs_->graphs_recorded(); }
  int64_t num_moe_layers() const override { return moe_->num_moe_layers(); }
  std::vector<int64_t> TakeExpertCounts() override { return moe_->TakeExpertCounts(); }
  std::vector<std::vector<int64_t>> MissingExperts(
      const std::vector<std::vector<int64_t>>& needed) const override {
    return moe_->MissingExperts(needed);
  }
  absl::Status SwitchPlacement(std::shared_ptr<const ExpertPlacement> placement,
                               const std::vector<std::vector<int64_t>>& needed,
                               std::vector<std::map<int64_t, MlpWeights>> loaded) override {
    return moe_->SwitchPlacement(std::move(placement), needed, std::move(loaded));
  }

 private:
  DeepseekV3Model(const ModelConfig& config, std::unique_ptr<ModelWeights> weights,
                  Backend* backend, std::unique_ptr<ExpertDispatcher> dispatcher);

  // Embedding and every layer for ctx's tokens (ids: device [T]); x [T, hidden] ends as the
  // residual stream after the last layer, except that when ResidualPending() the last layer's
  // output, left in y [T, hidden], is still to be added (the caller fuses it into the final
  // norm).
  absl::Status Layers(const LayerContext& ctx, const int32_t* ids, float* x, float* y);
  // The step after the layers for `batch` (meta's rows, x and y as Layers leaves them): final
  // norm, LM head, sampling or logits, hidden rows.
  absl::StatusOr<StepOutput> StepTail(const std::vector<SequenceStep>& batch,
                                      const StepMetadata& meta, float* x, float* y);
  // Step with two micro-batches (SetMicroBatches).
  absl::StatusOr<StepOutput> TwoMicroBatchStep(const std::vector<SequenceStep>& batch,
                                               KvBlockPool* cache);
  // Layer l's attention block on the stream; returns the norm in front of its MLP block.
  const ResidualNorm* Attention(int64_t l, const LayerContext& ctx, PlainResidualStream* stream);
  // Decoder layer l (a model layer, or an MTP module's at num_hidden_layers + i) on the stream.
  absl::Status Layer(int64_t l, const LayerContext& ctx, PlainResidualStream* stream,
                     MoeBlock* moe);
  // The step's hidden rows (x, plus y where ResidualPending) of the sequences that asked.
  void CopyHidden(const std::vector<SequenceStep>& batch, int64_t tokens, const float* x,
                  const float* y, StepOutput* out);
  // The checks Step makes on the cache.
  absl::Status CheckCache(const KvBlockPool& cache, const char* what) const;
  bool ResidualPending() const { return fused_ops_ && config_.num_hidden_layers > 0; }
  // The device-only decode step of one bucket (DecodeGraphModel::forward): what is recorded
  // and replayed.
  absl::Status DecodeForward(const DecodeGraphInputs& in);
  // How the ops compute: fused ops, and with them and bf16 weights a bf16 copy of the normed
  // rows feeds the GEMMs.
  OpMode Mode() const {
    return {fused_ops_, fused_ops_ && weights_->matrix_dtype == WeightDType::kBFloat16};
  }
  // Per-step temporaries, written by an op before they are read (not zeroed).
  std::unique_ptr<DeviceBuffer> Floats(int64_t n) {
    return backend_->AllocateScratch(n * sizeof(float));
  }

  const ModelConfig config_;
  std::unique_ptr<ModelWeights> weights_;
  Backend* backend_;
  std::unique_ptr<TokenEmbedding> embedding_;
  std::unique_ptr<MlaAttention> attention_;
  std::unique_ptr<MoeBlock> moe_;
  // The MTP modules' MoE layers (null without a draft head or for dense modules).
  std::unique_ptr<MoeBlock> draft_moe_;
  std::unique_ptr<LmHead> head_;
  bool fused_ops_ = true;
  int micro_batches_ = 1;
  std::unique_ptr<ExchangeThread> exchanges_;  // with two micro-batches, made at the first step
  // Last: destroyed first, it waits for recorded graphs, which hold the MoE block's expert
  // tables' addresses (the block drops them when the tables change).
  std::unique_ptr<DecodeGraphRunner> graphs_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_DEEPSEEK_V3_MODEL_H_
