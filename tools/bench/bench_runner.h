// RunBenchmark: loads a DeepSeek-V3-architecture model (a checkpoint or dummy weights) on a
// backend and measures prefill throughput, decode throughput at one or more batch sizes of N
// requests, decode step latency percentiles and memory, next to the config's roofline
// (roofline.h).
//
// Prefill: `prefill_repeats` + 1 steps of ceil(prefill_batch_tokens / context_length) prompts
// of context_length random tokens, the first untimed (a warm-up of the same size: a step of a
// new size pays one-time costs), each other timed to the end of the step (the step samples each
// prompt's next token on the device, as the engine does, and copies the tokens to the host,
// which waits for the device); the median is reported. prefill_batch_tokens == 0 skips prefill.
// Decode, per batch size N: N sequences get context_length cached tokens (decode_fill
// "prefill": through untimed prefill steps; "random": random values written straight into
// their cache blocks, which costs no model steps and times the same work), then output_len
// greedy decode steps of all N sequences run; every step is timed, the first `warmup` are
// dropped.
//
// Mixed steps (`mixed_steps`, mixed_step.h), after the decode batch sizes: per shape (D, P), D
// sequences filled as for decode, then one untimed and prefill_repeats timed steps of their
// decode rows together with P prompt tokens of new sequences, as the engine's scheduler forms
// a serving step; the median is reported.
// Expert parallelism (`ranks` > 1): `ranks` ranks in this process, one thread each, rank r on
// CUDA device cuda_device + r (or on its own CPU backend), as DeepSeek serves: data-parallel
// attention (every rank has its own KV pool and its own N sequences of each measurement) and
// expert-parallel MoE (rank r loads and serves routed experts [r*E/ranks, (r+1)*E/ranks) through
// an EpExpertDispatcher; the tokens' rows go to their experts' ranks and back in an all-to-all
// per MoE layer). The ranks form a TcpCommunicator group on loopback (the control plane) and,
// with `communicator` nccl (or auto on cuda), an NCCL group over it for the exchange, as a
// worker's RankGroup does. Every rank runs the same loop and steps the same number of times;
// a barrier on the TCP group (untimed) starts each timed step on all ranks together. Rank 0's
// prompts are the one-rank run's; on every rank sequence 0's prompt is rank 0's sequence 0, the
// others are the rank's own, so every rank's sequence 0 must decode the same greedy tokens as
// the one-rank run. A step's time is the slowest rank's.
// Speculative decoding's cost (`speculative_tokens` K > 0; docs/engine.md "Speculative
// decoding"): the model is built with its draft head (its first MTP module; the config needs
// num_nextn_predict_layers >= 1), and after each batch size's decode steps (and any comparison
// and op-timed steps) the same N sequences, all at their current position P, run three sets of
// output_len calls (the first `warmup` of each untimed), each call rewriting the same cache
// entries: (a) plain decode steps (as above), (b) verify steps as the engine forms them (per
// sequence its last token and K drafts, 1 + K varlen rows, every row's token picked on the
// device as the decode step picks it (SequenceStep::row_sampling) and the hidden states copied
// to the host; decode graphs where the rows fit the largest bucket), (c) draft-head
// calls of one row per sequence (CausalLm::Draft, module 0, a recursive round's shape) with the
// verify step's last hidden state. The draft head's cache layers hold random values (as
// decode_fill "random" writes them), since no step fills them. One rank only.
// The expert exchange is measured by an ExchangeMeter (exchange_meter.h) between the
// dispatcher and the communicator: calls and bytes sent to other ranks per step always; with
// `time_all_to_all`, after the timed steps of each N, as many more steps run with the backend
// synchronised around every exchange call, giving the time per step spent in the all-to-all
// (and the step time under that synchronisation, next to the unsynchronised one).
#ifndef DEEPINFER_TOOLS_BENCH_BENCH_RUNNER_H_
#define DEEPINFER_TOOLS_BENCH_BENCH_RUNNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/bench/mixed_step.h"

