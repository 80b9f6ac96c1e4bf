// bench: prefill / decode throughput, step latency and memory of the DeepSeek-V3 model on a
// backend, against the config's roofline. Flags only; the work is in bench_runner.
//
//   bench --model dummy:CONFIG.json@SEED --backend cuda --decode-num-requests 64
//         --context-length 1024 --prefill-batch-tokens 8192 --output-len 32 [--csv FILE]
//   bench --model CONFIG.json --load-format dummy ...       (the same, seed from --seed)
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/cli/flag_set.h"
#include "tools/bench/bench_runner.h"

int main(int argc, char** argv) {
  deepinfer::BenchConfig config;
  std::string load_format = "auto", csv;
  int64_t seed = 0;
  deepinfer::FlagSet flags(
      "bench --model DIR|dummy:CONFIG.json@SEED [flags]",
      "Measures prefill tokens/s, decode tokens/s at a batch of N requests, decode step latency "
      "p50/p99 and device memory, each next to the roofline computed from the config.");
  flags.AddString("model", &config.model, "Checkpoint directory, or dummy:CONFIG.json[@SEED].");
  flags.Require("model");
  flags.AddString("load-format", &load_format,
                  "auto, or dummy: --model is then a config.json and weights are random.");
  flags.AddInt("seed", &seed, "Seed of dummy weights with --load-format dummy.");
  flags.AddString("backend", &config.backend, "cpu or cuda.");
  flags.AddInt("cuda-device", &config.cuda_device, "GPU ordinal for --backend cuda.");
  flags.AddInt("load-threads", &config.load_threads, "Dummy weight generator threads (0: all).");
  flags.AddInt("decode-num-requests", &config.decode_num_requests, "Decode batch size N.");
  flags.AddInt("context-length", &config.context_length,
               "Prompt length for prefill, and cached tokens per request before decoding.");
  flags.AddInt("prefill-batch-tokens", &config.prefill_batch_tokens,
               "Tokens per prefill step (whole prompts of --context-length).");
  flags.AddInt("output-len", &config.output_len, "Decode steps (including warm-up).");
  flags.AddInt("warmup", &config.warmup, "Decode steps not timed.");
  flags.AddInt("prefill-repeats", &config.prefill_repeats, "Timed prefill steps (median).");
  flags.AddInt("op-timing-steps", &config.op_timing_steps,
               "CUDA: extra decode steps (and one prefill step) with per-op timing, reported "
               "apart from the throughput figures.");
  flags.AddString("csv", &csv, "Append a CSV row (header if the file is new).");
  absl::Status parsed = flags.Parse(std::vector<std::string>(argv + 1, argv + argc));
  if (flags.help_requested()) {
    std::cout << flags.Help();
    return 0;
  }
  if (!parsed.ok()) {
    std::cerr << parsed << "\n" << flags.Help();
    return 2;
  }
  if (load_format == "dummy" && !absl::StartsWith(config.model, "dummy:")) {
    config.model = absl::StrCat("dummy:", config.model, "@", seed);
  } else if (load_format != "dummy" && load_format != "auto") {
    std::cerr << "--load-format must be auto or dummy\n";
    return 2;
  }
  auto result = deepinfer::RunBenchmark(config);
  if (!result.ok()) {
    std::cerr << "bench failed: " << result.status() << "\n";
    return 1;
  }
  std::cout << deepinfer::FormatBenchReport(config, *result) << std::flush;
  if (!csv.empty()) {
    const bool fresh = !std::ifstream(csv).good();
    std::ofstream f(csv, std::ios::app);
    if (fresh) f << deepinfer::BenchCsvHeader() << "\n";
    f << deepinfer::BenchCsvRow(config, *result) << "\n";
  }
  return 0;
}
