// RunBenchmark: loads a DeepSeek-V3-architecture model (a checkpoint or dummy weights) on a
// backend and measures prefill throughput, decode throughput at a batch of N requests, decode
// step latency percentiles and memory, next to the config's roofline (roofline.h).
//
// Prefill: batches of ceil(prefill_batch_tokens / context_length) prompts of context_length
// random tokens, one Step each, timed to the end of the step (the step copies its logits to the
// host, which waits for the device). Decode: N sequences are first filled to context_length
// through prefill steps (untimed), then output_len decode steps of all N sequences run, greedy;
// every step is timed, the first `warmup` are dropped.
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
  int64_t cuda_device = 0;
  int64_t load_threads = 0;  // dummy weights: generator threads (0: all cores)
  int64_t decode_num_requests = 64;
  int64_t context_length = 1024;
  int64_t prefill_batch_tokens = 8192;
  int64_t output_len = 32;
  int64_t prefill_repeats = 3;
  int64_t warmup = 2;
  int64_t block_size = 16;
  // CUDA only: after the timed runs, one more prefill step and this many decode steps with
  // per-op timing on (CudaBackend::SetOpTiming), reported separately.
  int64_t op_timing_steps = 0;
  double bytes_per_param = 4;  // the dtype the backend keeps weights and cache in (fp32 today)
  double peak_bytes_per_s = 4.3e12;
  double peak_flops_per_s = 790e12;
};

struct BenchResult {
  std::string backend;
  double load_seconds = 0;
  int64_t prefill_tokens_per_step = 0;
  double prefill_step_seconds = 0;  // median
  double prefill_tokens_per_s = 0;
  double prefill_roofline_fraction = 0;
  int64_t decode_batch = 0;
  int64_t decode_steps = 0;
  double decode_p50_seconds = 0;
  double decode_p99_seconds = 0;
  double decode_tokens_per_s = 0;  // batch / median step time
  double decode_roofline_fraction = 0;
  double decode_bytes_per_step = 0;
  double decode_flops_per_step = 0;
  double param_count = 0;
  int64_t device_bytes_reserved_peak = -1;          // -1: the backend cannot say
  std::vector<int32_t> first_decode_tokens;         // of sequence 0, for a sanity look
  std::string prefill_op_report, decode_op_report;  // with op_timing_steps > 0 on CUDA
};

absl::StatusOr<BenchResult> RunBenchmark(const BenchConfig& config);

// Human-readable report (one "key: value" per line) and one CSV row with its header.
std::string FormatBenchReport(const BenchConfig& config, const BenchResult& result);
std::string BenchCsvHeader();
std::string BenchCsvRow(const BenchConfig& config, const BenchResult& result);

}  // namespace deepinfer

#endif  // DEEPINFER_TOOLS_BENCH_BENCH_RUNNER_H_
