// DecodeGraphRunner: decode steps padded to a batch-size bucket and replayed from ops recorded
// once per bucket (Backend::Capture: CUDA graphs), for any architecture.
//
// A step takes this path when the backend can record, every sequence brings exactly one new
// token, is sampled on the device (sampling set, parameters Sampler::Validate accepts, no top
// logprobs, no logits returned, no structured-output mask), the model says the path is available
// (DecodeGraphModel::available: e.g. its routed experts run on the device) and the batch fits the
// largest bucket; Run returns nullopt otherwise and the model runs its general path.
//
// Greedy and sampled rows (temperature > 0, top_k, top_p, each with its seed) share one graph
// per bucket: the recorded forward picks every row both ways (DecodeGraphPick:
// GreedySampleRows, as for an all-greedy batch, and SampleRows with per-row parameters the
// runner uploads each step into a fixed buffer, DecodeGraphInputs::sampling), and the runner
// takes each row's pick from the op the general path (DeviceSampler) would have used for it.
// Greedy rows thus get exactly the picks and logprobs of a graph without sampling, and sampled
// rows those of the general path on the same logits: the same SampleRows op, the same
// (seed, position) key (position: the row's position + 1, as SampleOrCopyLogits gives it). (On
// CUDA a padded bucket's logits may differ in the last bits from an unpadded eager step's, for
// greedy and sampled rows alike: cuBLAS may choose other kernels for other row counts.) Rows
// without a sampled pick (greedy rows, padding) carry top_p 0, which SampleRows rejects before
// it reads the row (token -1), so a greedy step pays one near-empty launch, and the sampling
// parameters are uploaded only when a row needs them. Separate sampled graphs would double the
// graphs recorded at start-up for that launch's saving.
//
// Where the model allows it (DecodeGraphModel::verify_rows), a sequence may instead bring the
// 1 + k rows of a verification of drafts (SequenceStep::row_sampling, every row with parameters
// as above): each row becomes a row of the bucket of its own (its position, its slot, the
// sequence's block table, context up to and including itself), picked like a decode row. The
// bucket is then the batch's rows, not its sequences. Where the model writes the rows' hidden
// states (DecodeGraphModel::hidden_width), sequences may want them (SequenceStep::return_hidden):
// the real rows' are copied back with the picks.
//
// Rows may carry logit adjustments (logit_bias, min_tokens, penalties:
// SamplingParams::adjustments). A batch with any gets graphs of their own, whose forward picks
// from an adjusted copy of the logits (DecodeGraphInputs::adjustments, a fixed buffer with room
// for a power of two of entries, at least 1024, and a device count of those used) and gives the
// raw rows' logprobs of the picks, as DeviceSampler does; a step with more entries than its graph
// has room for records a larger one. Those graphs (recorded on first use) come in two variants:
// for batches with sampled rows, and for greedy ones, which make no sampled picks and so pay
// nothing for them (there the raw logprob of a sampled pick would cost a second pass over the
// rows).
//
// The runner owns the padding and the fixed device addresses: per bucket, the inputs
// (ids | positions | slots | token_seq | context_len [bucket each] | counted rows [1] |
// block tables [bucket, max_blocks]), the sampling parameters (RowSamplingParams [bucket]) and
// outputs (greedy token int32 | greedy logprob float | sampled token int32 | sampled logprob
// float | sampled pick's raw logprob float [bucket each]; the picks of a step without sampled
// rows are the first two alone copied back).
// max_blocks, the tables' width, is a table class's: 16 blocks x 4^class, the last class the
// longest table the cache and the model allow (MaxBlocks); a step takes the narrowest class that
// holds its longest table, and each class has graphs of its own. A model may upload
// inputs of its own per step (DecodeGraphModel::prepare) into buffers it keeps per bucket.
// Padding rows decode token 0 at position 0 of a cache block the runner keeps for them, seeing
// only themselves. The model's part is one device-only forward over those inputs
// (DecodeGraphModel::forward), run eagerly on first use (which also loads every kernel), then
// recorded and replayed. A backend whose attention kernel depends on the context
// (DecodeGraphModel::context_break > 0) gets two graphs per bucket, for batches whose longest
// context is up to the break and above it.
#ifndef DEEPINFER_WORKER_MODEL_DECODE_GRAPH_RUNNER_H_
#define DEEPINFER_WORKER_MODEL_DECODE_GRAPH_RUNNER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/step_batch.h"

