// DeepseekV4Model: DeepSeek-V4 (HF transformers `deepseek_v4`, DeepseekV4ForCausalLM) as a
// composition of its components, on any backend with V4Ops (Backend::v4_ops):
//
//   embedding, copied into hc_mult residual streams (HyperConnections)
//   per layer:  attn site:  HyperConnections::Mix -> input norm -> V4Attention -> Expand
//               ffn site:   HyperConnections::Mix -> post-attention norm -> V4Moe -> Expand
//   HyperConnections::Head (collapse the streams) -> final norm -> LM head
//
// V4Attention (v4_attention.h) is the sliding-window / CSA / HCA attention with its
// compressors and indexer over the V4 cache kinds (kv_cache_spec.h); V4Moe (v4_moe.h) the
// sqrtsoftplus / hash routers, the routed experts through an ExpertDispatcher and the shared
// expert, with SwiGLU clamped at swiglu_limit (on the device through Backend::RoutedExperts
// where one rank hosts every expert in bf16).
//
// Step() runs prefill, chunked prefill and decode of many sequences in one call, like every
// CausalLm; a sequence's state (window ring, compressor rows) lives in the cache's state slot
// bound to its first block of its own (SequenceStep::shared_blocks: the blocks before it are a
// prefix-cache hit, read only), its compressed entries in its blocks. Each step's indices are one
// V4StepPlan (v4_step_plan.h), built on the host and uploaded once; the layers issue only device
// ops over it. Decode steps that qualify go through a DecodeGraphRunner (padded to a batch-size
// bucket, the plan in the bucket's own buffer, replayed from ops recorded once per bucket); the
// model gives it PrepareDecode and DecodeForward. The MTP modules asked for
// (ModelConfig::num_draft_layers) are its draft head: Draft runs one module's block (cache layer
// num_layers + i, its own MoE with every routed expert) over the main model's residual streams,
// and the cache's rings keep spare rows so that a verification's rejected drafts leave nothing
// a later step reads (docs/model.md, "MTP modules"). Made by the registry for
// DeepseekV4ForCausalLM; users hold a CausalLm.
#ifndef DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_DEEPSEEK_V4_MODEL_H_
#define DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_DEEPSEEK_V4_MODEL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/architecture.h"
#include "worker/model/causal_lm.h"
#include "worker/model/decode_graph_runner.h"
#include "worker/model/deepseek_v4/v4_attention.h"
#include "worker/model/deepseek_v4/v4_config.h"
#include "worker/model/deepseek_v4/v4_moe.h"
#include "worker/model/deepseek_v4/v4_weights.h"
#include "worker/model/expert_dispatcher.h"

namespace deepinfer {

class DeepseekV4Model final : public CausalLm {
 public:
  // INVALID_ARGUMENT if the weights do not match the config; UNIMPLEMENTED on a backend
  // without V4Ops.
  static absl::StatusOr<std::unique_ptr<DeepseekV4Model>> Create(
      const ModelConfig& config, const DeepseekV4Config& v4,
      std::unique_ptr<DeepseekV4Weights> weights, Backend* backend,
      std::unique_ptr<ExpertDispatcher> dispatcher);
  ~DeepseekV4Model() override;

  // The registry entry (model_registry.cc).
  static Architecture Entry();
  // The cache V4 declares: one group per attention kind (and compress rate) present, over the
  // model's layers and then its MTP modules' (cache layer num_layers + i); every ring with
  // speculative_tokens spare rows.
  static KvCacheSpec CacheSpecOf(const DeepseekV4Config& v4);

