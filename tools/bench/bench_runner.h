// RunBenchmark: loads a DeepSeek-V3-architecture model (a checkpoint or dummy weights) on a
// backend and measures prefill throughput, decode throughput at one or more batch sizes of N
// requests, decode step latency percentiles and memory, next to the config's roofline
// (roofline.h).
//
// Prefill: one untimed warm-up step of a single prompt, then `prefill_repeats` steps of
// ceil(prefill_batch_tokens / context_length) prompts of context_length random tokens, each
// timed to the end of the step (the step copies its logits to the host, which waits for the
// device); the median is reported. prefill_batch_tokens == 0 skips prefill.
// Decode, per batch size N: N sequences get context_length cached tokens (decode_fill
// "prefill": through untimed prefill steps; "random": random values written straight into
// their cache blocks, which costs no model steps and times the same work), then output_len
// greedy decode steps of all N sequences run; every step is timed, the first `warmup` are
// dropped.
#ifndef DEEPINFER_TOOLS_BENCH_BENCH_RUNNER_H_
#define DEEPINFER_TOOLS_BENCH_BENCH_RUNNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace deepinfer {

struct BenchConfig {
  std::string model;  // checkpoint dir, or "dummy:CONFIG.json[@SEED]"
  std::string backend = "cpu";
  // Matrix weight dtype of the backend ("float32" or "bfloat16", BackendOptions::dtype), and
  // the roofline's bytes per weight.
  std::string dtype = "bfloat16";
  // Latent KV cache element type ("auto" = dtype, "bfloat16", "float32"); the roofline counts
  // the cache at this size.
  std::string kv_cache_dtype = "auto";
  int64_t cuda_device = 0;
  int64_t load_threads = 0;  // dummy weights: generator threads (0: all cores)
  std::vector<int64_t> decode_num_requests = {64};  // one decode measurement per entry
  int64_t context_length = 1024;
  int64_t prefill_batch_tokens = 8192;  // 0: no prefill measurement
  int64_t output_len = 32;              // decode steps per batch size, warm-up included
  int64_t prefill_repeats = 3;          // timed prefill steps (--iters)
  int64_t warmup = 2;                   // untimed decode steps
  std::string decode_fill = "prefill";  // "prefill" or "random"
  int64_t block_size = 16;
  // CUDA only: after the timed runs, one more prefill step and this many decode steps (at the
  // last batch size) with per-op timing on (CudaBackend::SetOpTiming), reported separately.
  int64_t op_timing_steps = 0;
  double peak_bytes_per_s = 4.3e12;
  double peak_flops_per_s = 790e12;
};

// Bytes per weight / cache value of a BenchConfig::dtype; INVALID_ARGUMENT for other names.
absl::StatusOr<double> BytesPerValue(const std::string& dtype);

struct DecodeResult {
  int64_t batch = 0;
  int64_t steps = 0;  // timed
  double p50_seconds = 0;
  double p99_seconds = 0;
  double tokens_per_s = 0;  // batch / median step time
  double roofline_fraction = 0;
  double bytes_per_step = 0;
  double flops_per_step = 0;
  std::vector<int32_t> seq0_tokens;  // greedy tokens of sequence 0, for a sanity look
};

struct BenchResult {
  std::string backend;
  double bytes_per_value = 4;
  std::string kv_cache_dtype = "float32";  // the KvBlockPool's element type
  double cache_bytes_per_value = 4;
  double load_seconds = 0;
  double param_count = 0;
  int64_t prefill_tokens_per_step = 0;  // 0: prefill not measured
  double prefill_step_seconds = 0;      // median
  double prefill_tokens_per_s = 0;
  double prefill_roofline_fraction = 0;
  double prefill_bytes_per_step = 0;  // roofline cost of one prefill step
  double prefill_flops_per_step = 0;
  std::vector<DecodeResult> decode;                 // one per BenchConfig::decode_num_requests
  int64_t device_bytes_reserved_peak = -1;          // -1: the backend cannot say
  std::string prefill_op_report, decode_op_report;  // with op_timing_steps > 0 on CUDA
};

// "64" or "1,128" -> {64} or {1, 128}; false (and *out unspecified) on anything else.
bool ParseRequestCounts(const std::string& text, std::vector<int64_t>* out);

// --model with --load-format dummy -> BenchConfig::model: a directory means its config.json,
// a .json file itself; "dummy:..." specs pass unchanged.
std::string DummyModelSpec(const std::string& model, int64_t seed);

absl::StatusOr<BenchResult> RunBenchmark(const BenchConfig& config);

// Human-readable report (one "key: value" line per figure), the same as one JSON object, and
// CSV rows (one per decode batch size) with their header.
std::string FormatBenchReport(const BenchConfig& config, const BenchResult& result);
std::string FormatBenchJson(const BenchConfig& config, const BenchResult& result);
std::string BenchCsvHeader();
std::vector<std::string> BenchCsvRows(const BenchConfig& config, const BenchResult& result);

}  // namespace deepinfer

#endif  // DEEPINFER_TOOLS_BENCH_BENCH_RUNNER_H_