namespace deepinfer {

struct DecodeGraphOptions {
  bool enabled = true;      // --cuda-graphs
  int64_t max_batch = 256;  // --cuda-graph-max-batch: the largest bucket (>= 1)
  // false: run the padded per-bucket decode path without recording it (tests: tells the effect
  // of padding apart from that of replay).
  bool replay = true;
};

// Batch sizes decode steps are padded to: 1 2 4 8 16 24 32 48 64 96 128 160 192 256, then
// steps of 64, those <= max_batch, and max_batch itself last.
std::vector<int64_t> DecodeGraphBuckets(int64_t max_batch);

// One bucket's device inputs and outputs, at fixed addresses for as long as its graph lives.
struct DecodeGraphInputs {
  int64_t rows = 0;  // the bucket
  const int32_t* ids = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* slots = nullptr;  // cache slot (block * block_size + offset) per row
  const int32_t* token_seq = nullptr;
  const int32_t* context_len = nullptr;
  // Real rows x DecodeGraphModel::counted_per_row (EPLB counts only real rows' routing).
  const int32_t* counted = nullptr;
  const int32_t* block_tables = nullptr;  // [rows, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  // Longest context any row may have in this graph (the context class's bound).
  int32_t max_context_hint = 0;
  KvBlockPool* cache = nullptr;
  int32_t* out_tokens = nullptr;  // [rows], greedy pick per row
  float* out_logprobs = nullptr;  // [rows]
  // [rows]: each row's sampled pick (Backend::SampleRows) with these parameters; rows without
  // one have top_p 0 (SampleRows gives them token -1 without reading the row). Null: the graph
  // makes no sampled picks (an adjusted graph for greedy batches).
  const RowSamplingParams* sampling = nullptr;
  int32_t* out_sampled_tokens = nullptr;  // [rows]
  float* out_sampled_logprobs = nullptr;  // [rows], SampleRows' own
  // [rows], graphs with adjustments: the raw row's logprob of the sampled pick (made from the
  // adjusted copy).
  float* out_sampled_raw_logprobs = nullptr;
  // [rows, DecodeGraphModel::hidden_width]: each row's hidden state (StepOutput::hidden's row);
  // null where the model has hidden_width 0.
  float* out_hidden = nullptr;
  // Graphs for batches with logit adjustments: room for adjustment_capacity entries (rows are
  // the bucket's rows), *num_adjustments of them used; the picks are made from the adjusted rows
  // and their logprobs are the raw rows'. adjustment_capacity 0: no adjustments.
  const LogitAdjustment* adjustments = nullptr;
  const int32_t* num_adjustments = nullptr;
  int64_t adjustment_capacity = 0;
};

// What the runner needs from the architecture.
struct DecodeGraphModel {
  // The device-only decode step over `in` (embedding to the picks, DecodeGraphPick, with in's
  // logit adjustments when it has room for them): what is recorded. Must not touch the host.
  // FAILED_PRECONDITION: it cannot run this bucket on the device (the bucket then runs the general
  // path from then on); other errors are the step's.
  std::function<absl::Status(const DecodeGraphInputs& in)> forward;
  // Whether the path applies at all now (null: always).
  std::function<bool()> available;
  // Optional: the model's own inputs of a step, made on the host once the batch qualifies and
  // before `forward` runs or is replayed (e.g. index arrays uploaded into a buffer the forward
  // reads at a fixed address per bucket; the upload is ordered after the previous step's ops).
  // false: the batch takes the general path (nothing changed); an error is the step's.
  std::function<absl::StatusOr<bool>(const std::vector<SequenceStep>& batch, int64_t bucket,
                                     KvBlockPool* cache)>
      prepare;
  // The backend's context break for a bucket (0: one graph per bucket; null: 0).
  std::function<int32_t(int64_t bucket)> context_break;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;  // bounds the block tables' width (0: the cache's size)
  int64_t counted_per_row = 0;          // DecodeGraphInputs::counted = real rows x this
  // Whether a sequence's verification rows may be rows of a bucket (see the top comment): the
  // forward's attention must write every row's cache entries before any row reads the cache,
  // and the model must keep no per-sequence state a row updates.
  bool verify_rows = false;
  // > 0: `forward` writes every row's hidden state (DecodeGraphInputs::out_hidden, this wide),
  // and steps that want hidden states take this path.
  int64_t hidden_width = 0;
};

// The picks a DecodeGraphModel::forward makes from its logits ([in.rows, vocab], device memory)
// into in's outputs: GreedySampleRows and, where in.sampling is set, SampleRows over every row.
// With room for adjustments, both pick from `adjusted` ([in.rows, vocab] device memory,
// overwritten with the adjusted copy of the logits), and TokenLogprobRows gives the raw rows'
// logprobs of the picks (out_logprobs, out_sampled_raw_logprobs); `adjusted` is unused
// otherwise.
void DecodeGraphPick(Backend* backend, const DecodeGraphInputs& in, int64_t vocab,
                     const float* logits, float* adjusted);

class DecodeGraphRunner {
 public:
  DecodeGraphRunner(Backend* backend, DecodeGraphModel model);
  ~DecodeGraphRunner();  // Drop()
  DecodeGraphRunner(const DecodeGraphRunner&) = delete;
  DecodeGraphRunner& operator=(const DecodeGraphRunner&) = delete;

  // Replaces the options: drops the graphs and forgets buckets that failed.
  void SetOptions(const DecodeGraphOptions& options);
  const DecodeGraphOptions& options() const { return options_; }
  // Drops the recorded graphs (waiting for them to finish): the model's addresses they hold
  // changed (new expert tables, other fused ops).
  void Drop();