namespace deepinfer {

// BenchConfig::dtype of the FP8 runs: the worker's --dtype auto (FP8 block-scaled projections and
// MLPs kept FP8 on CUDA, the rest bf16); dummy weights then store those matrices FP8.
inline constexpr char kBenchFp8[] = "fp8";
// BenchConfig::dtype of the MXFP4 runs: the worker's --dtype mxfp4 (as kBenchFp8, with the routed
// experts quantised to MXFP4 at load); the precision deepinfer-admin memory-plan --precision mxfp4
// plans for.
inline constexpr char kBenchMxfp4[] = "mxfp4";

struct BenchConfig {
  std::string model;  // checkpoint dir, or "dummy:CONFIG.json[@SEED]"
  std::string backend = "cpu";
  // Matrix weight dtype of the backend ("float32" or "bfloat16", BackendOptions::dtype; or
  // kBenchFp8, kBenchMxfp4), and the roofline's bytes per weight.
  std::string dtype = "bfloat16";  // or "float32", kBenchFp8, kBenchMxfp4
  // Latent KV cache element type ("auto" = dtype, "bfloat16", "float32"); the roofline counts
  // the cache at this size.
  std::string kv_cache_dtype = "auto";
  // Blocks of the KV pool (0: what the largest prefill or decode batch needs, plus the decode
  // graphs' padding block). A larger pool lets a decode run with the pool a large prefill would
  // have, without that prefill; smaller than needed is refused.
  int64_t kv_cache_blocks = 0;
  int64_t cuda_device = 0;
  int64_t load_threads = 0;  // dummy weights: generator threads (0: all cores)
  std::vector<int64_t> decode_num_requests = {64};  // one decode measurement per entry
  int64_t context_length = 1024;
  int64_t prefill_batch_tokens = 8192;  // 0: no prefill measurement
  int64_t output_len = 32;              // decode steps per batch size, warm-up included
  int64_t prefill_repeats = 3;          // timed prefill steps (--iters)
  // Device idle this long (backend synchronised, host asleep) before each decode run's steps:
  // a long prefill at the board's power limit leaves the SM clock capped for a few hundred ms
  // after it ends (docs/performance.md, "Decode right after a large prefill").
  int64_t pause_before_decode_ms = 0;
  int64_t warmup = 2;                   // untimed decode steps
  std::string decode_fill = "prefill";  // "prefill" or "random"
  int64_t block_size = 16;
  // CUDA only: after the timed runs, one more prefill step, and at each decode batch size this
  // many decode steps, with per-op timing on (CudaBackend::SetOpTiming), reported separately
  // (one decode profile per batch size).
  int64_t op_timing_steps = 0;
  // Expert-parallel ranks in this process (see the top comment); 1: one rank with every expert
  // and no communicator, the plain benchmark.
  int64_t ranks = 1;
  // Data plane of the expert exchange with ranks > 1: "auto" (NCCL on cuda, TCP on cpu),
  // "tcp" or "nccl" (comm/data_plane.h).
  std::string communicator = "auto";
  // With ranks > 1 on NCCL: how the dispatcher moves rows, "collective", "auto" or "device"
  // (EpExchangeKind, as the worker's --ep-exchange). The device exchange makes no communicator
  // calls, so the all-to-all figures below stay empty for it.
  std::string ep_exchange = "collective";
  // With ranks > 1: also measure the time in the all-to-all (extra synchronised steps).
  bool time_all_to_all = false;
  // Decode sampling: greedy by default; ParseDecodeSampling reads "T,TOP_K,TOP_P" (seeded per
  // request). Sampled on the device unless decode_sampling_on_host, which asks for the logits
  // rows as well so the host Sampler picks (the path before device sampling).
  float decode_temperature = 0.0f;
  int32_t decode_top_k = 0;
  float decode_top_p = 1.0f;
  bool decode_sampling_on_host = false;
  // CUDA: BackendOptions::gemm_autotune (cuBLASLt with a timed algorithm per prefill shape).
  bool gemm_autotune = true;
  // CUDA: BackendOptions::batch_invariant (the batch-invariant mode).
  bool batch_invariant = false;
  // Decode steps replayed from CUDA graphs per batch-size bucket (DecodeGraphOptions; cuda only,
  // and never while op timing runs).
  bool cuda_graphs = true;
  int64_t cuda_graph_max_batch = 256;
  // With cuda_graphs: after each batch size's timed steps, output_len more steps of the same
  // sequences with graphs off, reported as a second decode result (one load for both).
  bool compare_eager_decode = false;
  // CausalLm::SetFusedOps (the fused ops of a decode step; off: the op sequence of before, for
  // comparisons).
  bool fused_ops = true;
  // CausalLm::SetMicroBatches: 1, or 2 (two micro-batches per step; with --ranks > 1 one half's
  // expert exchange overlaps the other's compute).
  int64_t micro_batches = 1;
  // CausalLm::SetPrefillAttention: auto, absorbed or mha.
  std::string prefill_attention = "auto";
  // After each batch size's timed steps (and the eager ones), output_len more steps of the same
  // sequences with fused ops off, reported as a further decode result (one load for both).
  bool compare_unfused_decode = false;
  // kernels::SetProgrammaticDependentLaunch: our kernels launched with programmatic dependent
  // launch (docs/cuda/fused-ops-and-pdl.md); off: plain stream order, for comparison.
  bool pdl = true;
  // After each batch size's timed steps (and the eager and unfused ones), output_len more steps
  // of the same sequences with PDL off (decode graphs recorded again), a further decode result.
  bool compare_pdl_off_decode = false;
  // Speculative decoding's cost (see the top comment): K drafts per sequence, 0 = not measured.
  int64_t speculative_tokens = 0;
  // Structured output: this fraction of each decode batch's requests (spread evenly, sequence
  // 0 first) is constrained by the JSON Schema in the file constrained_spec (empty: any JSON
  // object), with masks over the tokenizer in the directory `tokenizer` filled on the host
  // while the device runs the step, as the engine does (constrained_requests.h). Such steps
  // run eagerly: a decode graph is not replayed for a batch with a masked row.
  double constrained_fraction = 0;
  std::string constrained_spec;
  std::string tokenizer;
  // Mixed steps (mixed_step.h), after the decode batch sizes: per shape, D sequences at
  // context_length cached tokens (filled as decode_fill says, sampling as the decode steps')
  // and P prompt tokens over prompts of mixed_prompt_length tokens (0: context_length), one
  // untimed step and prefill_repeats (--iters) timed ones.
  std::vector<MixedStepShape> mixed_steps;
  int64_t mixed_prompt_length = 0;
  double peak_bytes_per_s = 4.3e12;
  double peak_flops_per_s = 790e12;
};

// Bytes per weight / cache value of a BenchConfig::dtype; INVALID_ARGUMENT for other names.
absl::StatusOr<double> BytesPerValue(const std::string& dtype);

// One rank's view of a decode measurement (ranks > 1).
struct RankDecodeResult {
  int64_t rank = 0;
  double p50_seconds = 0;  // of this rank's own step times
  double p99_seconds = 0;
  std::vector<int32_t> seq0_tokens;
  double exchange_calls_per_step = 0;  // AllToAllSizes + AllToAllV calls
  double exchange_bytes_per_step = 0;  // sent to other ranks
  // time_all_to_all only (else -1): p50 over the synchronised steps of the time spent in
  // exchange calls, and of those steps' time.
  double all_to_all_p50_seconds = -1;
  double synced_step_p50_seconds = -1;
};

struct DecodeResult {
  int64_t batch = 0;  // sequences per rank
  int64_t steps = 0;  // timed
  // Of the step time (with ranks > 1, per step the slowest rank's).
  double p50_seconds = 0;
  double p99_seconds = 0;
  double tokens_per_s = 0;          // all ranks: ranks * batch / p50
  double tokens_per_s_per_gpu = 0;  // tokens_per_s / ranks
  // Per rank (one GPU's share: its sequences, its experts for every rank's tokens); 0 without
  // BenchResult::has_roofline.
  double roofline_fraction = 0;
  double bytes_per_step = 0;
  double flops_per_step = 0;
  std::vector<int32_t> seq0_tokens;  // greedy tokens of rank 0's sequence 0, for a sanity look
  // ranks > 1: every rank's figures, and the exchange averaged over the ranks.
  std::vector<RankDecodeResult> per_rank;
  double exchange_bytes_per_step = 0;       // per rank, sent to other ranks
  double all_to_all_seconds_per_step = -1;  // time_all_to_all: mean over ranks of their p50
  double synced_step_p50_seconds = -1;      // time_all_to_all: step p50 (slowest rank) synced
  bool cuda_graphs = false;                 // measured with BenchConfig::cuda_graphs on
  bool fused_ops = true;                    // measured with fused ops (BenchConfig::fused_ops)
  bool pdl = true;                          // measured with programmatic dependent launch
  // BenchConfig::constrained_fraction: rank 0's constrained requests, and its host time per
  // timed step spent filling their masks (inside the step time; -1 without constraints).
  int64_t constrained_requests = 0;
  double mask_fill_seconds_per_step = -1;
};

// Speculative decoding's step costs at one batch size (BenchConfig::speculative_tokens).
struct SpeculativeResult {
  int64_t batch = 0;
  int64_t drafts = 0;    // K
  int64_t position = 0;  // cached tokens per sequence before the measured rows
  int64_t calls = 0;     // timed, of each kind
  double decode_p50_seconds = 0, decode_p99_seconds = 0;  // (a) plain decode step
  double verify_p50_seconds = 0, verify_p99_seconds = 0;  // (b) N x (1 + K) rows
  double draft_p50_seconds = 0, draft_p99_seconds = 0;    // (c) one draft-head call, N rows
};

// The acceptance rates the reports price the speed-up at.
inline constexpr double kSpeculativeAlphas[] = {0.5, 0.6, 0.7, 0.8, 0.9};

// docs/engine.md's speed-up model: a sequence's expected tokens per step with k drafts, each
// accepted with probability alpha given the ones before, (1 - alpha^(k+1)) / (1 - alpha)
// (k + 1 at alpha = 1), and the speed-up over plain decoding,
// E[tokens] x t(decode) / (t(verify) + k x t(draft)).
double SpeculativeExpectedTokens(double alpha, int64_t k);
double SpeculativeSpeedup(double alpha, int64_t k, double decode_seconds, double verify_seconds,
                          double draft_seconds);

struct BenchResult {
  std::string backend;
  // Whether the roofline fractions were computed: BenchConfig's peaks are an H200's, so only a
  // run on the cuda backend has them; on the cpu backend there are no honest peak figures and
  // the results carry the step costs (bytes, FLOPs) alone.
  bool has_roofline = false;
  // Decode steps were to replay CUDA graphs (cuda backend with BenchConfig::cuda_graphs).
  bool cuda_graphs = false;
  int64_t ranks = 1;
  std::string data_plane;       // ranks > 1: "tcp" or "nccl"
  std::string expert_exchange;  // ranks > 1: how rows move (ExpertDispatcher::exchange_name)
  double bytes_per_value = 4;
  std::string kv_cache_dtype = "float32";  // the KvBlockPool's element type
  double cache_bytes_per_value = 4;  // an FP8 entry's scale and padding spread over its values
  int64_t kv_cache_blocks = 0;       // the KvBlockPool's blocks (per rank)
  // Bytes one token's entries take over every layer (KvCacheSpec::BytesPerToken): what the
  // engine's memory plan divides the cache's memory by.
  int64_t kv_cache_bytes_per_token = 0;
  int64_t kv_cache_tokens_per_gib() const {
    return kv_cache_bytes_per_token > 0 ? (int64_t{1} << 30) / kv_cache_bytes_per_token : 0;
  }
  double load_seconds = 0;
  double param_count = 0;
  int64_t prefill_tokens_per_step = 0;  // per rank; 0: prefill not measured
  double prefill_step_seconds = 0;      // median (per step, the slowest rank's)
  // The untimed warm-up step of the same size (the slowest rank's): the first step of a new size
  // pays one-time costs (memory pool growth, cuBLAS kernel choice), shown apart.
  double prefill_warmup_step_seconds = 0;
  double prefill_tokens_per_s = 0;       // all ranks
  double prefill_roofline_fraction = 0;  // 0 without has_roofline
  // The attention form the prefill steps ran and the roofline counted: MLA "absorbed" or
  // "non-absorbed"; "v4" for DeepSeek-V4 (roofline_v4.h).
  std::string prefill_attention_form = "absorbed";
  double prefill_bytes_per_step = 0;  // roofline cost of one prefill step
  double prefill_flops_per_step = 0;
  std::vector<DecodeResult> decode;  // one per BenchConfig::decode_num_requests
  // speculative_tokens > 0: one per BenchConfig::decode_num_requests.
  std::vector<SpeculativeResult> speculative;
  std::vector<MixedStepResult> mixed;       // one per BenchConfig::mixed_steps
  int64_t device_bytes_reserved_peak = -1;  // -1: the backend cannot say (max over ranks)
  // CUDA graph allocator (the recorded decode steps' activations), apart from the above.
  int64_t graph_bytes_reserved_peak = -1;
  // What the memory plan reserves for the graphs of the buckets this run used
  // (DecodeGraphReserveBytes, plus with an FP8 cache the attention's copy,
  // kFp8CacheCopyMaxBytes), to compare with the above.
  int64_t graph_bytes_planned = 0;
  int64_t decode_graph_steps = 0;  // decode steps that replayed a graph (or ran its padded path)
  // With op_timing_steps > 0 on CUDA (rank 0's).
  std::string prefill_op_report;
  std::vector<std::string> decode_op_reports;  // one per decode batch size, in their order
};

// "64" or "1,128" -> {64} or {1, 128}; false (and *out unspecified) on anything else.
bool ParseRequestCounts(const std::string& text, std::vector<int64_t>* out);

// --model with --load-format dummy -> BenchConfig::model: a directory means its config.json,
// a .json file itself; "dummy:..." specs pass unchanged.
std::string DummyModelSpec(const std::string& model, int64_t seed);

// "T,TOP_K,TOP_P" (e.g. "0.8,50,0.95") into the decode_* sampling fields; "" keeps greedy.
// False for anything else.
bool ParseDecodeSampling(const std::string& text, BenchConfig* config);

// INVALID_ARGUMENT for bad settings (among them ranks < 1, more ranks than GPUs from
// cuda_device on cuda, ranks > 1 with a dense model or with routed experts that do not divide
// over the ranks, a communicator the backend cannot use); otherwise the first error of any
// rank (the other ranks' communicators are then aborted, so they stop at once).
absl::StatusOr<BenchResult> RunBenchmark(const BenchConfig& config);

// Human-readable report (one "key: value" line per figure), the same as one JSON object, and
// CSV rows (one per decode batch size) with their header. Each shows only what applies to the
// backend that ran: roofline fractions and peaks with has_roofline (JSON: null, CSV: empty
// otherwise), the CUDA graph figures on cuda.
std::string FormatBenchReport(const BenchConfig& config, const BenchResult& result);
std::string FormatBenchJson(const BenchConfig& config, const BenchResult& result);
std::string BenchCsvHeader();
std::vector<std::string> BenchCsvRows(const BenchConfig& config, const BenchResult& result);

}  // namespace deepinfer

#endif  // DEEPINFER_TOOLS_BENCH_BENCH_RUNNER_H_
