// RunBenchmark implementation: the rank set-up (through BuildRank), the prefill and decode
// phases, the expert-exchange meter of --ranks N, and the text / JSON / CSV reports. Over 800
// lines because the phases share the per-rank state and timers defined only here; the reports
// are the part to move out first.
#include "tools/bench/bench_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/common/pdl.h"
#include "tools/bench/constrained_requests.h"
#include "tools/bench/exchange_meter.h"
#include "tools/bench/mixed_step.h"
#include "tools/bench/parallel_dummy_weight_source.h"
#include "tools/bench/roofline.h"
#include "tools/bench/roofline_v4.h"
#include "worker/backend/backend_factory.h"
#include "worker/backend/bf16.h"
#include "worker/backend/fp8_latent_entry.h"
#include "worker/comm/data_plane.h"
#include "worker/comm/tcp_communicator.h"
#include "worker/device_discovery.h"
#include "worker/engine/memory_plan.h"
#include "worker/engine/rank_builder.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/causal_lm.h"
#include "worker/model/model_loader.h"
#include "worker/model/model_registry.h"
#include "worker/model/model_weights.h"
#ifdef DEEPINFER_WITH_CUDA
#include "worker/backend/cuda/cuda_backend.h"
#endif

namespace deepinfer {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  return v[i];
}

// "dummy:CONFIG.json[@SEED]" -> CONFIG.json and SEED; false if `model` is not a dummy spec.
absl::StatusOr<bool> ParseDummySpec(const std::string& model, std::string* config_path,
                                    uint64_t* seed) {
  if (!absl::StartsWith(model, "dummy:")) return false;
  std::string spec = model.substr(6);
  *seed = 0;
  const size_t at = spec.rfind('@');
  if (at != std::string::npos) {
    if (!absl::SimpleAtoi(spec.substr(at + 1), seed)) {
      return absl::InvalidArgumentError(absl::StrCat("bad dummy seed in '", model, "'"));
    }
    spec = spec.substr(0, at);
  }
  *config_path = spec;
  return true;
}

// The model's config, without its weights.
absl::StatusOr<ModelConfig> ReadConfig(const std::string& model) {
  std::string path;
  uint64_t seed = 0;
  absl::StatusOr<bool> dummy = ParseDummySpec(model, &path, &seed);
  if (!dummy.ok()) return dummy.status();
  return ModelConfig::FromFile(*dummy ? path : model + "/config.json");
}

// Dummy weights through the multi-threaded generator (same values as LoadModel's dummy
// format; with fp8 its projections and MLPs stored FP8 as DeepSeek's FP8 release stores them),
// anything else as LoadModel opens it.
absl::StatusOr<std::unique_ptr<WeightSource>> OpenBenchWeights(const std::string& model,
                                                               int64_t load_threads, bool fp8,
                                                               ModelConfig* config) {
  std::string path;
  uint64_t seed = 0;
  absl::StatusOr<bool> dummy = ParseDummySpec(model, &path, &seed);
  if (!dummy.ok()) return dummy.status();
  if (!*dummy) return OpenWeightSource(model, config);
  auto read = ModelConfig::FromFile(path);
  if (!read.ok()) return read.status();
  *config = std::move(*read);
  return std::unique_ptr<WeightSource>(
      std::make_unique<ParallelDummyWeightSource>(seed, static_cast<int>(load_threads), fp8));
}

// The prompt length of the mixed steps' prompt tokens.
int64_t MixedPromptLength(const BenchConfig& bc) {
  return bc.mixed_prompt_length > 0 ? bc.mixed_prompt_length : bc.context_length;
}

int32_t Argmax(const std::vector<float>& l) {
  return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
}

// Writes uniform values in [-1, 1) over the cache of every layer from first_layer on (all
// blocks): decode then reads a cache of realistic magnitude without prefill steps having
// written it.
void FillCacheRandom(Backend* backend, const KvBlockPool& pool, uint32_t seed,
                     int32_t first_layer = 0) {
  const KvBlockPoolOptions& o = pool.options();
  // Every group of this model's spec has one entry type (PagedLatentSpec).
  const KvCacheGroupSpec& g = o.spec.groups[0];
  if (g.dtype == WeightDType::kFp8E4M3) {
    // Whole entries (codes with their scales: random bytes would hold NaN codes), a chunk of
    // them quantised on the host and copied at shifting entry offsets.
    const int64_t entry = g.EntryBytes();
    const int64_t entries = int64_t{o.num_blocks} * o.block_size;
    const int64_t chunk_entries = std::min<int64_t>(entries, 4096);
    std::vector<uint8_t> chunk(chunk_entries * entry);
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> values(g.latent_dim + g.rope_dim);
    for (int64_t e = 0; e < chunk_entries; ++e) {
      for (float& v : values) v = u(gen);
      QuantizeFp8LatentEntry(values.data(), g.latent_dim, values.data() + g.latent_dim, g.rope_dim,
                             chunk.data() + e * entry);
    }
    for (int32_t layer = first_layer; layer < o.spec.num_layers(); ++layer) {
      char* dst = static_cast<char*>(pool.LayerData(layer));
      for (int64_t done = 0; done < entries;) {
        const int64_t shift = (layer * 7919 + done) % chunk_entries;
        const int64_t n = std::min(entries - done, chunk_entries - shift);
        backend->CopyToDevice(chunk.data() + shift * entry, n * entry, dst + done * entry);
        done += n;
      }
    }
    backend->Synchronize();
    return;
  }
  const size_t per_layer =
      static_cast<size_t>(o.num_blocks) * o.block_size * g.EntryBytes() / WeightDTypeSize(g.dtype);
  const bool bf16 = g.dtype == WeightDType::kBFloat16;
  // One random chunk, copied repeatedly at shifting offsets: enough variety for timing.
  std::vector<float> chunk(std::min<size_t>(per_layer, size_t{1} << 22));
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : chunk) v = u(gen);
  std::vector<uint16_t> chunk16;
  if (bf16) {
    for (float v : chunk) chunk16.push_back(FloatToBf16Bits(v));
  }
  const size_t elem = WeightDTypeSize(g.dtype);
  const char* src = bf16 ? reinterpret_cast<const char*>(chunk16.data())
                         : reinterpret_cast<const char*>(chunk.data());
  for (int32_t layer = first_layer; layer < o.spec.num_layers(); ++layer) {
    char* dst = static_cast<char*>(pool.LayerData(layer));
    for (size_t done = 0; done < per_layer;) {
      const size_t shift = (layer * 7919 + done) % chunk.size();
      const size_t n = std::min(per_layer - done, chunk.size() - shift);
      backend->CopyToDevice(src + shift * elem, n * elem, dst + done * elem);
      done += n;
    }
  }
  backend->Synchronize();
}

std::string Join(const std::vector<int32_t>& v) {
  std::string out;
  for (int32_t t : v) absl::StrAppend(&out, out.empty() ? "" : " ", t);
  return out;
}

// The raw figures of one rank, merged over the ranks by RunBenchmark.
struct RankDecodeTimes {
  std::vector<double> step_seconds;  // timed steps
  int64_t constrained = 0;           // constrained requests (constrained_fraction)
  double mask_fill_seconds = 0;      // host time filling their masks, summed over timed steps
  std::vector<int32_t> seq0_tokens;
  ExchangeCounts exchange;                                      // summed over the timed steps
  std::vector<double> all_to_all_seconds, synced_step_seconds;  // per synchronised step
  // compare_eager_decode: output_len more steps of the same sequences with graphs off.
  std::vector<double> eager_step_seconds;
  // compare_unfused_decode: output_len more steps with fused ops off.
  std::vector<double> unfused_step_seconds;
  // compare_pdl_off_decode: output_len more steps with PDL off.
  std::vector<double> pdl_off_step_seconds;
  // speculative_tokens > 0: at one position, the timed plain decode steps, verify steps and
  // draft-head calls.
  int64_t speculative_position = 0;
  std::vector<double> spec_decode_seconds, verify_seconds, draft_seconds;
};

struct RankOutput {
  std::string backend;
  std::string expert_exchange;  // ExpertDispatcher::exchange_name
  double load_seconds = 0;
  std::vector<double> prefill_seconds;
  double prefill_warmup_seconds = 0;
  std::vector<RankDecodeTimes> decode;
  std::vector<MixedStepTimes> mixed;  // one per BenchConfig::mixed_steps
  int64_t device_bytes_reserved_peak = -1;
  int64_t graph_bytes_reserved_peak = -1;  // the CUDA graph allocator's peak
  WeightDType kv_cache_dtype = WeightDType::kFloat32;
  int64_t kv_cache_blocks = 0;
  int64_t kv_cache_bytes_per_token = 0;  // over every layer
  int64_t kv_cache_entry_bytes = 0;      // one layer's entry (paged_latent)
  int64_t kv_cache_entry_values = 0;     // latent + rope values of that entry
  int64_t decode_graph_steps = 0;        // decode steps that took the graph path
  std::string prefill_op_report;
  std::vector<std::string> decode_op_reports;  // one per decode batch size, with op timing
};

// What the rank threads of one run share: rank 0's rendezvous socket, and every communicator
// that exists, so that a failing rank aborts them all and the other ranks leave their
// collectives at once instead of waiting out the timeout.
class RankSet {
 public:
  RankSet(int64_t ranks, std::unique_ptr<comm::TcpCommunicator::RootListener> root)
      : ranks_(ranks),
        root_address_(root != nullptr ? root->address : ""),
        root_(std::move(root)) {}