  // The step through a bucket's graph, or nullopt when the batch does not qualify (the caller
  // runs its general path, which also reports malformed input).
  std::optional<absl::StatusOr<StepOutput>> Run(const std::vector<SequenceStep>& batch,
                                                KvBlockPool* cache);

  // Takes the padding rows' block from `cache` now, where the path may apply (enabled, a backend
  // that can record), so that Run takes none from it later.
  void Prepare(KvBlockPool* cache);
  // Start-up: takes the padding rows' block from `cache` and records the graphs of every bucket
  // and table class up to the longest table the cache allows, at most 65536 positions (both context
  // classes where the backend has a break and the class's tables hold contexts above it; the
  // graphs of batches without logit adjustments, greedy and sampled rows alike) by running each
  // once on padding rows only, which write nothing but the padding block. Returns the graphs
  // recorded; 0 where the path does not apply (disabled, a backend that cannot record,
  // DecodeGraphModel::available false). A bucket the device path refuses is left to the general
  // path, as in Run. RESOURCE_EXHAUSTED without a free block; the step's errors. Run then replays
  // them, and takes no block from the cache it was given here.
  absl::StatusOr<int> Capture(KvBlockPool* cache);

  // Steps that ran on the padded bucket path (replayed or, with replay off, eager) and graphs
  // recorded so far.
  int64_t steps() const { return steps_; }
  int64_t graphs_recorded() const { return graphs_recorded_; }

 private:
  struct Graph;
  // Graphs per (bucket, variant): variant bit 0 is the context class (0 for batches whose
  // longest context is at most the context break for the bucket, the only class where it is 0;
  // 1 above), bit 1 set for graphs that apply logit adjustments, bit 2 for adjusted graphs that
  // also make sampled picks (graphs without adjustments always do), the bits above it the table
  // class (TableWidth).
  using GraphKey = std::pair<int64_t, int32_t>;
  DecodeGraphInputs InputsOf(const Graph& g) const;
  // The longest block table the cache (and the model) allows.
  int32_t MaxBlocks(const KvBlockPool& cache) const;
  // Makes the graphs' addresses those of `cache` (dropping graphs of another one) and takes the
  // padding block; false when the cache has no free block.
  bool BindCache(KvBlockPool* cache);
  // The block tables' width of a table class (kMinTableBlocks x 4^class, at most the bound
  // cache's MaxBlocks), and the narrowest class at least `needed` blocks wide.
  int32_t TableWidth(int32_t table_class) const;
  int32_t TableClassOf(int64_t needed) const;
  // DecodeGraphModel::prepare where the model has it (true without).
  absl::StatusOr<bool> PrepareModel(const std::vector<SequenceStep>& batch, int64_t bucket,
                                    KvBlockPool* cache);
  // A graph's buffers for `key`, with room for num_adjustments logit adjustments.
  std::unique_ptr<Graph> NewGraph(const GraphKey& key, int64_t num_adjustments);
  // One row of a bucket: row `row` of sequence `seq` of the batch.
  struct Row {
    int32_t seq = 0;
    int32_t row = 0;
  };
  // The batch's rows (then padding) into g's inputs, uploaded; the rows' sampling parameters
  // where any row is sampled or the buffer holds a sampled row's from an earlier step.
  void UploadInputs(Graph& g, const std::vector<SequenceStep>& batch, const std::vector<Row>& rows);
  // Replays g (or runs it eagerly before it is recorded) and returns its outputs on the host
  // (the greedy picks, and with `sampled` the sampled ones too), with the first hidden_rows
  // rows' hidden states in *hidden (where the model writes them); CANCELLED when the device
  // path refused the bucket (marked failed, g dropped).
  absl::StatusOr<std::vector<int32_t>> RunGraph(const GraphKey& key, Graph* g, bool sampled = false,
                                                int64_t hidden_rows = 0,
                                                std::vector<float>* hidden = nullptr);
  // Records g's ops for replay; false (marked failed, g dropped) when that fails.
  bool Record(const GraphKey& key, Graph* g);

  Backend* const backend_;
  const DecodeGraphModel model_;
  DecodeGraphOptions options_;
  std::vector<int64_t> buckets_;
  std::map<GraphKey, std::unique_ptr<Graph>> graphs_;
  std::set<GraphKey> failed_;  // recording or the device path failed: general path from then on
  // Graphs hold the cache's addresses and one of its blocks for padding rows: valid for the
  // cache they were made with.
  uint64_t cache_id_ = 0;
  KvBlockPool* cache_ = nullptr;
  int32_t padding_block_ = -1;
  int32_t table_limit_ = 0;  // MaxBlocks of the bound cache
  static constexpr int64_t kMinTableBlocks = 16;
  static constexpr int64_t kStartUpPositions = 65536;  // Capture's widest table class
  int64_t steps_ = 0;
  int64_t graphs_recorded_ = 0;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_DECODE_GRAPH_RUNNER_H_
