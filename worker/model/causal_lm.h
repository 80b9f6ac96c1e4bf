// CausalLm: the model as the engine, the rank builder, the memory plan, the benchmark and the
// tests see it, whatever its architecture. A model steps a batch of sequences through the paged
// KV cache it declared (CacheSpec), optionally records its decode steps (DecodeGraphRunner), may
// have a draft head (Draft: multi-token prediction for speculative decoding), and,
// when it has routed experts, counts their load and changes their placement (EPLB).
//
// Concrete architectures live in worker/model/ and are made by the registry
// (model_registry.h) from config.json's `architectures`; nothing outside worker/model/ names one.
#ifndef DEEPINFER_WORKER_MODEL_CAUSAL_LM_H_
#define DEEPINFER_WORKER_MODEL_CAUSAL_LM_H_

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/eplb/expert_placement.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/kv_cache/kv_cache_spec.h"
#include "worker/model/attention/prefill_attention.h"
#include "worker/model/decode_graph_runner.h"
#include "worker/model/model_config.h"
#include "worker/model/model_weights.h"
#include "worker/model/step_batch.h"

namespace deepinfer {

class CausalLm {
 public:
  virtual ~CausalLm() = default;

  virtual const ModelConfig& config() const = 0;

  // The KV cache this model reads and writes, per layer group, with entries in the backend's
  // weight dtype (a caller may store them otherwise: KvCacheSpec::WithDType).
  virtual KvCacheSpec CacheSpec() const = 0;

  // Runs one forward step (prefill, chunked prefill and decode of many sequences are the same
  // call; see SequenceStep). An empty batch still runs every layer, so an expert-parallel rank
  // without tokens takes part in each MoE layer's exchange. Not thread-safe: one engine loop
  // drives a model. INVALID_ARGUMENT for malformed sequences (no tokens, block table too short,
  // token outside the vocabulary) or a cache made for another spec; FAILED_PRECONDITION if a
  // token is routed to an expert the dispatcher cannot serve; a communicator's error as it is;
  // the backend's first error (Backend::status()) if it has one.
  virtual absl::StatusOr<StepOutput> Step(const std::vector<SequenceStep>& batch,
                                          KvBlockPool* cache) = 0;

  // Where a rebuild of a sequence must start replaying when its paged entries of positions
  // [0, kept_end) are kept (restored into its blocks) and its per-sequence state is lost
  // (SequenceStep::replay_from): the replay then reproduces the state exactly. 0 where the
  // model's cache is rebuilt by replaying every position (the paged MLA cache keeps nothing
  // per sequence, so a kept prefix needs no replay at all and the prefix cache serves it).
  virtual int64_t BoundedReplayStart(int64_t kept_end) const {
    (void)kept_end;
    return 0;
  }

  // The draft head (multi-token prediction modules, for speculative decoding; docs/engine.md):
  // how many modules the model was built with (ModelConfig::num_draft_layers), 0 for none.
  virtual int32_t num_draft_layers() const { return 0; }
  // Runs the draft head's module over each sequence's rows (see DraftStep), writing their
  // entries into the module's cache layers, and returns each sequence's draft from its last row.
  // No collectives: ranks may call it a different number of times. INVALID_ARGUMENT for
  // malformed sequences (as Step) or a module the model lacks; UNIMPLEMENTED without a draft
  // head.
  virtual absl::StatusOr<DraftOutput> Draft(const std::vector<DraftStep>& batch,
                                            KvBlockPool* cache) {
    return absl::UnimplementedError("this model has no draft head");
  }
  // How many drafts per sequence a step may verify against `cache` and leave no trace of the
  // rejected ones: what their rows write must be nothing a later step reads before writing it
  // again. Unbounded where the cache is paged entries only (a rejected draft's entries lie past
  // the sequence's computed positions and are written again when those are computed);
  // DeepSeek-V4's rings keep spare rows for this many (KvCacheGroupSpec::spare_rows).
  virtual int64_t MaxDraftsPerStep(const KvBlockPool& cache) const {
    (void)cache;
    return std::numeric_limits<int64_t>::max();
  }

