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
// Decode steps that qualify (DecodeGraphOptions) are padded to a batch-size bucket and replayed
// from ops recorded once per bucket (Backend::Capture: CUDA graphs).
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
#include "worker/model/expert_dispatcher.h"
#include "worker/model/model_config.h"
#include "worker/model/model_weights.h"
#include "worker/sampling/sampler.h"

namespace deepinfer {

struct SequenceStep {
  std::vector<int32_t> tokens;       // new tokens, at positions position_offset, +1, ...
  int64_t position_offset = 0;       // tokens already in the cache for this sequence
  std::vector<int32_t> block_table;  // must cover position_offset + tokens.size() positions
  bool all_logits = false;           // logits for every new token, else only the last
  // If set, the next token is sampled from the last row's logits (position of the sampled
  // token = position_offset + tokens.size(), which keys the seeded random stream).
  std::optional<SamplingParams> sampling;
  // Whether StepOutput::logits carries this sequence's rows. The engine only needs the sampled
  // token: without logits, the token is sampled on the device (greedy, seeded temperature /
  // top-k / top-p, up to kMaxTopLogprobs top logprobs; worker/sampling/device_sampler.h) and
  // only the token and its log-probabilities come back to the host (not a vocabulary row).
  bool return_logits = true;
};

struct StepOutput {
  // Per sequence, row-major [rows, vocab]: rows = tokens.size() if all_logits, else 1; empty
  // where SequenceStep::return_logits is false.
  std::vector<std::vector<float>> logits;
  // Per sequence; token -1 where SequenceStep::sampling was unset.
  std::vector<SampledToken> sampled;
};

// Decode steps recorded once per batch-size bucket and replayed (Backend::Capture: CUDA graphs).
// A step takes this path when the backend can record, every sequence brings exactly one new
// token, is greedy-sampled on the device (sampling set, temperature <= 0, no top logprobs, no
// logits returned), the routed experts run on the device (one rank hosting every expert), and
// the batch fits the largest bucket; everything else runs as before.
struct DecodeGraphOptions {
  bool enabled = true;      // --cuda-graphs
  int64_t max_batch = 256;  // --cuda-graph-max-batch: the largest bucket (>= 1)
  // false: run the padded per-bucket decode path without recording it (tests: tells the effect
  // of padding apart from that of replay).
  bool replay = true;
};

// Which form of MLA a prefill step's attention takes (--prefill-attention).
enum class PrefillAttention {
  // kMha for steps in which every sequence brings at least kMhaPrefillMinTokens new tokens and
  // the backend has the non-absorbed op, else kAbsorbed.
  kAuto,
  // Always the absorbed form: q_nope . W_uk, attention over the 576-wide latent (MlaAttention),
  // then . W_uv.
  kAbsorbed,
  // The non-absorbed form (Backend::MhaPrefillAttention: keys expanded through kv_b, attention
  // of width nope + rope over values of width v) for every step in which each sequence brings
  // more than one new token, where the backend has it; other steps absorbed.
  kMha,
};
// "auto" / "absorbed" / "mha"; INVALID_ARGUMENT naming the bad value otherwise.
absl::StatusOr<PrefillAttention> ParsePrefillAttention(const std::string& name);
const char* PrefillAttentionName(PrefillAttention form);

class DeepseekV3Model {
 public:
  // The dispatcher must serve every expert the router can choose (all of them for a local
  // dispatcher); the weights must hold its local experts.
  static absl::StatusOr<std::unique_ptr<DeepseekV3Model>> Create(
      const ModelConfig& config, std::unique_ptr<ModelWeights> weights, Backend* backend,
      std::unique_ptr<ExpertDispatcher> dispatcher);
  ~DeepseekV3Model();

  // Runs one forward step. An empty batch still runs every layer, so an expert-parallel rank
  // without tokens takes part in each MoE layer's exchange. Not thread-safe: one engine loop
  // drives a model. INVALID_ARGUMENT for malformed sequences (no tokens, block table too
  // short, token outside the vocabulary); FAILED_PRECONDITION if a token is routed to an expert
  // the dispatcher cannot serve; a dispatcher's communicator error as it is; the backend's first
  // error (Backend::status(), e.g. a failed CUDA call) if it has one.
  absl::StatusOr<StepOutput> Step(const std::vector<SequenceStep>& batch, KvBlockPool* cache);