  int64_t ranks() const { return ranks_; }
  const std::string& root_address() const { return root_address_; }
  // Rank 0 takes the listener (once).
  std::unique_ptr<comm::TcpCommunicator::RootListener> TakeRoot() {
    absl::MutexLock lock(&mu_);
    return std::move(root_);
  }
  // False (and `c` aborted) if a rank failed already.
  bool Add(comm::Communicator* c) {
    absl::MutexLock lock(&mu_);
    if (!first_error_.ok()) {
      c->Abort(first_error_);
      return false;
    }
    comms_.push_back(c);
    return true;
  }
  // Before `c` is destroyed.
  void Remove(comm::Communicator* c) {
    absl::MutexLock lock(&mu_);
    comms_.erase(std::remove(comms_.begin(), comms_.end(), c), comms_.end());
  }
  void Fail(int64_t rank, const absl::Status& st) {
    absl::MutexLock lock(&mu_);
    if (!first_error_.ok()) return;
    first_error_ =
        ranks_ > 1 ? absl::Status(st.code(), absl::StrCat("rank ", rank, ": ", st.message())) : st;
    for (comm::Communicator* c : comms_) c->Abort(first_error_);
  }
  absl::Status first_error() const {
    absl::MutexLock lock(&mu_);
    return first_error_;
  }

 private:
  const int64_t ranks_;
  const std::string root_address_;
  mutable absl::Mutex mu_;
  std::unique_ptr<comm::TcpCommunicator::RootListener> root_ ABSL_GUARDED_BY(mu_);
  std::vector<comm::Communicator*> comms_ ABSL_GUARDED_BY(mu_);
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

// One rank's parts (rank_builder.h), destroyed on the rank's thread after the communicators
// are taken off the set.
struct RankState {
  RankSet* set = nullptr;
  RankParts parts;
  ExchangeMeter* meter = nullptr;  // ranks > 1: parts.exchange, between dispatcher and data plane