  const ModelConfig& config() const override { return config_; }
  KvCacheSpec CacheSpec() const override { return CacheSpecOf(v4_); }
  absl::StatusOr<StepOutput> Step(const std::vector<SequenceStep>& batch,
                                  KvBlockPool* cache) override;
  // kept_end - (L * (W - 1) + 2 * ratio) (L layers, window W, the largest compress ratio), or 0
  // when that is not past the start: docs/model.md, "Replay after preemption or worker loss".
  int64_t BoundedReplayStart(int64_t kept_end) const override;
  void SetDecodeGraphOptions(const DecodeGraphOptions& options) override {
    graphs_->SetOptions(options);
  }
  const DecodeGraphOptions& decode_graph_options() const override { return graphs_->options(); }
  // Fused ops: the MoE block as one op where the backend has it (RoutedAndSharedExperts).
  void SetFusedOps(bool on) override;
  bool fused_ops() const override { return fused_ops_; }
  // No MLA prefill forms: the knob is kept and ignored.
  void SetPrefillAttention(PrefillAttention form) override { prefill_ = form; }
  PrefillAttention prefill_attention() const override { return prefill_; }
  // The decode graphs' padding block (its rows write nothing in V4's cache; the runner keeps
  // one per cache) and their start-up recording (DecodeGraphRunner::Capture: each bucket's plan
  // of padding rows only).
  void PrepareCache(KvBlockPool* cache) override { graphs_->Prepare(cache); }
  absl::StatusOr<int> CaptureDecodeGraphs(KvBlockPool* cache) override {
    if (absl::Status st = CheckCache(*cache); !st.ok()) return st;
    return graphs_->Capture(cache);
  }
  int64_t decode_graph_steps() const override { return graphs_->steps(); }
  int64_t decode_graphs_recorded() const override { return graphs_->graphs_recorded(); }
  int64_t num_moe_layers() const override { return v4_.num_layers; }
  // The MTP modules loaded and kept (ModelConfig::num_draft_layers; DeepseekV4Weights::mtp).
  int32_t num_draft_layers() const override { return static_cast<int32_t>(v4_.num_draft_layers); }
  // One MTP module over the rows (DraftStep::hidden: the hc_mult residual streams of each row,
  // StepOutput::hidden), writing the module's cache layer; UNIMPLEMENTED for a model built
  // without modules.
  absl::StatusOr<DraftOutput> Draft(const std::vector<DraftStep>& batch,
                                    KvBlockPool* cache) override;
  // The fewest spare ring rows of the cache's groups (KvCacheGroupSpec::spare_rows).
  int64_t MaxDraftsPerStep(const KvBlockPool& cache) const override;

  // How the indexer breaks exact ties between entry scores at the top-k boundary (with few
  // index heads, relu makes many scores exactly 0). Default (off): among the entries the query
  // sees, as torch.topk orders them; a position's choice then depends on its own past only, so
  // chunked prefill, decode and replay give exactly what one prefill gives. On: among every
  // entry the sequence has at the end of the step, the unseen ones -inf, which is what HF's
  // forward over that prefix computes (torch.topk's order among ties depends on the row's
  // length); one prefill then equals HF's logits at every position even at ties, but a
  // position's choice depends on where its step ends. Off for serving; on for parity checks
  // of a whole forward pass.
  void set_indexer_full_forward_ties(bool on) { full_forward_ties_ = on; }
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
  DeepseekV4Model(const ModelConfig& config, const DeepseekV4Config& v4,
                  std::unique_ptr<DeepseekV4Weights> weights, Backend* backend,
                  std::unique_ptr<ExpertDispatcher> dispatcher);

