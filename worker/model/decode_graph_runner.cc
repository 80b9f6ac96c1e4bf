// DecodeGraphRunner: buckets, padding, context classes, record and replay.
#include "worker/model/decode_graph_runner.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"

namespace deepinfer {
namespace {

// Words per row of a bucket's outputs: greedy token and logprob, sampled token, logprob and raw
// logprob.
constexpr int64_t kOutputWords = 5;

// The parameters of a row without a sampled pick: top_p 0, which SampleRows rejects (token -1)
// before it reads the row.
RowSamplingParams SkipRow() {
  RowSamplingParams p;
  p.top_p = 0.0f;
  return p;
}

}  // namespace

void DecodeGraphPick(Backend* backend, const DecodeGraphInputs& in, int64_t vocab,
                     const float* logits, float* adjusted) {
  const int64_t B = in.rows, V = vocab;
  if (in.adjustment_capacity > 0) {
    // The picks from an adjusted copy, their logprobs from the raw rows (as DeviceSampler does;
    // a sampled row without adjustments keeps SampleRows' own, its copy being the raw row).
    backend->CopyDeviceToDevice(logits, B * V * sizeof(float), adjusted);
    backend->AdjustLogits(B, V, adjusted, in.adjustment_capacity, in.adjustments,
                          in.num_adjustments);
    backend->GreedySampleRows(B, V, adjusted, in.out_tokens, in.out_logprobs);
    backend->TokenLogprobRows(B, V, logits, in.out_tokens, in.out_logprobs);
    if (in.sampling != nullptr) {
      backend->SampleRows(B, V, adjusted, in.sampling, in.out_sampled_tokens,
                          in.out_sampled_logprobs);
      backend->TokenLogprobRows(B, V, logits, in.out_sampled_tokens, in.out_sampled_raw_logprobs);
    }
    return;
  }
  backend->GreedySampleRows(B, V, logits, in.out_tokens, in.out_logprobs);
  backend->SampleRows(B, V, logits, in.sampling, in.out_sampled_tokens, in.out_sampled_logprobs);
}

// Inputs and outputs of one bucket's decode step stay at fixed device addresses: the recorded
// ops read and write exactly these (layout: see the header's top comment).
struct DecodeGraphRunner::Graph {
  int64_t bucket = 0;
  int32_t context_class = 0;
  int32_t max_context_hint = 0;  // the context class's bound
  int32_t max_blocks = 0;        // the block tables' width (the table class's)
  std::unique_ptr<DeviceBuffer> inputs, outputs;
  std::unique_ptr<DeviceBuffer> hidden;  // [bucket, hidden_width] where the model writes them
  std::vector<int32_t> host_inputs;      // staging for the one upload per step
  // [bucket] sampling parameters (null: the graph makes no sampled picks); sampling_all_skip:
  // the buffer holds no row's sampled pick (every row top_p 0), so a step without sampled rows
  // need not upload it.
  std::unique_ptr<DeviceBuffer> sampling;
  std::vector<RowSamplingParams> host_sampling;
  bool sampling_all_skip = false;
  // Graphs with logit adjustments: room for adjustment_capacity entries, then the count.
  int64_t adjustment_capacity = 0;
  std::unique_ptr<DeviceBuffer> adjustments, num_adjustments;
  std::vector<LogitAdjustment> host_adjustments;
  int32_t host_num_adjustments = 0;
  std::unique_ptr<CapturedOps> ops;  // null until recorded (or with replay off)
};

std::vector<int64_t> DecodeGraphBuckets(int64_t max_batch) {
  std::vector<int64_t> buckets;
  for (int64_t b : {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256}) {
    if (b < max_batch) buckets.push_back(b);
  }
  for (int64_t b = 320; b < max_batch; b += 64) buckets.push_back(b);
  if (max_batch >= 1) buckets.push_back(max_batch);
  return buckets;
}

DecodeGraphRunner::DecodeGraphRunner(Backend* backend, DecodeGraphModel model)
    : backend_(backend), model_(std::move(model)) {
  buckets_ = DecodeGraphBuckets(options_.max_batch);
}

DecodeGraphRunner::~DecodeGraphRunner() { Drop(); }

void DecodeGraphRunner::SetOptions(const DecodeGraphOptions& options) {
  options_ = options;
  buckets_ = DecodeGraphBuckets(options.max_batch);
  Drop();
  failed_.clear();
}

void DecodeGraphRunner::Drop() {
  // Recorded ops may still be running: they must finish before their buffers are freed.
  if (!graphs_.empty()) backend_->Synchronize();
  graphs_.clear();
}

DecodeGraphInputs DecodeGraphRunner::InputsOf(const Graph& g) const {
  const int64_t B = g.bucket;
  const int32_t* in = g.inputs->as<int32_t>();
  DecodeGraphInputs d;
  d.rows = B;
  d.ids = in;
  d.positions = in + B;
  d.slots = in + 2 * B;
  d.token_seq = in + 3 * B;
  d.context_len = in + 4 * B;
  d.counted = in + 5 * B;
  d.block_tables = in + 5 * B + 1;
  d.max_blocks_per_seq = g.max_blocks;
  d.max_context_hint = g.max_context_hint;
  d.cache = cache_;
  int32_t* out = g.outputs->as<int32_t>();
  d.out_tokens = out;
  d.out_logprobs = reinterpret_cast<float*>(out + B);
  if (g.sampling != nullptr) {
    d.sampling = g.sampling->as<RowSamplingParams>();
    d.out_sampled_tokens = out + 2 * B;
    d.out_sampled_logprobs = reinterpret_cast<float*>(out + 3 * B);
  }
  if (g.hidden != nullptr) d.out_hidden = g.hidden->as<float>();
  if (g.adjustment_capacity > 0) {
    d.adjustments = g.adjustments->as<LogitAdjustment>();
    d.num_adjustments = g.num_adjustments->as<int32_t>();
    d.adjustment_capacity = g.adjustment_capacity;
    if (g.sampling != nullptr) d.out_sampled_raw_logprobs = reinterpret_cast<float*>(out + 4 * B);
  }
  return d;
}

bool DecodeGraphRunner::BindCache(KvBlockPool* cache) {
  // Graphs hold the cache's addresses and a block of it for padding rows: a new cache means new
  // graphs.
  if (cache_id_ == cache->id()) return true;
  Drop();
  cache_id_ = 0;
  cache_ = nullptr;
  padding_block_ = -1;
  table_limit_ = 0;
  absl::StatusOr<std::vector<int32_t>> block = cache->Allocate(1);
  if (!block.ok()) return false;
  cache_id_ = cache->id();
  cache_ = cache;
  padding_block_ = (*block)[0];
  table_limit_ = MaxBlocks(*cache);
  return true;
}

int32_t DecodeGraphRunner::TableWidth(int32_t table_class) const {
  // The tables are staged and uploaded every step, so their width is paid per step: a step
  // takes the narrowest class that holds its longest table instead of every step carrying the
  // longest table the cache could hold (a model of 2^20 positions in blocks of 16: 65536 entries
  // a row). Classes grow 4x from kMinTableBlocks, the last one the limit.
  int64_t width = kMinTableBlocks;
  for (int32_t c = 0; c < table_class && width < table_limit_; ++c) width *= 4;
  return static_cast<int32_t>(std::max<int64_t>(1, std::min<int64_t>(width, table_limit_)));
}

int32_t DecodeGraphRunner::TableClassOf(int64_t needed) const {
  int32_t c = 0;
  while (TableWidth(c) < needed && TableWidth(c) < table_limit_) ++c;
  return c;
}

absl::StatusOr<bool> DecodeGraphRunner::PrepareModel(const std::vector<SequenceStep>& batch,
                                                     int64_t bucket, KvBlockPool* cache) {
  if (!model_.prepare) return true;
  return model_.prepare(batch, bucket, cache);
}

int32_t DecodeGraphRunner::MaxBlocks(const KvBlockPool& cache) const {
  // The longest sequence the cache (and the model) allows.
  const int32_t bs = cache.block_size();
  int32_t max_blocks = cache.num_blocks();
  if (model_.max_position_embeddings > 0) {
    max_blocks = std::min<int32_t>(
        max_blocks, static_cast<int32_t>((model_.max_position_embeddings + bs - 1) / bs));
  }
  return max_blocks;
}

std::unique_ptr<DecodeGraphRunner::Graph> DecodeGraphRunner::NewGraph(const GraphKey& key,
                                                                      int64_t num_adjustments) {
  const int64_t bucket = key.first;
  const int32_t context_class = key.second & 1;
  const int32_t context_break = model_.context_break ? model_.context_break(bucket) : 0;
  const int32_t bs = cache_->block_size();
  auto g = std::make_unique<Graph>();
  g->bucket = bucket;
  g->context_class = context_class;
  g->max_blocks = TableWidth(key.second >> 3);
  // Class 0 under a break: the break; otherwise the longest context the graph can see.
  g->max_context_hint =
      context_break > 0 && context_class == 0
          ? context_break
          : static_cast<int32_t>(std::min<int64_t>(static_cast<int64_t>(g->max_blocks) * bs,
                                                   std::numeric_limits<int32_t>::max()));
  const size_t ints = 5 * bucket + 1 + bucket * static_cast<size_t>(g->max_blocks);
  g->host_inputs.assign(ints, 0);
  g->inputs = backend_->Allocate(ints * sizeof(int32_t));
  g->outputs = backend_->Allocate(kOutputWords * bucket * sizeof(int32_t));
  // Graphs without adjustments make sampled picks always, adjusted ones in their sampled variant.
  if ((key.second & 2) == 0 || (key.second & 4) != 0) {
    g->sampling = backend_->Allocate(bucket * sizeof(RowSamplingParams));
    g->host_sampling.assign(bucket, SkipRow());
  }
  if (model_.hidden_width > 0) {
    g->hidden = backend_->Allocate(bucket * model_.hidden_width * sizeof(float));
  }
  if (num_adjustments > 0) {
    int64_t capacity = 1024;
    while (capacity < num_adjustments) capacity *= 2;
    g->adjustment_capacity = capacity;
    g->adjustments = backend_->Allocate(capacity * sizeof(LogitAdjustment));
    g->num_adjustments = backend_->Allocate(sizeof(int32_t));
  }
  return g;
}

void DecodeGraphRunner::UploadInputs(Graph& g, const std::vector<SequenceStep>& batch,
                                     const std::vector<Row>& rows) {
  const int64_t n = static_cast<int64_t>(rows.size());
  const int32_t bs = cache_->block_size();
  const int32_t max_blocks = g.max_blocks;
  const int64_t B = g.bucket;
  int32_t* in = g.host_inputs.data();
  int32_t* tables = in + 5 * B + 1;
  const int32_t pad_slot = padding_block_ * bs;
  for (int64_t i = 0; i < B; ++i) {
    int32_t* row = tables + i * max_blocks;
    std::fill(row, row + max_blocks, padding_block_);
    in[3 * B + i] = static_cast<int32_t>(i);  // token_seq
    if (i < n) {
      const SequenceStep& s = batch[rows[i].seq];
      const int64_t pos = s.position_offset + rows[i].row;
      const int64_t used =
          std::min<int64_t>(static_cast<int64_t>(s.block_table.size()), max_blocks);
      std::copy(s.block_table.begin(), s.block_table.begin() + used, row);
      in[i] = s.tokens[rows[i].row];
      in[B + i] = static_cast<int32_t>(pos);
      in[2 * B + i] = s.block_table[pos / bs] * bs + static_cast<int32_t>(pos % bs);
      in[4 * B + i] = static_cast<int32_t>(pos + 1);
    } else {
      // Padding: token 0 at position 0 of the reserved block, seeing only itself.
      in[i] = 0;
      in[B + i] = 0;
      in[2 * B + i] = pad_slot;
      in[4 * B + i] = 1;
    }
  }
  in[5 * B] = static_cast<int32_t>(n * model_.counted_per_row);  // real rows only
  backend_->CopyToDevice(in, g.host_inputs.size() * sizeof(int32_t), g.inputs->data());
  if (g.adjustment_capacity > 0) {
    g.host_adjustments.clear();
    for (int64_t i = 0; i < n; ++i) {
      const SequenceStep& s = batch[rows[i].seq];
      const SamplingParams& p = s.row_sampling.empty() ? *s.sampling : s.row_sampling[rows[i].row];
      for (LogitAdjustment a : p.adjustments) {
        a.row = static_cast<int32_t>(i);
        g.host_adjustments.push_back(a);
      }
    }
    g.host_num_adjustments = static_cast<int32_t>(g.host_adjustments.size());
    backend_->CopyToDevice(g.host_adjustments.data(),
                           g.host_adjustments.size() * sizeof(LogitAdjustment),
                           g.adjustments->data());
    backend_->CopyToDevice(&g.host_num_adjustments, sizeof(int32_t), g.num_adjustments->data());
  }
  if (g.sampling == nullptr) return;
  bool any_sampled = false;
  for (int64_t i = 0; i < n; ++i) {
    const SequenceStep& s = batch[rows[i].seq];
    const SamplingParams& p = s.row_sampling.empty() ? *s.sampling : s.row_sampling[rows[i].row];
    g.host_sampling[i] = p.temperature > 0.0f
                             ? ToRowSamplingParams(p, s.position_offset + rows[i].row + 1)
                             : SkipRow();
    any_sampled = any_sampled || p.temperature > 0.0f;
  }
  std::fill(g.host_sampling.begin() + n, g.host_sampling.end(), SkipRow());
  if (any_sampled || !g.sampling_all_skip) {
    backend_->CopyToDevice(g.host_sampling.data(), B * sizeof(RowSamplingParams),
                           g.sampling->data());
    g.sampling_all_skip = !any_sampled;
  }
}

absl::StatusOr<std::vector<int32_t>> DecodeGraphRunner::RunGraph(const GraphKey& key, Graph* g,
                                                                 bool sampled, int64_t hidden_rows,
                                                                 std::vector<float>* hidden) {
  const DecodeGraphInputs inputs = InputsOf(*g);
  if (g->ops != nullptr) {
    if (absl::Status st = g->ops->Replay(); !st.ok()) return st;
  } else {
    // First use (or replay off): run the same ops eagerly. This also loads every kernel once
    // before anything is recorded.
    absl::Status st = model_.forward(inputs);
    if (!st.ok()) {
      if (st.code() != absl::StatusCode::kFailedPrecondition) return st;
      // The device path refused (e.g. routed experts it cannot run): the layers before it only
      // rewrote this step's cache entries, which the general path writes again.
      LOG(WARNING) << "decode graphs: batch bucket " << key.first << " (context class "
                   << (key.second & 1) << ") runs eagerly: " << st;
      failed_.insert(key);
      graphs_.erase(key);
      return absl::CancelledError("the device path refused this bucket");
    }
  }
  std::vector<int32_t> out_host((sampled ? kOutputWords : 2) * g->bucket);
  backend_->CopyToHost(g->outputs->data(), out_host.size() * sizeof(int32_t), out_host.data());
  if (hidden != nullptr && hidden_rows > 0 && g->hidden != nullptr) {
    hidden->resize(hidden_rows * model_.hidden_width);
    backend_->CopyToHost(g->hidden->data(), hidden->size() * sizeof(float), hidden->data());
  }
  if (absl::Status st = backend_->status(); !st.ok()) return st;
  return out_host;
}

bool DecodeGraphRunner::Record(const GraphKey& key, Graph* g) {
  // Record for the next steps (nothing runs now).
  const int64_t B = g->bucket;
  const int32_t context_class = key.second & 1;
  const DecodeGraphInputs inputs = InputsOf(*g);
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<DeviceMemoryInfo> before = backend_->MemoryInfo();
  absl::StatusOr<std::unique_ptr<CapturedOps>> ops =
      backend_->Capture([this, inputs] { return model_.forward(inputs); }, CaptureOptions{B});
  if (!ops.ok()) {
    LOG(WARNING) << "decode graphs: recording batch bucket " << B << " (context class "
                 << context_class << ") failed, it runs eagerly: " << ops.status();
    failed_.insert(key);
    graphs_.erase(key);
    return false;
  }
  g->ops = std::move(*ops);
  ++graphs_recorded_;
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  absl::StatusOr<DeviceMemoryInfo> after = backend_->MemoryInfo();
  std::string mem;
  if (before.ok() && after.ok()) {
    mem =
        absl::StrFormat(", device memory in use +%.1f MiB",
                        (static_cast<double>(before->free_bytes) - after->free_bytes) / (1 << 20));
  }
  LOG(INFO) << absl::StrFormat(
      "decode graph for batch bucket %d (context class %d, attention sees <= %d positions) "
      "recorded in %.1f ms%s",
      B, context_class, g->max_context_hint, ms, mem);
  return true;
}

void DecodeGraphRunner::Prepare(KvBlockPool* cache) {
  if (!options_.enabled || buckets_.empty() || !backend_->SupportsCapture()) return;
  BindCache(cache);
}

absl::StatusOr<int> DecodeGraphRunner::Capture(KvBlockPool* cache) {
  if (!options_.enabled || buckets_.empty() || !backend_->SupportsCapture()) return 0;
  if (model_.available && !model_.available()) return 0;
  if (!BindCache(cache)) {
    return absl::ResourceExhaustedError(
        "decode graphs: no free KV cache block for the padding rows");
  }
  const int32_t bs = cache->block_size();
  int recorded = 0;
  // Table classes up to the longest table, or up to kStartUpPositions: wider classes (whose
  // context bound may size a model's workspaces, e.g. V4's indexer candidates) are recorded on
  // first use.
  const int32_t table_classes =
      TableClassOf(std::min<int64_t>(table_limit_, (kStartUpPositions + bs - 1) / bs)) + 1;
  for (int32_t table_class = 0; table_class < table_classes; ++table_class) {
    const int64_t positions = static_cast<int64_t>(TableWidth(table_class)) * bs;
    for (int64_t bucket : buckets_) {
      const int32_t context_break = model_.context_break ? model_.context_break(bucket) : 0;
      for (int32_t context_class : {0, 1}) {
        // Contexts above the break need tables that hold them.
        if (context_class == 1 && (context_break <= 0 || positions <= context_break)) continue;
        const GraphKey key(bucket, context_class | (table_class << 3));
        if (failed_.count(key)) continue;
        std::unique_ptr<Graph>& slot = graphs_[key];
        if (slot != nullptr && slot->ops != nullptr) continue;
        absl::StatusOr<bool> prepared = PrepareModel({}, bucket, cache);
        if (!prepared.ok()) return prepared.status();
        if (!*prepared) continue;
        if (slot == nullptr) slot = NewGraph(key, 0);
        Graph* g = slot.get();
        UploadInputs(*g, {}, {});  // padding rows only: they write nothing but the padding block
        absl::StatusOr<std::vector<int32_t>> out = RunGraph(key, g);
        if (!out.ok()) {
          if (out.status().code() == absl::StatusCode::kCancelled) continue;
          return out.status();
        }
        if (!options_.replay) continue;
        if (Record(key, g)) ++recorded;
      }
    }
  }
  return recorded;
}

std::optional<absl::StatusOr<StepOutput>> DecodeGraphRunner::Run(
    const std::vector<SequenceStep>& batch, KvBlockPool* cache) {
  const int64_t n = static_cast<int64_t>(batch.size());
  if (!options_.enabled || n == 0 || buckets_.empty() || !backend_->SupportsCapture()) {
    return std::nullopt;
  }
  if (model_.available && !model_.available()) return std::nullopt;
  const int32_t bs = cache->block_size();
  const int32_t max_blocks = MaxBlocks(*cache);
  int64_t num_adjustments = 0;
  int64_t longest = 1;      // blocks the batch's tables need
  int64_t max_context = 1;  // padding rows see one position
  bool hidden = false;
  std::vector<Row> rows;
  bool sampled = false;  // any row with temperature > 0
  // A row's pick: on the device without top logprobs, parameters the general path takes (those
  // it refuses go there, which names what is wrong).
  auto pickable = [&](const SamplingParams& p) {
    if (p.num_logprobs != 0) return false;
    if (!Sampler::Validate(p, model_.vocab_size).ok()) return false;
    num_adjustments += static_cast<int64_t>(p.adjustments.size());
    sampled = sampled || p.temperature > 0.0f;
    return true;
  };
  for (int64_t i = 0; i < n; ++i) {
    const SequenceStep& s = batch[i];
    if (s.return_logits || s.fill_allowed_tokens) return std::nullopt;
    if (s.return_hidden) {
      if (model_.hidden_width <= 0) return std::nullopt;
      hidden = true;
    }
    const int64_t k = static_cast<int64_t>(s.tokens.size());
    if (!s.row_sampling.empty()) {
      if (!model_.verify_rows || s.sampling.has_value() || !s.all_logits ||
          static_cast<int64_t>(s.row_sampling.size()) != k) {
        return std::nullopt;
      }
      for (const SamplingParams& p : s.row_sampling) {
        if (!pickable(p)) return std::nullopt;
      }
    } else if (k != 1 || !s.sampling.has_value() || !pickable(*s.sampling)) {
      return std::nullopt;
    }
    // Malformed input goes the general way, which names what is wrong.
    const int64_t needed = (s.position_offset + k - 1) / bs + 1;
    if (s.position_offset < 0 || static_cast<int64_t>(s.block_table.size()) < needed ||
        needed > max_blocks) {
      return std::nullopt;
    }
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= model_.vocab_size) return std::nullopt;
    }
    for (int64_t b = 0; b < needed; ++b) {
      if (s.block_table[b] < 0 || s.block_table[b] >= cache->num_blocks()) return std::nullopt;
    }
    longest = std::max(longest, needed);
    max_context = std::max(max_context, s.position_offset + k);
    for (int64_t j = 0; j < k; ++j) {
      rows.push_back({static_cast<int32_t>(i), static_cast<int32_t>(j)});
    }
  }
  const int64_t R = static_cast<int64_t>(rows.size());
  if (R > buckets_.back()) return std::nullopt;
  const int64_t bucket = *std::lower_bound(buckets_.begin(), buckets_.end(), R);
  // The context class: the backend's attention may pick its kernel by the longest context, which
  // a recording cannot see, so batches up to the break and above it get a graph each.
  const int32_t context_break = model_.context_break ? model_.context_break(bucket) : 0;
  const int32_t context_class = context_break > 0 && max_context > context_break ? 1 : 0;
  if (!BindCache(cache)) return std::nullopt;  // full: try again with the next step
  // Adjusted graphs come in a variant without sampled picks (bit 2 clear), which greedy batches
  // take: their picks then cost no more than without sampling.
  const int32_t adjusted = num_adjustments > 0 ? (sampled ? 2 | 4 : 2) : 0;
  const GraphKey key(bucket, context_class | adjusted | (TableClassOf(longest) << 3));
  if (failed_.count(key)) return std::nullopt;
  if (num_adjustments > std::numeric_limits<int32_t>::max()) return std::nullopt;
  absl::StatusOr<bool> prepared = PrepareModel(batch, bucket, cache);
  if (!prepared.ok()) return absl::StatusOr<StepOutput>(prepared.status());
  if (!*prepared) return std::nullopt;

  std::unique_ptr<Graph>& slot = graphs_[key];
  if (slot != nullptr && num_adjustments > slot->adjustment_capacity) {
    // More entries than this graph has room for: a larger one replaces it.
    backend_->Synchronize();
    slot.reset();
  }
  const bool first_use = slot == nullptr;
  if (first_use) slot = NewGraph(key, num_adjustments);
  Graph& g = *slot;
  UploadInputs(g, batch, rows);
  std::vector<float> host_hidden;
  absl::StatusOr<std::vector<int32_t>> outputs =
      RunGraph(key, &g, sampled, hidden ? R : 0, hidden ? &host_hidden : nullptr);
  if (!outputs.ok()) {
    if (outputs.status().code() == absl::StatusCode::kCancelled) return std::nullopt;
    return absl::StatusOr<StepOutput>(outputs.status());
  }
  ++steps_;
  if (first_use && options_.replay) Record(key, &g);
  const std::vector<int32_t>& out_host = *outputs;
  const int64_t B = bucket;
  const int64_t W = model_.hidden_width;

  StepOutput out;
  out.logits.resize(n);
  out.sampled.resize(n);
  out.row_sampled.resize(n);
  out.hidden.resize(n);
  auto word_float = [&](int64_t w) {
    float f;
    std::memcpy(&f, &out_host[w], sizeof(f));
    return f;
  };
  for (int64_t r = 0; r < R; ++r) {
    const SequenceStep& s = batch[rows[r].seq];
    const SamplingParams& p = s.row_sampling.empty() ? *s.sampling : s.row_sampling[rows[r].row];
    SampledToken picked;
    if (p.temperature > 0.0f) {
      // The op DeviceSampler samples such a row with; the raw row's logprob after adjustments.
      picked.token = out_host[2 * B + r];
      picked.logprob = word_float((p.adjustments.empty() ? 3 : 4) * B + r);
      if (picked.token < 0 || picked.token >= model_.vocab_size) {
        return absl::StatusOr<StepOutput>(absl::InternalError(absl::StrCat(
            "decode graphs: row ", r, " got sampled token ", picked.token, " from the device")));
      }
    } else {
      picked.token = out_host[r];
      picked.logprob = word_float(B + r);
    }
    if (s.row_sampling.empty()) {
      out.sampled[rows[r].seq] = std::move(picked);
    } else {
      out.row_sampled[rows[r].seq].push_back(std::move(picked));
    }
    if (s.return_hidden) {
      std::vector<float>& h = out.hidden[rows[r].seq];
      h.insert(h.end(), host_hidden.begin() + r * W, host_hidden.begin() + (r + 1) * W);
    }
  }
  return absl::StatusOr<StepOutput>(std::move(out));
}

}  // namespace deepinfer