  ~RankState() {
    parts.pool.reset();
    parts.model.reset();
    parts.exchange.reset();
    if (parts.data_comm != nullptr) set->Remove(parts.data_comm.get());
    parts.data_comm.reset();
    parts.backend.reset();
    if (parts.group != nullptr) set->Remove(parts.group.get());
  }
};

// Builds the rank as a worker does (BuildRank: the TCP group with ranks > 1, the backend, the
// NCCL data plane if asked, the rank's share of the model, a KV pool of `blocks` blocks), with
// the exchange metered, then fills the cache if asked and waits for every rank.
absl::Status SetUpRank(const BenchConfig& bc, int64_t rank, int64_t blocks, RankState* s) {
  const int64_t ranks = s->set->ranks();
  RankSpec spec;
  spec.rank = static_cast<int>(rank);
  spec.world_size = static_cast<int>(ranks);
  spec.root_address = s->set->root_address();
  spec.group_incarnation = 0x62656e6368;  // "bench": one group per process
  // TCP: a barrier waits for every rank to load its weights (a minute or more for big models).
  // NCCL: bounds forming and each exchange, which never wait for loading.
  spec.group_timeout = absl::Minutes(10);
  spec.data_plane_timeout = absl::Minutes(2);
  spec.backend.kind = bc.backend;
  spec.backend.cuda_device = static_cast<int>(bc.cuda_device + rank);
  // fp8: the checkpoint's precision (the worker's --dtype auto), with FP8 dummy matrices; mxfp4:
  // the same with the routed experts in MXFP4 (the worker's --dtype mxfp4).
  const bool fp8_matrices = bc.dtype == kBenchFp8 || bc.dtype == kBenchMxfp4;
  spec.backend.dtype = bc.dtype == kBenchFp8     ? std::string(kStoredPrecisionDType)
                       : bc.dtype == kBenchMxfp4 ? std::string(kMxfp4ExpertsDType)
                                                 : bc.dtype;
  spec.backend.gemm_autotune = bc.gemm_autotune;
  spec.backend.batch_invariant = bc.batch_invariant;
  if (ranks > 1 && bc.backend == "cpu") {
    spec.backend.cpu_threads =
        std::max(1, static_cast<int>(std::thread::hardware_concurrency() / ranks));
  }
  auto choice = comm::ParseDataPlaneChoice(bc.communicator);
  if (!choice.ok()) return choice.status();
  spec.communicator = *choice;
  // The worker's expert-parallel dispatcher factory, which checks that the dispatcher serves
  // exactly the range loaded.
  auto ep_kind = ParseEpExchangeKind(bc.ep_exchange);
  if (!ep_kind.ok()) return ep_kind.status();
  EpExchangeOptions exchange;
  exchange.kind = *ep_kind;
  int64_t most_tokens = std::max<int64_t>(bc.prefill_batch_tokens, bc.cuda_graph_max_batch);
  for (int64_t n : bc.decode_num_requests) most_tokens = std::max(most_tokens, n);
  exchange.max_tokens = static_cast<int32_t>(std::min<int64_t>(most_tokens, 1 << 20));
  spec.dispatcher = ranks > 1 ? EpDispatcherFactory(exchange) : LocalDispatcherFactory();
  spec.model = bc.model;
  spec.open_weights = [&bc, fp8_matrices](const std::string& model, ModelConfig* config) {
    return OpenBenchWeights(model, bc.load_threads, fp8_matrices, config);
  };
  spec.decode_graphs.enabled = bc.cuda_graphs;
  spec.decode_graphs.max_batch = bc.cuda_graph_max_batch;
  spec.fused_ops = bc.fused_ops;
  spec.micro_batches = static_cast<int32_t>(bc.micro_batches);
  auto prefill_form = ParsePrefillAttention(bc.prefill_attention);
  if (!prefill_form.ok()) return prefill_form.status();
  spec.prefill_attention = *prefill_form;
  spec.kv_cache_dtype = bc.kv_cache_dtype;
  spec.block_size = static_cast<int32_t>(bc.block_size);
  spec.kv_cache_blocks = blocks;
  spec.draft_layers = bc.speculative_tokens > 0 ? 1 : 0;
  // A mixed step's sequences each hold a state slot where the model keeps per-sequence state.
  for (const MixedStepShape& m : bc.mixed_steps) {
    const int64_t prompts =
        static_cast<int64_t>(MixedPromptChunks(m.prompt_tokens, MixedPromptLength(bc)).size());
    spec.max_running =
        static_cast<int32_t>(std::max<int64_t>(spec.max_running, m.decode_rows + prompts));
  }
  RankHooks hooks;
  hooks.on_communicator = [set = s->set](comm::Communicator* c) { return set->Add(c); };
  hooks.wrap_exchange = [s](comm::Communicator* data,
                            Backend* backend) -> std::unique_ptr<comm::Communicator> {
    auto meter = std::make_unique<ExchangeMeter>(data, backend);
    s->meter = meter.get();
    return meter;
  };
  absl::Status built = BuildRank(spec, hooks, rank == 0 ? s->set->TakeRoot() : nullptr, &s->parts);
  if (built.code() == absl::StatusCode::kCancelled) return s->set->first_error();
  if (!built.ok()) return built;
  // Process-wide (every rank sets the same value; with ranks > 1 in one process the PDL-off
  // comparison toggles it for all of them, which changes their timing, never their results).
  kernels::SetProgrammaticDependentLaunch(bc.pdl);
  if (bc.speculative_tokens > 0 && s->parts.model->num_draft_layers() < 1) {
    return absl::InvalidArgumentError(
        "bench: --speculative-tokens needs a model with a draft head (DeepSeek-V3's MTP module)");
  }
  if (s->parts.model->CacheSpec().StateBytesPerSequence() > 0) {
    // Random values fill the paged cache only, not DeepSeek-V4's windows and compressors.
    if (bc.decode_fill == "random") {
      return absl::InvalidArgumentError(
          "bench: --decode-fill random fills the paged cache only, and this model's cache also "
          "keeps per-sequence state (DeepSeek-V4's windows and compressors): use --decode-fill "
          "prefill");
    }
    if (bc.speculative_tokens > 0) {
      return absl::InvalidArgumentError(
          "bench: --speculative-tokens fills the draft head's paged cache with random values, "
          "and this model's cache also keeps per-sequence state: DeepSeek-V3-family models "
          "only");
    }
  }
  if (bc.decode_fill == "random") {
    FillCacheRandom(s->parts.backend.get(), *s->parts.pool, 99);
  } else if (bc.speculative_tokens > 0) {
    // The draft head's layers (after the model's): no step of the benchmark fills them.
    FillCacheRandom(s->parts.backend.get(), *s->parts.pool, 99,
                    static_cast<int32_t>(s->parts.model->config().num_hidden_layers));
  }
  s->parts.backend->Synchronize();
  // Every rank has its weights before anyone steps.
  if (s->parts.group != nullptr) return s->parts.group->Barrier();
  return absl::OkStatus();
}

// Speculative decoding's costs at the sequences' current position (see bench_runner.h): plain
// decode steps, verify steps (the last token and K random drafts per sequence, every row's token
// picked on the device and the hidden states to the host, as Engine forms them) and one-row
// draft-head calls, output_len
// of each, all rewriting the same cache entries; the timed ones (after the warm-up) into `d`.
absl::Status MeasureSpeculative(const BenchConfig& bc, CausalLm* model, KvBlockPool* pool,
                                const std::vector<SequenceStep>& seqs, RankDecodeTimes* d) {
  const int64_t k = bc.speculative_tokens;
  // Its own stream: the prompts of the next batch size stay those of a run without this.
  std::mt19937 gen(4321);
  std::uniform_int_distribution<int32_t> tok(0,
                                             static_cast<int32_t>(model->config().vocab_size - 1));
  d->speculative_position = seqs[0].position_offset;
  std::vector<SequenceStep> verify = seqs;
  for (SequenceStep& v : verify) {
    for (int64_t i = 0; i < k; ++i) v.tokens.push_back(tok(gen));
    // Every row picked as the decode step picks its token, on the device (SequenceStep::
    // row_sampling); only the picks and the hidden states come back.
    v.row_sampling.assign(1 + k, v.sampling.value_or(SamplingParams{}));
    v.sampling.reset();
    v.all_logits = true;
    v.return_logits = false;
    v.return_hidden = true;
  }
  // Times `call` (a StatusOr) output_len times, the ones after the warm-up into `times`; each
  // result is destroyed after its clock stops, the last one kept in *last.
  auto timed = [&](auto call, std::vector<double>* times, auto* last) -> absl::Status {
    for (int64_t i = 0; i < bc.output_len; ++i) {
      const Clock::time_point t0 = Clock::now();
      auto out = call();
      const Clock::time_point t1 = Clock::now();
      if (!out.ok()) return out.status();
      if (i >= bc.warmup) times->push_back(Seconds(t0, t1));
      if (i + 1 == bc.output_len) *last = *std::move(out);
    }
    return absl::OkStatus();
  };
  StepOutput decoded, verified;
  DraftOutput drafted;
  absl::Status st =
      timed([&] { return model->Step(seqs, pool); }, &d->spec_decode_seconds, &decoded);
  if (!st.ok()) return st;
  st = timed([&] { return model->Step(verify, pool); }, &d->verify_seconds, &verified);
  if (!st.ok()) return st;
  // One row per sequence: a draft token at the sequence's position with the verify step's last
  // hidden state (a recursive round's input).
  const size_t hidden = static_cast<size_t>(model->config().hidden_size);
  std::vector<DraftStep> drafts(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const std::vector<float>& h = verified.hidden[i];
    if (h.size() < hidden) {
      return absl::InternalError("bench: the verify step returned no hidden states");
    }
    drafts[i].tokens = {tok(gen)};
    drafts[i].hidden.assign(h.end() - hidden, h.end());
    drafts[i].position_offset = seqs[i].position_offset;
    drafts[i].block_table = seqs[i].block_table;
    drafts[i].module = 0;
  }
  return timed([&] { return model->Draft(drafts, pool); }, &d->draft_seconds, &drafted);
}

// One rank's whole benchmark (RunBenchmark's loop); every rank runs the same steps.
absl::Status RunRank(const BenchConfig& bc, int64_t rank, RankState* s, RankOutput* o) {
  const int64_t ctx = bc.context_length;
  const int64_t prefill_seqs = std::max<int64_t>(1, bc.prefill_batch_tokens / ctx);
  const int64_t timed = bc.output_len - bc.warmup;
  const int64_t synced = bc.ranks > 1 && bc.time_all_to_all ? timed : 0;
  // Graphs off against graphs on means something on the cuda backend only.
  const bool compare_eager = bc.backend == "cuda" && bc.cuda_graphs && bc.compare_eager_decode;
  const int64_t decode_runs = 1 + (compare_eager ? 1 : 0) + (bc.compare_unfused_decode ? 1 : 0) +
                              (bc.compare_pdl_off_decode ? 1 : 0);
  // Mixed steps' decode rows take one position per step: the untimed one and --iters.
  const int64_t mixed_positions = bc.mixed_steps.empty() ? 0 : bc.prefill_repeats + 1;
  const int64_t per_seq_blocks =
      (ctx +
       std::max(bc.output_len * decode_runs + synced + bc.op_timing_steps +
                    (bc.speculative_tokens > 0 ? bc.speculative_tokens + 1 : 0),
                mixed_positions) +
       bc.block_size) /
      bc.block_size;
  int64_t max_n = 0;
  for (int64_t n : bc.decode_num_requests) max_n = std::max(max_n, n);
  int64_t most_blocks = per_seq_blocks * std::max(max_n, prefill_seqs);
  for (const MixedStepShape& m : bc.mixed_steps) {
    most_blocks = std::max(
        most_blocks, per_seq_blocks * m.decode_rows +
                         MixedPromptBlocks(m.prompt_tokens, MixedPromptLength(bc), bc.block_size));
  }
  // + 1: the decode graphs keep one block for their padding rows.
  const int64_t needed = most_blocks + 1;
  if (bc.kv_cache_blocks != 0 &&
      (bc.kv_cache_blocks < needed || bc.kv_cache_blocks > std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-cache-blocks must be 0 (sized by the batches) or in [", needed,
                     ", 2^31) for these batches (", per_seq_blocks, " blocks per sequence), got ",
                     bc.kv_cache_blocks));
  }
  const int64_t blocks = bc.kv_cache_blocks != 0 ? bc.kv_cache_blocks : needed;

  const Clock::time_point load_start = Clock::now();
  if (absl::Status st = SetUpRank(bc, rank, blocks, s); !st.ok()) return st;
  o->load_seconds = Seconds(load_start, Clock::now());
  o->backend = s->parts.backend->name();
  o->expert_exchange = s->parts.expert_exchange;
  const KvCacheGroupSpec& cache_group = s->parts.pool->spec().groups[0];
  o->kv_cache_dtype = cache_group.dtype;
  o->kv_cache_blocks = s->parts.pool->num_blocks();
  o->kv_cache_bytes_per_token = s->parts.pool->spec().BytesPerToken();
  o->kv_cache_entry_bytes = cache_group.EntryBytes();
  o->kv_cache_entry_values = cache_group.latent_dim + cache_group.rope_dim;
  CausalLm* model = s->parts.model.get();
  KvBlockPool* pool = s->parts.pool.get();
  const ModelConfig& mc = model->config();
#ifdef DEEPINFER_WITH_CUDA
  auto* cuda = dynamic_cast<CudaBackend*>(s->parts.backend.get());  // per-op timing
#endif
  auto set_fused = [&](bool on) { model->SetFusedOps(on); };
  // Runs `fn` with per-op timing on (CUDA only) and returns the op table.
  auto with_op_timing = [&](auto fn) -> std::string {
#ifdef DEEPINFER_WITH_CUDA
    if (cuda != nullptr && bc.op_timing_steps > 0) {
      cuda->SetOpTiming(true);
      fn();
      cuda->SetOpTiming(false);
      return cuda->TakeOpTimingReport();
    }
#endif
    fn();
    return "";
  };
  // Lines the ranks up before a timed step (not timed itself).
  auto line_up = [&]() -> absl::Status {
    return s->parts.group != nullptr ? s->parts.group->Barrier() : absl::OkStatus();
  };

  // Random prompt tokens, never all the same (timing on degenerate data is misleading). `gen`
  // is the one-rank run's stream on every rank; ranks other than 0 replace every sequence but
  // the first with their own (`own`), so that sequence 0 is the same everywhere.
  std::mt19937 gen(1234);
  std::mt19937 own(static_cast<uint32_t>(1234 + 7919 * rank));
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(mc.vocab_size - 1));
  auto new_seqs = [&](int64_t count) -> absl::StatusOr<std::vector<SequenceStep>> {
    std::vector<SequenceStep> batch(count);
    for (int64_t i = 0; i < count; ++i) {
      SequenceStep& s = batch[i];
      s.tokens.resize(ctx);
      for (int32_t& t : s.tokens) t = tok(gen);
      if (rank > 0 && i > 0) {
        for (int32_t& t : s.tokens) t = tok(own);
      }
      auto b = pool->Allocate(static_cast<int32_t>(per_seq_blocks));
      if (!b.ok()) return b.status();
      s.block_table = std::move(*b);
    }
    return batch;
  };
  auto free_seqs = [&](const std::vector<SequenceStep>& batch) -> absl::Status {
    for (const SequenceStep& s : batch) {
      absl::Status st = pool->Free(s.block_table);
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  };
  // The constrained requests' grammars (constrained_fraction > 0), over the real tokenizer.
  std::unique_ptr<ConstrainedRequests> constrained;
  if (bc.constrained_fraction > 0) {
    auto c = ConstrainedRequests::Create(bc.tokenizer, bc.constrained_spec, mc.vocab_size);
    if (!c.ok()) return c.status();
    constrained = std::move(*c);
  }
  auto advance = [&](const StepOutput& out, std::vector<SequenceStep>* seqs) -> absl::Status {
    for (size_t i = 0; i < seqs->size(); ++i) {
      (*seqs)[i].position_offset += 1;
      (*seqs)[i].tokens = {out.sampled[i].token};
    }
    return constrained != nullptr ? constrained->Advance(out) : absl::OkStatus();
  };

  // ---- Prefill: a warm-up step of the timed steps' size, the timed steps, the op-timed one ----
  // (The first step of a new size pays one-time costs — the memory pool growing to the step's
  // temporaries, cuBLAS choosing kernels for new shapes, kernel attributes — which a one-prompt
  // warm-up leaves to the first timed step.)
  if (bc.prefill_batch_tokens > 0) {
    const int64_t runs = bc.prefill_repeats + 1 + (bc.op_timing_steps > 0 ? 1 : 0);
    for (int64_t rep = 0; rep < runs; ++rep) {
      const bool op_timed = rep == bc.prefill_repeats + 1;
      auto batch = new_seqs(prefill_seqs);
      if (!batch.ok()) return batch.status();
      // As the engine prefills: each prompt's next token sampled on the device (greedy), no
      // logits back to the host (copying every prompt's vocabulary row to pageable host memory
      // would add 0.46-0.72 ms at 8 x 1024).
      for (SequenceStep& s : *batch) {
        s.sampling = SamplingParams{};
        s.return_logits = false;
      }
      if (absl::Status st = line_up(); !st.ok()) return st;
      absl::StatusOr<StepOutput> out;
      const Clock::time_point t0 = Clock::now();
      if (op_timed) {
        o->prefill_op_report = with_op_timing([&] { out = model->Step(*batch, pool); });
      } else {
        out = model->Step(*batch, pool);
      }
      const Clock::time_point t1 = Clock::now();
      if (!out.ok()) return out.status();
      if (rep == 0) o->prefill_warmup_seconds = Seconds(t0, t1);
      if (rep > 0 && !op_timed) o->prefill_seconds.push_back(Seconds(t0, t1));
      if (absl::Status st = free_seqs(*batch); !st.ok()) return st;
    }
  }

  // N sequences at ctx cached tokens (filled as decode_fill says), each with its next token
  // and its sampling: ready for a decode step.
  auto decode_rows = [&](int64_t n) -> absl::StatusOr<std::vector<SequenceStep>> {
    auto seqs_or = new_seqs(n);
    if (!seqs_or.ok()) return seqs_or.status();
    std::vector<SequenceStep> seqs = std::move(*seqs_or);
    std::vector<int32_t> next(n);
    if (bc.decode_fill == "prefill") {
      for (int64_t i = 0; i < n; i += prefill_seqs) {
        std::vector<SequenceStep> chunk(seqs.begin() + i,
                                        seqs.begin() + std::min(n, i + prefill_seqs));
        auto out = model->Step(chunk, pool);
        if (!out.ok()) return out.status();
        for (size_t j = 0; j < chunk.size(); ++j) next[i + j] = Argmax(out->logits[j]);
      }
    } else {
      // The cache already holds values.
      for (int64_t i = 0; i < n; ++i) {
        next[i] = tok(gen);
        if (rank > 0 && i > 0) next[i] = tok(own);
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      seqs[i].position_offset = ctx;
      seqs[i].tokens = {next[i]};
      // As the engine decodes: sampled on the device (greedy by default, seeded per request),
      // no logits back to the host unless the host path is asked for.
      SamplingParams sp;
      sp.temperature = bc.decode_temperature;
      sp.top_k = bc.decode_top_k;
      sp.top_p = bc.decode_top_p;
      sp.seed = static_cast<uint64_t>(i);
      seqs[i].sampling = sp;
      seqs[i].return_logits = bc.decode_sampling_on_host;
    }
    return seqs;
  };

  // ---- Decode, per batch size: N sequences at ctx cached tokens, then N-way decode steps ----
  for (size_t which = 0; which < bc.decode_num_requests.size(); ++which) {
    const int64_t n = bc.decode_num_requests[which];
    auto seqs_or = decode_rows(n);
    if (!seqs_or.ok()) return seqs_or.status();
    std::vector<SequenceStep> seqs = std::move(*seqs_or);
    if (constrained != nullptr) {
      constrained->Attach(bc.constrained_fraction, &seqs);
      constrained->TakeFillSeconds();
    }
    if (bc.pause_before_decode_ms > 0) {
      s->parts.backend->Synchronize();
      std::this_thread::sleep_for(std::chrono::milliseconds(bc.pause_before_decode_ms));
    }
    RankDecodeTimes d;
    d.constrained = constrained != nullptr ? constrained->count() : 0;
    if (s->meter != nullptr) s->meter->Take();  // not the fill's exchanges
    for (int64_t step = 0; step < bc.output_len; ++step) {
      if (absl::Status st = line_up(); !st.ok()) return st;
      const Clock::time_point t0 = Clock::now();
      auto out = model->Step(seqs, pool);
      const Clock::time_point t1 = Clock::now();
      if (!out.ok()) return out.status();
      if (s->meter != nullptr) {
        const ExchangeCounts c = s->meter->Take();
        if (step >= bc.warmup) {
          d.exchange.calls += c.calls;
          d.exchange.bytes_to_peers += c.bytes_to_peers;
        }
      }
      if (step >= bc.warmup) d.step_seconds.push_back(Seconds(t0, t1));
      if (constrained != nullptr) {
        const double fill = constrained->TakeFillSeconds();
        if (step >= bc.warmup) d.mask_fill_seconds += fill;
      }
      d.seq0_tokens.push_back(out->sampled[0].token);
      if (absl::Status st = advance(*out, &seqs); !st.ok()) return st;
    }
    // The all-to-all's time: as many steps again, synchronised around each exchange call.
    if (synced > 0) {
      s->meter->set_timing(true);
      for (int64_t step = 0; step < synced; ++step) {
        if (absl::Status st = line_up(); !st.ok()) return st;
        const Clock::time_point t0 = Clock::now();
        auto out = model->Step(seqs, pool);
        const Clock::time_point t1 = Clock::now();
        if (!out.ok()) return out.status();
        d.synced_step_seconds.push_back(Seconds(t0, t1));
        d.all_to_all_seconds.push_back(s->meter->Take().seconds);
        if (absl::Status st = advance(*out, &seqs); !st.ok()) return st;
      }
      s->meter->set_timing(false);
    }
    // output_len more steps of the same sequences (a variant of the step set up by the caller),
    // their times after the warm-up into `times`.
    auto variant_steps = [&](std::vector<double>* times) -> absl::Status {
      for (int64_t step = 0; step < bc.output_len; ++step) {
        if (absl::Status st = line_up(); !st.ok()) return st;
        const Clock::time_point t0 = Clock::now();
        auto out = model->Step(seqs, pool);
        const Clock::time_point t1 = Clock::now();
        if (!out.ok()) return out.status();
        if (s->meter != nullptr) s->meter->Take();
        if (step >= bc.warmup) times->push_back(Seconds(t0, t1));
        if (absl::Status st = advance(*out, &seqs); !st.ok()) return st;
      }
      return absl::OkStatus();
    };
    if (compare_eager) {
      // Every op launched eagerly.
      DecodeGraphOptions eager = model->decode_graph_options();
      eager.enabled = false;
      model->SetDecodeGraphOptions(eager);
      const absl::Status st = variant_steps(&d.eager_step_seconds);
      eager.enabled = true;
      model->SetDecodeGraphOptions(eager);
      if (!st.ok()) return st;
    }
    if (bc.compare_unfused_decode) {
      // The ops of before the fusions.
      set_fused(false);
      const absl::Status st = variant_steps(&d.unfused_step_seconds);
      set_fused(bc.fused_ops);
      if (!st.ok()) return st;
    }
    if (bc.compare_pdl_off_decode) {
      // Plain stream order; the graphs are recorded again (setting the options drops them),
      // without programmatic edges.
      const DecodeGraphOptions graphs = model->decode_graph_options();
      model->SetDecodeGraphOptions(graphs);
      kernels::SetProgrammaticDependentLaunch(false);
      const absl::Status st = variant_steps(&d.pdl_off_step_seconds);
      model->SetDecodeGraphOptions(graphs);
      kernels::SetProgrammaticDependentLaunch(bc.pdl);
      if (!st.ok()) return st;
    }
    absl::Status timed_status;
    if (bc.op_timing_steps > 0) {
      o->decode_op_reports.push_back(with_op_timing([&] {
        for (int64_t step = 0; step < bc.op_timing_steps && timed_status.ok(); ++step) {
          auto out = model->Step(seqs, pool);
          if (!out.ok()) {
            timed_status = out.status();
            return;
          }
          timed_status = advance(*out, &seqs);
        }
      }));
    }
    if (!timed_status.ok()) return timed_status;
    if (bc.speculative_tokens > 0) {
      if (absl::Status st = MeasureSpeculative(bc, model, pool, seqs, &d); !st.ok()) {
        return st;
      }
    }
    if (absl::Status st = free_seqs(seqs); !st.ok()) return st;
    o->decode.push_back(std::move(d));
  }

  // ---- Mixed steps, per shape: D decode rows as above and P prompt tokens in one step ----
  MixedStepOptions mixed;
  mixed.prompt_length = MixedPromptLength(bc);
  mixed.timed_steps = bc.prefill_repeats;
  mixed.prompt_sampling.temperature = bc.decode_temperature;
  mixed.prompt_sampling.top_k = bc.decode_top_k;
  mixed.prompt_sampling.top_p = bc.decode_top_p;
  for (const MixedStepShape& shape : bc.mixed_steps) {
    auto seqs = decode_rows(shape.decode_rows);
    if (!seqs.ok()) return seqs.status();
    auto times = MeasureMixedStep(
        model, pool, shape, mixed, [&] { return rank > 0 ? tok(own) : tok(gen); }, line_up, &*seqs);
    if (!times.ok()) return times.status();
    if (absl::Status st = free_seqs(*seqs); !st.ok()) return st;
    o->mixed.push_back(*std::move(times));
  }
#ifdef DEEPINFER_WITH_CUDA
  if (cuda != nullptr) {
    auto peak = cuda->ReservedBytes(/*high_water_mark=*/true);
    if (peak.ok()) o->device_bytes_reserved_peak = static_cast<int64_t>(*peak);
    auto graph_peak = cuda->GraphReservedBytes(/*high_water_mark=*/true);
    if (graph_peak.ok()) o->graph_bytes_reserved_peak = static_cast<int64_t>(*graph_peak);
  }
#endif
  o->decode_graph_steps = model->decode_graph_steps();
  if (absl::Status st = s->parts.backend->status(); !st.ok()) return st;
  // Nobody tears its communicators down while a peer may still be in the last exchange.
  return line_up();
}

// Per step, the slowest rank's time.
std::vector<double> SlowestPerStep(const std::vector<const std::vector<double>*>& per_rank) {
  std::vector<double> out(per_rank.empty() ? 0 : per_rank[0]->size(), 0);
  for (const std::vector<double>* v : per_rank) {
    for (size_t i = 0; i < out.size() && i < v->size(); ++i) out[i] = std::max(out[i], (*v)[i]);
  }
  return out;
}

}  // namespace

bool ParseRequestCounts(const std::string& text, std::vector<int64_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(part, &n)) return false;
    out->push_back(n);
  }
  return !out->empty();
}

