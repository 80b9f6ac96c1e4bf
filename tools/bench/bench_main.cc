// deepinfer-bench (also `deepinfer bench`): prefill / decode throughput, step latency and device
// memory of the DeepSeek-V3 model on a backend, each next to the roofline computed from the
// config. Flags only; the work is in bench_runner.
//
//   deepinfer-bench --model DIR --load-format dummy --backend cuda --decode-num-requests 1,128
//       --context-length 1024 --prefill-batch-tokens 32768 --output-len 16 [--json] [--csv F]
//   expert parallel over 2 GPUs: ... --ranks 2 [--communicator nccl] [--time-all-to-all]
//   speculative decoding's cost: --model configs/moonlight_shaped_mtp.json ... --speculative-tokens
//   3
//   mixed serving steps (decode rows and prompt chunks in one step): ... --mixed-steps 256:1792
#include <malloc.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "common/flags/flag_set.h"
#include "tools/bench/bench_runner.h"
#include "worker/backend/backend_factory.h"
#include "worker/backend/backend_kind.h"

int main(int argc, char** argv) {
  // Loading stages every weight tensor in a fresh host vector, and every step copies the
  // logits into one (66 MB at 128 requests). glibc serves blocks above its mmap ceiling (32 MB)
  // with a new mapping each time, page-faulted and zeroed anew; from the heap, freed blocks are
  // reused. Measured on the H200 host (docs/performance.md): V3's first 4 layers load in 33 s
  // instead of 73 s, a Moonlight-shaped decode step at 128 requests takes 0.19 s, not 0.27 s.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);  // keep freed heap memory (a few GB) for the next tensor
  deepinfer::BenchConfig config;
  std::string load_format = "auto", csv, requests = "64";
  int64_t seed = 0;
  bool json = false;
  deepinfer::FlagSet flags(
      "deepinfer bench --model DIR [flags]   (or deepinfer-bench ...)",
      "Loads a DeepSeek-V3-family or DeepSeek-V4 model on one backend and measures prefill\n"
      "tokens/s, decode tokens/s at N concurrent requests, decode step latency p50/p99 and\n"
      "peak device memory. With --backend cuda each throughput is also given as a fraction of\n"
      "the H200 roofline computed from config.json: decode reads the weights the active\n"
      "experts of that batch touch plus the cache entries attention reads (V3: the latent KV\n"
      "cache; V4: the window, the compressed entries attended and the indexer keys scored)\n"
      "(bytes / 4.3 TB/s), prefill is mostly FLOPs (/ 790 TFLOP/s); the larger of the two\n"
      "times is the roofline. On the CPU the step costs are shown without a roofline.\n"
      "Numbers go to stdout (text, or one JSON object with --json).");
  flags.AddString("model", &config.model,
                  "Checkpoint directory (config.json + safetensors), or with --load-format dummy\n"
                  "a directory holding config.json or the config file itself; the older form\n"
                  "dummy:CONFIG.json[@SEED] also works.");
  flags.Require("model");
  flags.AddString("load-format", &load_format,
                  "auto: read the checkpoint's weights; dummy: random weights of the config's\n"
                  "shapes (no weight files needed), seeded by --seed.");
  flags.AddInt("seed", &seed, "Seed of the dummy weights.");
  flags.AddString("backend", &config.backend, "cpu or cuda.");
  flags.AddString("dtype", &config.dtype,
                  "bfloat16 or float32: the backend's weight dtype, and the bytes per weight\n"
                  "of the roofline. fp8 (--backend cuda): the worker's --dtype auto, FP8 e4m3\n"
                  "block-scaled projections and MLPs kept FP8 (dummy weights generate them\n"
                  "FP8, as DeepSeek's FP8 release stores them), the rest bfloat16; 1 byte per\n"
                  "weight in the roofline; refused for DeepSeek-V4, which keeps no FP8\n"
                  "matrix. mxfp4 (--backend cuda, --ranks 1): the worker's\n"
                  "--dtype mxfp4, as fp8 with the routed experts quantised to MXFP4 at load;\n"
                  "0.53 bytes per weight (the experts') in the roofline; DeepSeek-V4 keeps\n"
                  "no matrix FP8: its experts MXFP4, the rest bfloat16 (2 bytes a weight).");
  flags.AddString("kv-cache-dtype", &config.kv_cache_dtype,
                  "auto (= --dtype), bfloat16, float32 or fp8 (e4m3 latent with one scale\n"
                  "per token, bf16 rope key): the latent KV cache's element type, and its bytes\n"
                  "per value in the roofline.");
  flags.AddInt("kv-cache-blocks", &config.kv_cache_blocks,
               "Blocks of the KV pool (0, the default: what the largest prefill or decode\n"
               "batch needs; more: e.g. a decode run with the pool a large prefill would have,\n"
               "without that prefill; fewer than needed is refused).");
  flags.AddInt("cuda-device", &config.cuda_device,
               "GPU ordinal for --backend cuda (of rank 0; rank r runs on this + r).");
  flags.AddInt("ranks", &config.ranks,
               "Expert-parallel ranks in this process, one thread each (rank r on GPU r with\n"
               "--backend cuda): every rank runs its own --decode-num-requests requests\n"
               "(data-parallel attention) and 1/ranks of the routed experts, exchanging\n"
               "tokens all-to-all in every MoE layer; figures per rank and per GPU. 1: one\n"
               "rank with every expert, no exchange.");
  flags.AddString("communicator", &config.communicator,
                  "With --ranks > 1, what carries the expert exchange: auto (nccl on cuda, tcp\n"
                  "on cpu), tcp (host-staged over loopback) or nccl.");
  flags.AddString("ep-exchange", &config.ep_exchange,
                  "With --ranks > 1 on nccl: collective (NCCL all-to-all, the default), auto\n"
                  "(the device exchange through NVLink windows where the group allows it,\n"
                  "else all-to-all) or device.");
  flags.AddBool("time-all-to-all", &config.time_all_to_all,
                "With --ranks > 1: after each request count's timed steps, as many more steps\n"
                "with the backend synchronised around every exchange call, reporting the\n"
                "time per step in the all-to-all (the throughput figures come from the\n"
                "unsynchronised steps).");
  flags.AddInt("load-threads", &config.load_threads, "Dummy weight generator threads (0: all).");
  flags.AddString("decode-num-requests", &requests,
                  "Concurrent requests N of a decode step; a comma list (1,128) measures each\n"
                  "in turn with the model loaded once.");
  flags.AddInt("context-length", &config.context_length,
               "Prompt length of each prefill sequence, and tokens each decode request has\n"
               "cached before its timed steps.");
  flags.AddInt("prefill-batch-tokens", &config.prefill_batch_tokens,
               "Tokens per prefill step, as whole prompts of --context-length (32768 with\n"
               "context 1024: 32 prompts). 0 skips the prefill measurement.");
  flags.AddInt("output-len", &config.output_len,
               "Decode steps per request count, --warmup steps included.");
  flags.AddInt("warmup", &config.warmup,
               "Decode steps not timed (prefill always warms up with one untimed step of the\n"
               "timed size, reported apart).");
  flags.AddInt(
      "iters", &config.prefill_repeats,
      "Timed prefill steps, and timed steps of each mixed shape (the median is reported).");
  flags.AddInt("pause-before-decode-ms", &config.pause_before_decode_ms,
               "Milliseconds the device stays idle before each decode run's steps (default 0).\n"
               "A long prefill at the board's power limit leaves the SM clock capped for a few\n"
               "hundred ms after it ends (H200: 1.45-1.97 GHz instead of 1.98 for ~0.4 s after\n"
               "a 32 x 1024 prefill), which slows the latency-bound small-batch decode steps that\n"
               "follow by ~5%; a pause of ~1000 ms measures them at settled clocks.");
  flags.AddString("decode-fill", &config.decode_fill,
                  "How decode requests get their cached context: prefill (model steps, untimed)\n"
                  "or random (random values written into their cache blocks: no model steps,\n"
                  "the same decode work; for large batches of slow models; not for DeepSeek-V4,\n"
                  "whose cache keeps per-sequence state).");
  flags.AddInt("op-timing-steps", &config.op_timing_steps,
               "CUDA: extra decode steps at each decode batch size (and one prefill step) with\n"
               "per-op timing, one profile per batch size, reported apart from the throughput\n"
               "figures.");
  std::string decode_sampling;
  flags.AddString("decode-sampling", &decode_sampling,
                  "T,TOP_K,TOP_P of every decode request (e.g. 0.8,50,0.95), seeded per\n"
                  "request; empty: greedy.");
  flags.AddBool("decode-sampling-on-host", &config.decode_sampling_on_host,
                "Decode steps also return the logits rows and the host Sampler picks (the path\n"
                "before device sampling), for comparison.");
  flags.AddBool("gemm-autotune", &config.gemm_autotune,
                "CUDA, bf16: GEMMs from CudaBackend::kGemmAutotuneMinRows rows through\n"
                "cuBLASLt with the fastest of its heuristic algorithms, timed per shape at its\n"
                "first call (the untimed first step; default on, as the worker); off:\n"
                "cublasGemmEx's default algorithm.");
  absl::StatusOr<bool> batch_invariant_env =
      deepinfer::ParseBatchInvariantEnv(std::getenv(deepinfer::kBatchInvariantEnv));
  if (!batch_invariant_env.ok()) {
    std::cerr << "deepinfer-bench: " << batch_invariant_env.status().message() << "\n";
    return 2;
  }
  config.batch_invariant = *batch_invariant_env;
  flags.AddBool("batch-invariant", &config.batch_invariant,
                "With --backend cuda: the batch-invariant mode: every op computes a row the same\n"
                "way at any batch size, so a request's logprobs (and, seeded, its samples) do not\n"
                "depend on the requests batched with it; slower decode (docs/engine.md, \"Batch\n"
                "invariance\"). Default: on when DEEPINFER_BATCH_INVARIANT=1.");
  flags.AddBool("cuda-graphs", &config.cuda_graphs,
                "CUDA: replay decode steps from CUDA graphs recorded per batch-size bucket\n"
                "(batches padded to 1 2 4 8 16 24 32 48 64 96 128 160 192 256 ...); off: every\n"
                "op launched eagerly. Never used by the op-timed steps.");
  flags.AddInt("cuda-graph-max-batch", &config.cuda_graph_max_batch,
               "Largest decode batch run from a CUDA graph (the last bucket); larger batches\n"
               "run eagerly.");
  flags.AddBool("fused-ops", &config.fused_ops,
                "Fused ops in the model's step (residual add + norm, bf16 GEMM operands); off:\n"
                "the ops of before, for comparison.");
  flags.AddInt("micro-batches", &config.micro_batches,
               "1, or 2: each step's sequences in two halves whose expert exchanges overlap the\n"
               "other half's compute (with --ranks > 1). DeepSeek-V3 models only.");
  flags.AddString("prefill-attention", &config.prefill_attention,
                  "auto, absorbed or mha: the MLA form of prefill steps (mha: keys expanded\n"
                  "through kv_b, attention of width nope + rope; auto: mha where every sequence\n"
                  "brings >= 64 new tokens and the backend has it). The prefill roofline counts\n"
                  "the attention FLOPs of the form that runs.");
  flags.AddBool("compare-unfused-decode", &config.compare_unfused_decode,
                "After each decode batch size, --output-len more steps of the same sequences\n"
                "with --fused-ops off, reported as a second decode line marked (unfused).");
  flags.AddBool("pdl", &config.pdl,
                "CUDA, sm_90+: launch our kernels with programmatic dependent launch (each may\n"
                "start while the one before it finishes; programmatic edges in the decode\n"
                "graphs); off: plain stream order, for comparison.");
  flags.AddBool("compare-pdl-off-decode", &config.compare_pdl_off_decode,
                "After each decode batch size (and any eager / unfused steps), --output-len more\n"
                "steps of the same sequences with --pdl off, a further decode line (pdl off).");
  flags.AddBool("compare-eager-decode", &config.compare_eager_decode,
                "With --cuda-graphs: measure every decode batch size again with graphs off\n"
                "(the same sequences, --output-len more steps), in the same process.");
  flags.AddInt("speculative-tokens", &config.speculative_tokens,
               "K >= 1: speculative decoding's cost (docs/engine.md). The model is built with\n"
               "its draft head (the config needs num_nextn_predict_layers >= 1, e.g.\n"
               "configs/moonlight_shaped_mtp.json), and after each request count's decode steps\n"
               "the same N sequences, at one position, time --output-len plain decode steps,\n"
               "verify steps of N x (1 + K) rows (every row picked on the device, hidden states\n"
               "to the host, as the engine verifies) and one-row draft-head calls, each minus\n"
               "--warmup; reports verify/decode and the speed-up E[tokens] x decode / (verify +\n"
               "K x draft) at acceptance 0.5..0.9. One rank. 0 (default): not measured.");
  std::string mixed_steps;
  flags.AddString("mixed-steps", &mixed_steps,
                  "D:P[,D:P...]: after the decode batch sizes, mixed steps of D decode rows at\n"
                  "--context-length cached tokens (filled as --decode-fill says, sampled as\n"
                  "--decode-sampling says) and P prompt tokens of new sequences in the same\n"
                  "step, as the engine's scheduler forms them: the first prompt continued from\n"
                  "half its length (an earlier, untimed step computed the rest), then fresh\n"
                  "prompts of --mixed-prompt-length tokens, the last cut where the P tokens end;\n"
                  "every prompt that completes samples its first token. One untimed step, then\n"
                  "--iters timed ones (the median is reported). E.g. 64:512,256:2048.");
  flags.AddInt("mixed-prompt-length", &config.mixed_prompt_length,
               "Prompt length of the mixed steps' prompts (0, the default: --context-length).");
  flags.AddDouble("constrained-fraction", &config.constrained_fraction,
                  "Structured output: this fraction of each decode batch's requests (0 to 1,\n"
                  "spread evenly) is constrained by a grammar, its token masks filled on the host\n"
                  "while the device runs the step, as the engine does; needs --tokenizer. Steps\n"
                  "with a masked row run eagerly (no decode graph). Reported: constrained\n"
                  "requests and the host time per step filling their masks.");
  flags.AddString("constrained-spec", &config.constrained_spec,
                  "A file holding the JSON Schema of the constrained requests (default: any JSON\n"
                  "object). A request whose document completes starts a new one.");
  flags.AddString("tokenizer", &config.tokenizer,
                  "Directory with tokenizer.json and tokenizer_config.json whose vocabulary the\n"
                  "masks cover (e.g. the DeepSeek-V3 tokenizer for a V3 config).");
  flags.AddBool("json", &json, "Print one JSON object instead of the text report.");
  flags.AddString("csv", &csv, "Append one CSV row per request count (header if the file is new).");
  if (int rc = flags.ParseMain(argc, argv, "deepinfer-bench"); rc >= 0) return rc;
  if (absl::Status built = deepinfer::CheckBackendBuilt(config.backend); !built.ok()) {
    std::cerr << "deepinfer-bench: " << built.message() << "\n";
    return 2;
  }
  if (!deepinfer::ParseRequestCounts(requests, &config.decode_num_requests)) {
    std::cerr << "deepinfer-bench: --decode-num-requests must be a number or a comma list of "
                 "numbers, not '"
              << requests << "'\n";
    return 2;
  }
  if (config.cuda_graph_max_batch < 1) {
    std::cerr << "deepinfer-bench: --cuda-graph-max-batch must be >= 1, not "
              << config.cuda_graph_max_batch << "\n";
    return 2;
  }
  if (!deepinfer::ParseDecodeSampling(decode_sampling, &config)) {
    std::cerr << "deepinfer-bench: --decode-sampling must be T,TOP_K,TOP_P with T >= 0, "
                 "TOP_K >= 0 and TOP_P in (0, 1], not '"
              << decode_sampling << "'\n";
    return 2;
  }
  auto mixed = deepinfer::ParseMixedSteps(mixed_steps);
  if (!mixed.ok()) {
    std::cerr << "deepinfer-bench: " << mixed.status().message() << "\n";
    return 2;
  }
  config.mixed_steps = *std::move(mixed);
  if (load_format == "dummy") {
    config.model = deepinfer::DummyModelSpec(config.model, seed);
  } else if (load_format != "auto") {
    std::cerr << "deepinfer-bench: --load-format must be auto or dummy, not '" << load_format
              << "'\n";
    return 2;
  }
  auto result = deepinfer::RunBenchmark(config);
  if (!result.ok()) {
    std::cerr << "deepinfer-bench failed: " << result.status() << "\n";
    return 1;
  }
  std::cout << (json ? deepinfer::FormatBenchJson(config, *result)
                     : deepinfer::FormatBenchReport(config, *result))
            << std::flush;
  if (!csv.empty()) {
    const bool fresh = !std::ifstream(csv).good();
    std::ofstream f(csv, std::ios::app);
    if (fresh) f << deepinfer::BenchCsvHeader() << "\n";
    for (const std::string& row : deepinfer::BenchCsvRows(config, *result)) f << row << "\n";
    if (!f) {
      std::cerr << "deepinfer-bench: cannot write '" << csv << "'\n";
      return 1;
    }
  }
  return 0;
}