  // Replaces the decode graph options (drops graphs recorded so far).
  void SetDecodeGraphOptions(const DecodeGraphOptions& options);
  const DecodeGraphOptions& decode_graph_options() const { return graph_options_; }
  // Fused ops (default on): each residual add goes into the next norm (Backend::AddRmsNorm),
  // norms and SiLU-mul hand bf16 weights' GEMMs their operand already in bf16, and the shared
  // experts' down projection accumulates into the routed sum. The same values as the unfused
  // ops (every rounding as before; only cuBLAS's kernel choice may differ). Off: the op per
  // step of before, for measurements. Drops recorded decode graphs.
  void SetFusedOps(bool on);
  bool fused_ops() const { return fused_ops_; }
  // The prefill attention form (default kAuto; see PrefillAttention).
  void SetPrefillAttention(PrefillAttention form) { prefill_attention_ = form; }
  PrefillAttention prefill_attention() const { return prefill_attention_; }
  // kAuto's least number of new tokens per sequence for the non-absorbed form. From the FLOP
  // counts and measured rates (docs/cuda.md): expanding a key costs about as much as ~50 new
  // tokens' absorbed attention to it saves.
  static constexpr int32_t kMhaPrefillMinTokens = 64;
  // Batch sizes decode steps are padded to: 1 2 4 8 16 24 32 48 64 96 128 160 192 256, then
  // steps of 64, those <= max_batch, and max_batch itself last.
  static std::vector<int64_t> DecodeGraphBuckets(int64_t max_batch);
  // Decode steps that ran on the padded bucket path (replayed or, with replay off, eager) and
  // graphs recorded so far: for tests and logs. A bucket whose attention kernel depends on the
  // context (Backend::MlaDecodeContextBreak > 0, e.g. CUDA's one-token kernel) has two graphs,
  // for batches up to the break and above it, each recorded on first use.
  int64_t decode_graph_steps() const { return decode_graph_steps_; }
  int64_t decode_graphs_recorded() const { return decode_graphs_recorded_; }

  const ModelConfig& config() const { return config_; }
  int64_t num_moe_layers() const { return num_moe_layers_; }

  // EPLB load statistics: tokens routed to each logical expert since the last call,
  // [num_moe_layers][n_routed_experts] row-major, counted on the device by every Step (of the
  // tokens this rank routes); reading resets them. Copies from the device: call between steps.
  std::vector<int64_t> TakeExpertCounts();

  // Live EPLB placement change, in two halves so that loading can happen before the switch:
  // MissingExperts lists, per MoE layer, the experts of `needed` (per MoE layer, the logical
  // experts this rank hosts under the new placement) whose weights are not loaded here;
  // SwitchPlacement then takes those weights (`loaded`, per MoE layer), hands the placement to
  // the dispatcher and frees the experts no longer hosted. FAILED_PRECONDITION if a needed
  // expert has no weights (nothing changes then); the dispatcher's error for a placement that
  // does not fit. Call between steps, on every rank of the group at the same step.
  std::vector<std::vector<int64_t>> MissingExperts(
      const std::vector<std::vector<int64_t>>& needed) const;
  absl::Status SwitchPlacement(std::shared_ptr<const ExpertPlacement> placement,
                               const std::vector<std::vector<int64_t>>& needed,
                               std::vector<std::map<int64_t, MlpWeights>> loaded);
  // Geometry a KvBlockPool for this model must have (num_blocks / block_size filled by caller).
  KvBlockPoolOptions CacheOptions(int32_t num_blocks, int32_t block_size) const;

 private:
  DeepseekV3Model(const ModelConfig& config, std::unique_ptr<ModelWeights> weights,
                  Backend* backend, std::unique_ptr<ExpertDispatcher> dispatcher);

  struct StepContext;  // per-step device metadata (positions, slots, block tables)
  // The step's tail after the LM head: samples the sequences that want no logits on the device
  // (DeviceSampler), copies the other rows to the host (Sampler picks there), and checks the
  // backend's status. logits: [rows, vocab], each sequence's rows in batch order.
  absl::StatusOr<StepOutput> SampleOrCopyLogits(const std::vector<SequenceStep>& batch,
                                                const float* logits, int64_t rows);
  struct DecodeGraph;  // one bucket's recorded decode step and its persistent buffers
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
  // The decode fast path (see DecodeGraphOptions): nullopt when the batch does not qualify (the
  // caller then runs the general path, which also reports malformed input).
  std::optional<absl::StatusOr<StepOutput>> DecodeWithGraph(const std::vector<SequenceStep>& batch,
                                                            KvBlockPool* cache);
  // The device-only decode step of one bucket, reading g's inputs and writing its outputs: what
  // is recorded and replayed.
  absl::Status DecodeForward(const DecodeGraph& g);
  void DropDecodeGraphs();
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

  // Decode graphs, per bucket, valid for the cache they were made with (graph_cache_id_): they
  // hold its addresses, as they hold the expert tables' (dropped by BuildExpertTables).
  DecodeGraphOptions graph_options_;
  bool fused_ops_ = true;
  PrefillAttention prefill_attention_ = PrefillAttention::kAuto;
  std::vector<int64_t> graph_buckets_;
  // Graphs per (bucket, context class): class 0 for batches whose longest context is at most
  // the backend's MlaDecodeContextBreak for the bucket (the only class where it is 0), 1 above.
  using GraphKey = std::pair<int64_t, int32_t>;
  std::map<GraphKey, std::unique_ptr<DecodeGraph>> decode_graphs_;
  std::set<GraphKey> failed_buckets_;  // recording failed: general path from then on
  uint64_t graph_cache_id_ = 0;
  KvBlockPool* graph_cache_ = nullptr;
  int32_t padding_block_ = -1;    // a block of graph_cache_ kept for padding rows' cache writes
  int32_t graph_max_blocks_ = 0;  // fixed block-table width of the graphs
  int64_t decode_graph_steps_ = 0;
  int64_t decode_graphs_recorded_ = 0;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_DEEPSEEK_V3_MODEL_H_