bool ParseDecodeSampling(const std::string& text, BenchConfig* config) {
  if (text.empty()) return true;
  std::vector<std::string> parts = absl::StrSplit(text, ',');
  float t = 0, p = 0;
  int32_t k = 0;
  if (parts.size() != 3 || !absl::SimpleAtof(parts[0], &t) || !absl::SimpleAtoi(parts[1], &k) ||
      !absl::SimpleAtof(parts[2], &p) || !(t >= 0) || k < 0 || !(p > 0 && p <= 1)) {
    return false;
  }
  config->decode_temperature = t;
  config->decode_top_k = k;
  config->decode_top_p = p;
  return true;
}

std::string DummyModelSpec(const std::string& model, int64_t seed) {
  if (absl::StartsWith(model, "dummy:")) return model;
  const std::string config =
      absl::EndsWith(model, ".json") ? model : absl::StrCat(model, "/config.json");
  return absl::StrCat("dummy:", config, "@", seed);
}

absl::StatusOr<double> BytesPerValue(const std::string& dtype) {
  if (dtype == "float32") return 4.0;
  if (dtype == "bfloat16") return 2.0;
  // The FP8 matrices' byte; their block scales add 4 / 16384 of a byte, and kv_b, lm_head and the
  // embedding stay bf16, which the roofline's one figure per parameter leaves out.
  if (dtype == kBenchFp8) return 1.0;
  // The routed experts' half byte and their UE8M0 byte per 32 values: what decode streams for
  // most of a MoE model's parameters; the rest (FP8, 1 byte) is left out of the one figure.
  if (dtype == kBenchMxfp4) return 0.5 + 1.0 / 32;
  return absl::InvalidArgumentError(
      absl::StrCat("bench: --dtype must be float32, bfloat16, fp8 or mxfp4, not '", dtype, "'"));
}