  // How steps are computed, never what they compute (bit for bit on the CPU backend).
  // Replaces the decode graph options (drops graphs recorded so far).
  virtual void SetDecodeGraphOptions(const DecodeGraphOptions& options) = 0;
  virtual const DecodeGraphOptions& decode_graph_options() const = 0;
  // Fused ops (default on; docs/model.md "Step API"). Drops recorded decode graphs.
  virtual void SetFusedOps(bool on) = 0;
  virtual bool fused_ops() const = 0;
  // The MLA prefill form (models without MLA attention ignore it).
  virtual void SetPrefillAttention(PrefillAttention form) = 0;
  virtual PrefillAttention prefill_attention() const = 0;
  // Micro-batches per step: 1, or 2 where the model splits a step's sequences in two halves
  // whose expert exchanges overlap the other half's compute (DeepSeek's two-micro-batch
  // overlap). How steps are computed, never what: the same values per sequence. Every rank of a
  // group must use the same number. UNIMPLEMENTED for 2 where the model has no such path,
  // INVALID_ARGUMENT for other numbers.
  virtual absl::Status SetMicroBatches(int n) {
    if (n == 1) return absl::OkStatus();
    return n == 2 ? absl::UnimplementedError("this model runs one micro-batch per step")
                  : absl::InvalidArgumentError("micro-batches per step: 1 or 2");
  }
  virtual int micro_batches() const { return 1; }
  // Takes from `cache` what stepping against it needs besides the sequences' blocks (the decode
  // graphs' padding block), so that Step allocates nothing from it later: the engine calls it
  // once, while no step runs and before it allocates any block (its scheduling counts on the
  // blocks it sees free).
  virtual void PrepareCache(KvBlockPool* cache) {}
  // Start-up: records the decode graphs of every batch-size bucket of the options now, against
  // `cache` (DecodeGraphRunner::Capture), instead of on each bucket's first step. Returns how many
  // were recorded: 0 where decode graphs do not apply. Runs forward steps: on an expert-parallel
  // rank only when every rank of the group calls it.
  virtual absl::StatusOr<int> CaptureDecodeGraphs(KvBlockPool* cache) { return 0; }
  // Decode steps that ran on the padded bucket path and graphs recorded so far (tests, logs).
  virtual int64_t decode_graph_steps() const = 0;
  virtual int64_t decode_graphs_recorded() const = 0;

  // Routed experts (EPLB, docs/eplb.md); a model without them has no MoE layers and the calls
  // below do nothing. Layer numbers are MoE layers (0 = the first MoE layer).
  virtual int64_t num_moe_layers() const = 0;
  // Tokens routed to each logical expert since the last call, [num_moe_layers][n_routed_experts]
  // row-major, counted on the device by every Step (of the tokens this rank routes); reading
  // resets them. Copies from the device: call between steps.
  virtual std::vector<int64_t> TakeExpertCounts() = 0;
  // Live placement change, in two halves so that loading can happen before the switch:
  // MissingExperts lists, per MoE layer, the experts of `needed` (the logical experts this rank
  // hosts under the new placement) whose weights are not loaded here; SwitchPlacement takes
  // those weights (`loaded`), hands the placement to the dispatcher and frees the experts no
  // longer hosted. FAILED_PRECONDITION if a needed expert has no weights (nothing changes then);
  // the dispatcher's error for a placement that does not fit. Call between steps, on every rank
  // of the group at the same step.
  virtual std::vector<std::vector<int64_t>> MissingExperts(
      const std::vector<std::vector<int64_t>>& needed) const = 0;
  virtual absl::Status SwitchPlacement(std::shared_ptr<const ExpertPlacement> placement,
                                       const std::vector<std::vector<int64_t>>& needed,
                                       std::vector<std::map<int64_t, MlpWeights>> loaded) = 0;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_CAUSAL_LM_H_