  // INVALID_ARGUMENT unless sequence `si`'s step leaves its shared blocks (shared_blocks)
  // unwritten and has a block of its own to key its state.
  absl::Status CheckSharedBlocks(const SequenceStep& s, size_t si, int32_t block_size) const;
  // INVALID_ARGUMENT unless the cache is laid out as the model's (CacheSpec), with state slots.
  absl::Status CheckCache(const KvBlockPool& cache) const;
  // INVALID_ARGUMENT naming sequence `si` and what is wrong with its step.
  absl::Status CheckSequence(const SequenceStep& s, size_t si, const KvBlockPool& cache) const;
  // The state slot of sequence `si` (bound on its first step); FAILED_PRECONDITION for a step
  // that continues a sequence whose state is gone.
  absl::StatusOr<int32_t> BindSlot(const SequenceStep& s, size_t si, KvBlockPool* cache) const;
  // Every layer over the step's tokens: streams [T, hc, H] in (the embedding's copies), the
  // last layer's out; `next` is the other stream buffer. ids: the tokens (device); counted: EPLB
  // counts only this many (token, expert) pairs (device; null: all); device_only: a recorded
  // step (the routed experts on the device or FAILED_PRECONDITION).
  absl::Status Layers(const V4StepContext& ctx, const int32_t* ids, const int32_t* counted,
                      bool device_only, std::unique_ptr<DeviceBuffer>* streams,
                      std::unique_ptr<DeviceBuffer>* next);
  // One decoder block over the streams (as Layers): cache layer `layer`, the model's layer or,
  // from num_layers on, MTP module layer - num_layers (its weights and its MoE).
  absl::Status Block(int64_t layer, const V4StepContext& ctx, const int32_t* ids,
                     const V4Moe::Mode& mode, std::unique_ptr<DeviceBuffer>* streams,
                     std::unique_ptr<DeviceBuffer>* next);
  // The compress rate of cache layer `layer` (an MTP module's from num_layers on; 0: sliding).
  int64_t CompressRateOf(int64_t layer) const;
  // The residual streams of T tokens: hc copies of each token's embedding.
  std::unique_ptr<DeviceBuffer> Embed(const V4StepPlan& plan, const int32_t* ids);
  // The head over R rows of streams (rows: device row indices, or null for rows 0..R-1):
  // the streams' collapse, final norm, LM head; logits [R, vocab].
  std::unique_ptr<DeviceBuffer> Logits(int64_t R, const float* streams, const int32_t* rows);
  // The same with another hc head and final norm (an MTP module's).
  std::unique_ptr<DeviceBuffer> Logits(int64_t R, const float* streams, const int32_t* rows,
                                       const V4HyperConnectionWeights& hc_head,
                                       const DeviceBuffer& norm);
  // DecodeGraphModel::prepare / forward: a qualifying decode batch's padded plan uploaded into
  // its bucket's buffer, and the device-only step over it.
  absl::StatusOr<bool> PrepareDecode(const std::vector<SequenceStep>& batch, int64_t bucket,
                                     KvBlockPool* cache);
  absl::Status DecodeForward(const DecodeGraphInputs& in);
  // One hyper-connection site's mixing (HcMix) of streams [T, hc, H]: post, comb, collapsed.
  // With norm_weight, also normed = RmsNorm(collapsed, norm_weight, rms_norm_eps) and/or
  // normed_bf16, the same rounded to bf16 (as AddRmsNorm's out_bf16), in the mixing op where the
  // backend's fused op takes it (collapsed then not written).
  void Mix(int64_t T, const V4HyperConnectionWeights& w, const float* streams, float* post,
           float* comb, float* collapsed, const float* norm_weight = nullptr,
           float* normed = nullptr, uint16_t* normed_bf16 = nullptr);
  std::unique_ptr<DeviceBuffer> Floats(int64_t n) {
    return backend_->AllocateScratch(std::max<int64_t>(1, n) * sizeof(float));
  }

  const ModelConfig config_;
  const DeepseekV4Config v4_;
  std::unique_ptr<DeepseekV4Weights> weights_;
  Backend* backend_;
  V4Ops* ops_;
  std::unique_ptr<DeviceBuffer> ones_;  // the unweighted norms' weight
  std::unique_ptr<V4Attention> attention_;
  std::unique_ptr<V4Moe> moe_;
  std::unique_ptr<V4Moe> draft_moe_;  // the MTP modules' blocks (none without modules)
  bool fused_ops_ = true;
  bool full_forward_ties_ = false;
  PrefillAttention prefill_ = PrefillAttention::kAuto;
  // The decode graphs' plans, one per bucket, each in a buffer the recorded ops read (valid for
  // the cache they were made with: plan_cache_id_).
  std::map<int64_t, std::unique_ptr<V4StepPlan>> graph_plans_;
  uint64_t plan_cache_id_ = 0;
  // Last: destroyed first, it waits for recorded graphs, which hold the plans' and the MoE
  // block's expert tables' addresses.
  std::unique_ptr<DecodeGraphRunner> graphs_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_DEEPSEEK_V4_MODEL_H_