absl::StatusOr<BenchResult> RunBenchmark(const BenchConfig& bc) {
  for (int64_t n : bc.decode_num_requests) {
    if (n <= 0) return absl::InvalidArgumentError("bench: decode request counts must be > 0");
  }
  if (bc.decode_num_requests.empty() || bc.context_length <= 0 || bc.output_len <= bc.warmup ||
      bc.warmup < 0 || bc.prefill_batch_tokens < 0 || bc.prefill_repeats <= 0) {
    return absl::InvalidArgumentError(
        "bench: need at least one decode request count, a positive context length and "
        "iterations, prefill tokens >= 0, and output_len > warmup >= 0");
  }
  if (bc.pause_before_decode_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bench: --pause-before-decode-ms must be >= 0, not ", bc.pause_before_decode_ms));
  }
  if (bc.decode_fill != "prefill" && bc.decode_fill != "random") {
    return absl::InvalidArgumentError(
        absl::StrCat("bench: --decode-fill must be prefill or random, not '", bc.decode_fill, "'"));
  }
  if (!(bc.constrained_fraction >= 0 && bc.constrained_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bench: --constrained-fraction must be in [0, 1], not ", bc.constrained_fraction));
  }
  if (bc.constrained_fraction > 0 && bc.tokenizer.empty()) {
    return absl::InvalidArgumentError(
        "bench: --constrained-fraction needs --tokenizer DIR (tokenizer.json, "
        "tokenizer_config.json): the masks are over the real vocabulary");
  }
  if (bc.constrained_fraction == 0 && !bc.constrained_spec.empty()) {
    return absl::InvalidArgumentError("bench: --constrained-spec needs --constrained-fraction > 0");
  }
  auto bytes_per_value = BytesPerValue(bc.dtype);
  if (!bytes_per_value.ok()) return bytes_per_value.status();
  auto config = ReadConfig(bc.model);
  if (!config.ok()) return config.status();
  if (bc.dtype == kBenchFp8) {
    // The worker's --dtype auto keeps FP8 matrices only where the architecture does; one that
    // dequantises them at load would run bf16 under an FP8 label and an FP8 roofline.
    auto arch = FindArchitecture(*config);
    if (!arch.ok()) return arch.status();
    if (!(*arch)->keeps_fp8) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bench: --dtype fp8: ", (*arch)->name,
          " loads its matrices dequantised and keeps none in FP8; use --dtype bfloat16, or "
          "--dtype mxfp4 where it keeps its routed experts in MXFP4"));
    }
  }
  if ((bc.dtype == kBenchFp8 || bc.dtype == kBenchMxfp4) && bc.backend != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("bench: --dtype ", bc.dtype,
                                                   " keeps quantised matrices on --backend cuda "
                                                   "only, not '",
                                                   bc.backend, "'"));
  }
  auto prefill_form = ParsePrefillAttention(bc.prefill_attention);
  if (!prefill_form.ok()) return prefill_form.status();
  if (bc.speculative_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bench: --speculative-tokens must be >= 0 (0: not measured), not ", bc.speculative_tokens));
  }
  if (bc.mixed_prompt_length < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bench: --mixed-prompt-length must be >= 0 (0: --context-length), not ",
                     bc.mixed_prompt_length));
  }
  for (const MixedStepShape& m : bc.mixed_steps) {
    if (m.decode_rows < 1 || m.prompt_tokens < 1) {
      return absl::InvalidArgumentError(absl::StrCat("bench: --mixed-steps ", m.decode_rows, ":",
                                                     m.prompt_tokens,
                                                     ": a mixed step needs D >= 1 and P >= 1"));
    }
  }
  if (bc.speculative_tokens > 0 && bc.ranks != 1) {
    return absl::InvalidArgumentError("bench: --speculative-tokens measures one rank (--ranks 1)");
  }
  const int64_t ranks = bc.ranks;
  if (ranks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("bench: --ranks must be >= 1, not ", ranks));
  }
  auto choice = comm::ParseDataPlaneChoice(bc.communicator);
  if (!choice.ok()) return choice.status();
  if (absl::Status st = comm::CheckDataPlaneChoice(*choice, bc.backend); !st.ok()) return st;
  std::unique_ptr<comm::TcpCommunicator::RootListener> root;
  if (ranks > 1) {
    if (config->n_routed_experts <= 0) {
      return absl::InvalidArgumentError(
          "bench: --ranks > 1 splits the routed experts over the ranks, but this model has none");
    }
    if (config->n_routed_experts % ranks != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bench: --ranks ", ranks, " does not divide the model's ", config->n_routed_experts,
          " routed experts (every rank hosts the same number)"));
    }
    if (bc.backend == "cuda") {
      std::string why;
      const int64_t gpus = static_cast<int64_t>(FindCudaDevices(&why).size());
      if (bc.cuda_device < 0 || bc.cuda_device + ranks > gpus) {
        return absl::InvalidArgumentError(absl::StrCat(
            "bench: --ranks ", ranks, " from --cuda-device ", bc.cuda_device, " needs GPUs ",
            bc.cuda_device, "..", bc.cuda_device + ranks - 1, ", this machine shows ", gpus,
            why.empty() ? "" : absl::StrCat(" (", why, ")"), " (CUDA_VISIBLE_DEVICES applies)"));
      }
    }
    auto listener = comm::TcpCommunicator::ListenRoot("127.0.0.1:0");
    if (!listener.ok()) return listener.status();
    root = std::make_unique<comm::TcpCommunicator::RootListener>(std::move(*listener));
  }

  // ---- Every rank on its own thread (one rank: this one) ----
  RankSet set(ranks, std::move(root));
  std::vector<RankOutput> outputs(ranks);
  auto run_rank = [&](int64_t rank) {
    RankState state;
    state.set = &set;
    absl::Status st = RunRank(bc, rank, &state, &outputs[rank]);
    if (!st.ok()) set.Fail(rank, st);
  };
  if (ranks == 1) {
    run_rank(0);
  } else {
    std::vector<std::thread> threads;
    for (int64_t r = 0; r < ranks; ++r) threads.emplace_back(run_rank, r);
    for (std::thread& t : threads) t.join();
  }
  if (absl::Status st = set.first_error(); !st.ok()) return st;

  // ---- Merge ----
  BenchResult r;
  r.backend = outputs[0].backend;
  r.has_roofline = r.backend == "cuda";
  r.cuda_graphs = r.backend == "cuda" && bc.cuda_graphs;
  r.ranks = ranks;
  if (ranks > 1) {
    auto plane = comm::ResolveDataPlane(*choice, bc.backend, static_cast<int>(ranks));
    if (plane.ok()) r.data_plane = comm::DataPlaneName(*plane);
    r.expert_exchange = outputs[0].expert_exchange;
  }
  r.bytes_per_value = *bytes_per_value;
  r.kv_cache_dtype = WeightDTypeName(outputs[0].kv_cache_dtype);
  // Bytes per cached value as the pool stores them (an FP8 entry's scale and padding included).
  r.kv_cache_bytes_per_token = outputs[0].kv_cache_bytes_per_token;
  r.cache_bytes_per_value = static_cast<double>(outputs[0].kv_cache_entry_bytes) /
                            std::max<int64_t>(1, outputs[0].kv_cache_entry_values);
  r.kv_cache_blocks = outputs[0].kv_cache_blocks;
  // The step costs of the config's architecture (roofline.h; roofline_v4.h for DeepSeek-V4).
  std::optional<DeepseekV4Config> v4;
  if (config->architecture == "DeepseekV4ForCausalLM") {
    absl::StatusOr<DeepseekV4Config> c = DeepseekV4Config::FromModelConfig(*config);
    if (!c.ok()) return c.status();
    v4 = *std::move(c);
  }
  r.param_count = v4 ? CountParamsV4(*v4).total : CountParams(*config).total;
  // V4 keeps no matrix FP8: with --dtype mxfp4 its routed experts are MXFP4 (bytes_per_value)
  // and every other matrix bf16.
  const double v4_matrix_bytes = bc.dtype == kBenchMxfp4 ? 2.0 : r.bytes_per_value;
  for (const RankOutput& o : outputs) {
    r.load_seconds = std::max(r.load_seconds, o.load_seconds);
    r.device_bytes_reserved_peak =
        std::max(r.device_bytes_reserved_peak, o.device_bytes_reserved_peak);
    r.graph_bytes_reserved_peak =
        std::max(r.graph_bytes_reserved_peak, o.graph_bytes_reserved_peak);
  }
  r.decode_graph_steps = outputs[0].decode_graph_steps;
  if (bc.cuda_graphs && r.decode_graph_steps > 0) {
    const std::vector<int64_t> all = DecodeGraphBuckets(bc.cuda_graph_max_batch);
    std::vector<int64_t> used;
    for (int64_t n : bc.decode_num_requests) {
      auto b = std::lower_bound(all.begin(), all.end(), n);
      if (b != all.end() && std::find(used.begin(), used.end(), *b) == used.end()) {
        used.push_back(*b);
      }
    }
    auto arch = FindArchitecture(*config);
    if (!arch.ok()) return arch.status();
    r.graph_bytes_planned =
        DecodeGraphReserveBytes((*arch)->activation_floats_per_token(*config), used);
    // The attention's bf16 copy of FP8 cache entries (the plan's graph-pool share of it).
    if (outputs[0].kv_cache_dtype == WeightDType::kFp8E4M3) {
      r.graph_bytes_planned += kFp8CacheCopyMaxBytes;
    }
  }
  r.prefill_op_report = outputs[0].prefill_op_report;
  r.decode_op_reports = outputs[0].decode_op_reports;
  const int64_t ctx = bc.context_length;
  if (bc.prefill_batch_tokens > 0) {
    const int64_t prefill_seqs = std::max<int64_t>(1, bc.prefill_batch_tokens / ctx);
    std::vector<const std::vector<double>*> per_rank;
    for (const RankOutput& o : outputs) per_rank.push_back(&o.prefill_seconds);
    r.prefill_tokens_per_step = prefill_seqs * ctx;
    r.prefill_step_seconds = Percentile(SlowestPerStep(per_rank), 0.5);
    for (const RankOutput& o : outputs) {
      r.prefill_warmup_step_seconds =
          std::max(r.prefill_warmup_step_seconds, o.prefill_warmup_seconds);
    }
    r.prefill_tokens_per_s = ranks * r.prefill_tokens_per_step / r.prefill_step_seconds;
    // The form the MLA attention picks for these prompts (PrefillAttention), where the backend has
    // the non-absorbed op (CPU; CUDA with bf16 weights, on the shapes the kernel takes).
    const bool mha_backend = bc.backend == "cpu" || bc.dtype == "bfloat16" ||
                             bc.dtype == kBenchFp8 || bc.dtype == kBenchMxfp4;
    const int64_t mha_min = *prefill_form == PrefillAttention::kMha ? 2 : kMhaPrefillMinTokens;
    const MlaForm form =
        *prefill_form != PrefillAttention::kAbsorbed && mha_backend && ctx >= mha_min
            ? MlaForm::kNonAbsorbed
            : MlaForm::kAbsorbed;
    r.prefill_attention_form = v4 ? "v4" : form == MlaForm::kAbsorbed ? "absorbed" : "non-absorbed";
    const StepCost pc = v4 ? PrefillStepCostV4(*v4, prefill_seqs, ctx, v4_matrix_bytes,
                                               r.cache_bytes_per_value, ranks, r.bytes_per_value)
                           : PrefillStepCost(*config, prefill_seqs, ctx, r.bytes_per_value,
                                             r.cache_bytes_per_value, ranks, form);
    r.prefill_bytes_per_step = pc.bytes;
    r.prefill_flops_per_step = pc.flops;
    if (r.has_roofline) {
      r.prefill_roofline_fraction =
          pc.RooflineSeconds(bc.peak_bytes_per_s, bc.peak_flops_per_s) / r.prefill_step_seconds;
    }
  }
  for (size_t which = 0; which < bc.decode_num_requests.size(); ++which) {
    const int64_t n = bc.decode_num_requests[which];
    std::vector<const std::vector<double>*> steps, synced, eager, unfused, pdl_off;
    for (const RankOutput& o : outputs) {
      steps.push_back(&o.decode[which].step_seconds);
      synced.push_back(&o.decode[which].synced_step_seconds);
      eager.push_back(&o.decode[which].eager_step_seconds);
      unfused.push_back(&o.decode[which].unfused_step_seconds);
      pdl_off.push_back(&o.decode[which].pdl_off_step_seconds);
    }
    // The figures of one run of timed steps (per step the slowest rank's time) that came after
    // `before` other steps of the same sequences; the cost model at the run's mid context.
    auto timed_run = [&](const std::vector<const std::vector<double>*>& times, int64_t before,
                         bool cuda_graphs, bool fused_ops, bool pdl) {
      const std::vector<double> slowest = SlowestPerStep(times);
      DecodeResult t;
      t.batch = n;
      t.cuda_graphs = cuda_graphs;
      t.fused_ops = fused_ops;
      t.pdl = pdl;
      t.steps = static_cast<int64_t>(slowest.size());
      t.p50_seconds = Percentile(slowest, 0.5);
      t.p99_seconds = Percentile(slowest, 0.99);
      t.tokens_per_s = ranks * n / t.p50_seconds;
      t.tokens_per_s_per_gpu = n / t.p50_seconds;
      const int64_t mid = ctx + before + bc.output_len / 2;
      const StepCost cost =
          v4 ? DecodeStepCostV4(*v4, n, mid, v4_matrix_bytes, r.cache_bytes_per_value, ranks,
                                r.bytes_per_value)
             : DecodeStepCost(*config, n, mid, r.bytes_per_value, r.cache_bytes_per_value, ranks);
      t.bytes_per_step = cost.bytes;
      t.flops_per_step = cost.flops;
      if (r.has_roofline) {
        t.roofline_fraction =
            cost.RooflineSeconds(bc.peak_bytes_per_s, bc.peak_flops_per_s) / t.p50_seconds;
      }
      return t;
    };
    DecodeResult d = timed_run(steps, 0, r.cuda_graphs, bc.fused_ops, bc.pdl);
    d.seq0_tokens = outputs[0].decode[which].seq0_tokens;
    d.constrained_requests = outputs[0].decode[which].constrained;
    if (d.constrained_requests > 0) {
      d.mask_fill_seconds_per_step =
          outputs[0].decode[which].mask_fill_seconds /
          std::max<double>(1, static_cast<double>(outputs[0].decode[which].step_seconds.size()));
    }
    if (ranks > 1) {
      double a2a_sum = 0;
      for (int64_t k = 0; k < ranks; ++k) {
        const RankDecodeTimes& t = outputs[k].decode[which];
        RankDecodeResult pr;
        pr.rank = k;
        pr.p50_seconds = Percentile(t.step_seconds, 0.5);
        pr.p99_seconds = Percentile(t.step_seconds, 0.99);
        pr.seq0_tokens = t.seq0_tokens;
        const double timed = std::max<double>(1, static_cast<double>(t.step_seconds.size()));
        pr.exchange_calls_per_step = t.exchange.calls / timed;
        pr.exchange_bytes_per_step = t.exchange.bytes_to_peers / timed;
        d.exchange_bytes_per_step += pr.exchange_bytes_per_step / ranks;
        if (!t.all_to_all_seconds.empty()) {
          pr.all_to_all_p50_seconds = Percentile(t.all_to_all_seconds, 0.5);
          pr.synced_step_p50_seconds = Percentile(t.synced_step_seconds, 0.5);
          a2a_sum += pr.all_to_all_p50_seconds;
        }
        d.per_rank.push_back(std::move(pr));
      }
      if (!outputs[0].decode[which].all_to_all_seconds.empty()) {
        d.all_to_all_seconds_per_step = a2a_sum / ranks;
        d.synced_step_p50_seconds = Percentile(SlowestPerStep(synced), 0.5);
      }
    }
    const bool compared = !outputs[0].decode[which].eager_step_seconds.empty();
    const bool unfused_ran = !outputs[0].decode[which].unfused_step_seconds.empty();
    r.decode.push_back(std::move(d));
    // The comparison runs that followed, in this order, each output_len steps further on.
    int64_t before = bc.output_len;
    if (compared) {  // graphs off (compare_eager_decode)
      r.decode.push_back(timed_run(eager, before, false, bc.fused_ops, bc.pdl));
      before += bc.output_len;
    }
    if (unfused_ran) {  // fused ops off (compare_unfused_decode)
      r.decode.push_back(timed_run(unfused, before, r.cuda_graphs, false, bc.pdl));
      before += bc.output_len;
    }
    if (!outputs[0].decode[which].pdl_off_step_seconds.empty()) {  // compare_pdl_off_decode
      r.decode.push_back(timed_run(pdl_off, before, r.cuda_graphs, bc.fused_ops, false));
    }
    if (bc.speculative_tokens > 0) {
      const RankDecodeTimes& t = outputs[0].decode[which];  // one rank
      SpeculativeResult sp;
      sp.batch = n;
      sp.drafts = bc.speculative_tokens;
      sp.position = t.speculative_position;
      sp.calls = static_cast<int64_t>(t.verify_seconds.size());
      sp.decode_p50_seconds = Percentile(t.spec_decode_seconds, 0.5);
      sp.decode_p99_seconds = Percentile(t.spec_decode_seconds, 0.99);
      sp.verify_p50_seconds = Percentile(t.verify_seconds, 0.5);
      sp.verify_p99_seconds = Percentile(t.verify_seconds, 0.99);
      sp.draft_p50_seconds = Percentile(t.draft_seconds, 0.5);
      sp.draft_p99_seconds = Percentile(t.draft_seconds, 0.99);
      r.speculative.push_back(sp);
    }
  }
  for (size_t which = 0; which < bc.mixed_steps.size(); ++which) {
    std::vector<const std::vector<double>*> per_rank;
    for (const RankOutput& o : outputs) per_rank.push_back(&o.mixed[which].step_seconds);
    const std::vector<double> slowest = SlowestPerStep(per_rank);
    MixedStepResult m;
    m.shape = bc.mixed_steps[which];
    m.context = ctx;
    m.prompt_length = MixedPromptLength(bc);
    m.prompts = outputs[0].mixed[which].prompts;
    m.sampled_rows = outputs[0].mixed[which].sampled_rows;
    m.timed_steps = static_cast<int64_t>(slowest.size());
    m.p50_seconds = Percentile(slowest, 0.5);
    m.p99_seconds = Percentile(slowest, 0.99);
    m.tokens_per_s = (m.shape.decode_rows + m.shape.prompt_tokens) / m.p50_seconds;
    r.mixed.push_back(m);
  }
  return r;
}

double SpeculativeExpectedTokens(double alpha, int64_t k) {
  if (alpha >= 1) return static_cast<double>(k + 1);
  return (1 - std::pow(alpha, static_cast<double>(k + 1))) / (1 - alpha);
}

double SpeculativeSpeedup(double alpha, int64_t k, double decode_seconds, double verify_seconds,
                          double draft_seconds) {
  return SpeculativeExpectedTokens(alpha, k) * decode_seconds /
         (verify_seconds + static_cast<double>(k) * draft_seconds);
}

std::string FormatBenchReport(const BenchConfig& c, const BenchResult& r) {
  std::string out;
  absl::StrAppendFormat(&out,
                        "model: %s (%.3fB parameters, %s, %.0f bytes each; KV cache %s, %d "
                        "blocks of %d)\n",
                        c.model, r.param_count / 1e9, c.dtype, r.bytes_per_value, r.kv_cache_dtype,
                        r.kv_cache_blocks, c.block_size);
  if (r.kv_cache_bytes_per_token > 0) {
    absl::StrAppendFormat(&out, "kv cache: %d bytes per token, %d tokens per GiB\n",
                          r.kv_cache_bytes_per_token, r.kv_cache_tokens_per_gib());
  }
  absl::StrAppendFormat(&out, "backend: %s\nload_s: %.2f\n", r.backend, r.load_seconds);
  if (c.pause_before_decode_ms > 0) {
    absl::StrAppendFormat(&out, "pause before each decode run: %d ms (device idle)\n",
                          c.pause_before_decode_ms);
  }
  if (c.decode_temperature > 0 || c.decode_sampling_on_host) {
    absl::StrAppendFormat(
        &out, "decode sampling: temperature %g, top_k %d, top_p %g, %s\n", c.decode_temperature,
        c.decode_top_k, c.decode_top_p,
        c.decode_sampling_on_host ? "on the host (logits copied back)" : "on the device");
  }
  const bool ep = r.ranks > 1;
  if (ep) {
    absl::StrAppendFormat(&out,
                          "ranks: %d (expert parallel over %s; each rank its own requests, "
                          "figures per rank; a step's time is the slowest rank's)\n"
                          "expert exchange: %s\n",
                          r.ranks, r.data_plane, r.expert_exchange);
  }
  if (c.micro_batches != 1) {
    absl::StrAppendFormat(&out, "micro-batches: %d per step (no decode graphs)\n", c.micro_batches);
  }
  // "roofline fraction F" where the peaks apply, and the peaks themselves.
  auto roofline = [&](double fraction) {
    return r.has_roofline ? absl::StrFormat("roofline fraction %.4f", fraction) : std::string();
  };
  const std::string peaks =
      r.has_roofline ? absl::StrFormat("; %.0f GB/s, %.0f TFLOP/s peaks", c.peak_bytes_per_s / 1e9,
                                       c.peak_flops_per_s / 1e12)
                     : "";
  if (!r.has_roofline) {
    absl::StrAppend(&out, "roofline: none on the ", r.backend,
                    " backend (the peak figures are an H200's)\n");
  }
  if (r.prefill_tokens_per_step > 0) {
    absl::StrAppendFormat(
        &out,
        "prefill: %d tokens/step%s (%d x %d), median step %.4f s, %.1f tok/s%s, "
        "%s%s attention (untimed first step of this size %.4f s)\n",
        r.prefill_tokens_per_step, ep ? " per rank" : "",
        r.prefill_tokens_per_step / c.context_length, c.context_length, r.prefill_step_seconds,
        r.prefill_tokens_per_s,
        ep ? absl::StrFormat(" (%.1f per GPU)", r.prefill_tokens_per_s / r.ranks) : "",
        r.has_roofline ? roofline(r.prefill_roofline_fraction) + ", " : "",
        r.prefill_attention_form, r.prefill_warmup_step_seconds);
  }
  for (const DecodeResult& d : r.decode) {
    if (ep) {
      absl::StrAppendFormat(
          &out,
          "decode: batch %d per rank x %d ranks, context %d, %d timed steps, p50 %.4f s, p99 "
          "%.4f s, %.1f tok/s, %.1f tok/s per GPU%s (%.3g bytes, %.3g FLOPs per step and "
          "GPU%s)\n",
          d.batch, r.ranks, c.context_length, d.steps, d.p50_seconds, d.p99_seconds, d.tokens_per_s,
          d.tokens_per_s_per_gpu,
          r.has_roofline ? ", " + roofline(d.roofline_fraction) + " per GPU" : "", d.bytes_per_step,
          d.flops_per_step, peaks);
      for (const RankDecodeResult& k : d.per_rank) {
        absl::StrAppendFormat(&out,
                              "  rank %d: p50 %.4f s, p99 %.4f s, %.1f exchange calls and %.4g "
                              "bytes to other ranks per step",
                              k.rank, k.p50_seconds, k.p99_seconds, k.exchange_calls_per_step,
                              k.exchange_bytes_per_step);
        if (k.all_to_all_p50_seconds >= 0) {
          absl::StrAppendFormat(&out, ", all-to-all p50 %.6f s per step (synced step p50 %.4f s)",
                                k.all_to_all_p50_seconds, k.synced_step_p50_seconds);
        }
        absl::StrAppend(&out, "\n");
      }
      if (d.all_to_all_seconds_per_step >= 0) {
        absl::StrAppendFormat(
            &out,
            "all_to_all (batch %d): %.6f s per step (%.1f%% of the synced step; mean over ranks "
            "of each rank's p50, backend synchronised around every exchange call), step p50 "
            "%.4f s synced vs %.4f s unsynced, %.4g bytes to other ranks per rank and step\n",
            d.batch, d.all_to_all_seconds_per_step,
            100.0 * d.all_to_all_seconds_per_step / d.synced_step_p50_seconds,
            d.synced_step_p50_seconds, d.p50_seconds, d.exchange_bytes_per_step);
      } else {
        absl::StrAppendFormat(&out,
                              "all_to_all (batch %d): not timed (--time-all-to-all), %.4g bytes "
                              "to other ranks per rank and step\n",
                              d.batch, d.exchange_bytes_per_step);
      }
    } else {
      absl::StrAppendFormat(
          &out,
          "decode: batch %d, context %d, %d timed steps%s, p50 %.4f s, p99 %.4f s, %.1f tok/s%s "
          "(%.3g bytes, %.3g FLOPs per step%s)\n",
          d.batch, c.context_length, d.steps,
          absl::StrCat(
              c.compare_eager_decode && r.backend == "cuda"
                  ? (d.cuda_graphs ? " (cuda graphs)" : " (eager)")
                  : "",
              c.compare_unfused_decode || !c.fused_ops ? (d.fused_ops ? " (fused)" : " (unfused)")
                                                       : "",
              c.compare_pdl_off_decode || !c.pdl ? (d.pdl ? " (pdl on)" : " (pdl off)") : ""),
          d.p50_seconds, d.p99_seconds, d.tokens_per_s,
          r.has_roofline ? ", " + roofline(d.roofline_fraction) : "", d.bytes_per_step,
          d.flops_per_step, peaks);
    }
    if (d.constrained_requests > 0) {
      absl::StrAppendFormat(&out,
                            "constrained (batch %d): %d requests, host mask fill %.6f s per step "
                            "(%s, inside the step time, overlapping the device's forward pass)\n",
                            d.batch, d.constrained_requests, d.mask_fill_seconds_per_step,
                            c.ranks > 1 ? "rank 0" : "mean over the timed steps");
    }
    absl::StrAppend(&out, "seq0_decode_tokens (batch ", d.batch, "): ", Join(d.seq0_tokens), "\n");
    for (const RankDecodeResult& k : d.per_rank) {
      if (k.rank == 0) continue;  // the line above
      absl::StrAppend(&out, "seq0_decode_tokens (batch ", d.batch, ", rank ", k.rank,
                      "): ", Join(k.seq0_tokens), "\n");
    }
  }
  for (const SpeculativeResult& sp : r.speculative) {
    std::string speedups;
    for (double a : kSpeculativeAlphas) {
      absl::StrAppendFormat(&speedups, "%s%.1f: %.3f", speedups.empty() ? "" : ", ", a,
                            SpeculativeSpeedup(a, sp.drafts, sp.decode_p50_seconds,
                                               sp.verify_p50_seconds, sp.draft_p50_seconds));
    }
    absl::StrAppendFormat(
        &out,
        "speculative: batch %d, K %d, position %d, %d timed calls each: decode step p50 %.6f s "
        "p99 %.6f s; verify step (%d x %d rows, picked on the device, hidden states to the host) "
        "p50 "
        "%.6f s p99 %.6f s; draft call (%d rows) p50 %.6f s p99 %.6f s; verify/decode %.3f; "
        "speed-up E[tokens] x decode / (verify + K x draft) at alpha %s\n",
        sp.batch, sp.drafts, sp.position, sp.calls, sp.decode_p50_seconds, sp.decode_p99_seconds,
        sp.batch, 1 + sp.drafts, sp.verify_p50_seconds, sp.verify_p99_seconds, sp.batch,
        sp.draft_p50_seconds, sp.draft_p99_seconds, sp.verify_p50_seconds / sp.decode_p50_seconds,
        speedups);
  }
  absl::StrAppend(&out, FormatMixedStepReport(r.mixed));
  if (r.backend == "cuda") {
    absl::StrAppendFormat(
        &out, "cuda_graphs: %s (max batch %d), %d decode steps on the graph path\n",
        r.cuda_graphs ? "on" : "off", c.cuda_graph_max_batch, r.decode_graph_steps);
  }
  if (r.device_bytes_reserved_peak >= 0) {
    absl::StrAppendFormat(&out, "device_memory_reserved_peak: %.3f GiB%s\n",
                          r.device_bytes_reserved_peak / 1073741824.0,
                          ep ? " (the most of any rank)" : "");
  }
  if (r.graph_bytes_reserved_peak >= 0) {
    absl::StrAppendFormat(&out,
                          "graph_memory_reserved_peak: %.3f GiB (memory plan for these buckets: "
                          "%.3f GiB)\n",
                          r.graph_bytes_reserved_peak / 1073741824.0,
                          r.graph_bytes_planned / 1073741824.0);
  }
  if (!r.prefill_op_report.empty()) {
    absl::StrAppend(&out, "prefill ops (one step, synchronised per op", ep ? ", rank 0" : "",
                    "):\n", r.prefill_op_report);
  }
  for (size_t i = 0; i < r.decode_op_reports.size() && i < c.decode_num_requests.size(); ++i) {
    if (r.decode_op_reports[i].empty()) continue;
    absl::StrAppend(&out, "decode ops (batch ", c.decode_num_requests[i], ", ", c.op_timing_steps,
                    " steps, synchronised per op", ep ? ", rank 0" : "", "):\n",
                    r.decode_op_reports[i]);
  }
  return out;
}

std::string FormatBenchJson(const BenchConfig& c, const BenchResult& r) {
  auto json_list = [](const std::vector<int32_t>& v) {
    return absl::StrReplaceAll(Join(v), {{" ", ", "}});
  };
  // null where a figure does not apply to the backend that ran.
  const bool cuda = r.backend == "cuda";
  auto fraction = [&](double v) {
    return r.has_roofline ? absl::StrFormat("%.6f", v) : std::string("null");
  };
  auto peak = [&](double v) {
    return r.has_roofline ? absl::StrFormat("%.4g", v) : std::string("null");
  };
  auto graphs = [&](bool on) { return !cuda ? "null" : on ? "true" : "false"; };
  std::string decode;
  for (const DecodeResult& d : r.decode) {
    std::string per_rank;
    for (const RankDecodeResult& k : d.per_rank) {
      absl::StrAppendFormat(
          &per_rank,
          "%s{\"rank\": %d, \"p50_s\": %.6f, \"p99_s\": %.6f, \"exchange_calls_per_step\": %.3f, "
          "\"exchange_bytes_per_step\": %.6g, \"all_to_all_p50_s\": %.6g, "
          "\"synced_step_p50_s\": %.6g, \"seq0_tokens\": [%s]}",
          per_rank.empty() ? "" : ", ", k.rank, k.p50_seconds, k.p99_seconds,
          k.exchange_calls_per_step, k.exchange_bytes_per_step, k.all_to_all_p50_seconds,
          k.synced_step_p50_seconds, json_list(k.seq0_tokens));
    }
    absl::StrAppendFormat(
        &decode,
        "%s{\"requests\": %d, \"cuda_graphs\": %s, \"fused_ops\": %s, \"pdl\": %s, "
        "\"timed_steps\": %d, "
        "\"tokens_per_s\": %.3f, "
        "\"tokens_per_s_per_gpu\": %.3f, \"p50_s\": %.6f, \"p99_s\": %.6f, "
        "\"roofline_fraction\": %s, \"bytes_per_step\": %.6g, \"flops_per_step\": %.6g, "
        "\"exchange_bytes_per_step\": %.6g, \"all_to_all_s_per_step\": %.6g, "
        "\"synced_step_p50_s\": %.6g, \"constrained_requests\": %d, "
        "\"mask_fill_s_per_step\": %.6g, \"seq0_tokens\": [%s], \"per_rank\": [%s]}",
        decode.empty() ? "" : ", ", d.batch, graphs(d.cuda_graphs), d.fused_ops ? "true" : "false",
        d.pdl ? "true" : "false", d.steps, d.tokens_per_s, d.tokens_per_s_per_gpu, d.p50_seconds,
        d.p99_seconds, fraction(d.roofline_fraction), d.bytes_per_step, d.flops_per_step,
        d.exchange_bytes_per_step, d.all_to_all_seconds_per_step, d.synced_step_p50_seconds,
        d.constrained_requests, d.mask_fill_seconds_per_step, json_list(d.seq0_tokens), per_rank);
  }
  std::string speculative;
  for (const SpeculativeResult& sp : r.speculative) {
    std::string speedups;
    for (double a : kSpeculativeAlphas) {
      absl::StrAppendFormat(&speedups, "%s{\"alpha\": %.1f, \"speedup\": %.6f}",
                            speedups.empty() ? "" : ", ", a,
                            SpeculativeSpeedup(a, sp.drafts, sp.decode_p50_seconds,
                                               sp.verify_p50_seconds, sp.draft_p50_seconds));
    }
    absl::StrAppendFormat(
        &speculative,
        "%s{\"requests\": %d, \"drafts\": %d, \"position\": %d, \"timed_calls\": %d, "
        "\"decode_p50_s\": %.6f, \"decode_p99_s\": %.6f, \"verify_p50_s\": %.6f, "
        "\"verify_p99_s\": %.6f, \"draft_p50_s\": %.6f, \"draft_p99_s\": %.6f, "
        "\"verify_over_decode\": %.6f, \"speedup\": [%s]}",
        speculative.empty() ? "" : ", ", sp.batch, sp.drafts, sp.position, sp.calls,
        sp.decode_p50_seconds, sp.decode_p99_seconds, sp.verify_p50_seconds, sp.verify_p99_seconds,
        sp.draft_p50_seconds, sp.draft_p99_seconds, sp.verify_p50_seconds / sp.decode_p50_seconds,
        speedups);
  }
  // The model string is a path: escape the two characters JSON strings cannot hold raw.
  const std::string model = absl::StrReplaceAll(c.model, {{"\\", "\\\\"}, {"\"", "\\\""}});
  return absl::StrFormat(
      "{\"model\": \"%s\", \"backend\": \"%s\", \"dtype\": \"%s\", \"bytes_per_value\": %.0f, "
      "\"ranks\": %d, \"data_plane\": \"%s\", "
      "\"params\": %.0f, \"load_s\": %.3f, \"context\": %d, \"peak_bytes_per_s\": %s, "
      "\"peak_flops_per_s\": %s, \"prefill\": {\"tokens_per_step\": %d, \"step_s\": %.6f, "
      "\"warmup_step_s\": %.6f, "
      "\"tokens_per_s\": %.3f, \"roofline_fraction\": %s, \"bytes_per_step\": %.6g, "
      "\"flops_per_step\": %.6g}, \"decode\": [%s], \"mem_peak_bytes\": %d, "
      "\"cuda_graphs\": %s, \"decode_graph_steps\": %d, \"graph_mem_peak_bytes\": %d, "
      "\"pause_before_decode_ms\": %d, \"kv_cache_dtype\": \"%s\", "
      "\"kv_cache_bytes_per_token\": %d, \"kv_cache_tokens_per_gib\": %d, "
      "\"kv_cache_blocks\": %d, \"speculative\": [%s], \"mixed\": [%s]}\n",
      model, r.backend, c.dtype, r.bytes_per_value, r.ranks, r.data_plane, r.param_count,
      r.load_seconds, c.context_length, peak(c.peak_bytes_per_s), peak(c.peak_flops_per_s),
      r.prefill_tokens_per_step, r.prefill_step_seconds, r.prefill_warmup_step_seconds,
      r.prefill_tokens_per_s, fraction(r.prefill_roofline_fraction), r.prefill_bytes_per_step,
      r.prefill_flops_per_step, decode, r.device_bytes_reserved_peak, graphs(r.cuda_graphs),
      r.decode_graph_steps, r.graph_bytes_reserved_peak, c.pause_before_decode_ms, r.kv_cache_dtype,
      r.kv_cache_bytes_per_token, r.kv_cache_tokens_per_gib(), r.kv_cache_blocks, speculative,
      FormatMixedStepJson(r.mixed));
}

std::string BenchCsvHeader() {
  return "model,backend,dtype,requests,context,prefill_tokens,prefill_tok_s,prefill_roofline,"
         "decode_tok_s,decode_p50_s,decode_p99_s,decode_roofline,mem_peak_bytes,load_s,ranks,"
         "decode_tok_s_per_gpu,all_to_all_s_per_step,exchange_bytes_per_step";
}

std::vector<std::string> BenchCsvRows(const BenchConfig& c, const BenchResult& r) {
  // Empty roofline cells where the backend has none.
  auto fraction = [&](double v) {
    return r.has_roofline ? absl::StrFormat("%.5f", v) : std::string();
  };
  std::vector<std::string> rows;
  for (const DecodeResult& d : r.decode) {
    rows.push_back(absl::StrFormat(
        "%s,%s,%s,%d,%d,%d,%.2f,%s,%.2f,%.6f,%.6f,%s,%d,%.2f,%d,%.2f,%.6g,%.6g", c.model, r.backend,
        c.dtype, d.batch, c.context_length, r.prefill_tokens_per_step, r.prefill_tokens_per_s,
        fraction(r.prefill_roofline_fraction), d.tokens_per_s, d.p50_seconds, d.p99_seconds,
        fraction(d.roofline_fraction), r.device_bytes_reserved_peak, r.load_seconds, r.ranks,
        d.tokens_per_s_per_gpu, d.all_to_all_seconds_per_step, d.exchange_bytes_per_step));
  }
  return rows;
}

}  // namespace deepinfer
