// deepinfer-worker: the per-node daemon. Finds the node's devices, checks the model, serves
// WorkerService (group forming, requests), registers with the coordinator, heartbeats and
// reports results until SIGTERM/SIGINT.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/eplb/placement_json.h"
#include "common/flags/flag_set.h"
#include "common/rpc/auth.h"
#include "common/rpc/daemon.h"
#include "glog/logging.h"
#include "kernels/common/pdl.h"
#include "worker/backend/backend_factory.h"
#include "worker/backend/backend_kind.h"
#include "worker/device_discovery.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/attention/prefill_attention.h"
#include "worker/worker_server.h"

int main(int argc, char** argv) {
  deepinfer::BlockTerminationSignals();

  deepinfer::WorkerConfig config;
  int64_t port = 0;
  std::string port_file;
  std::string devices = "auto";
  std::string auth_token_file;
  std::string expert_placement;
  std::string log_dir;
  int64_t verbosity = 0;
  std::string backend = "cpu";
  std::string communicator = "auto";
  std::string ep_exchange = "collective";
  int64_t ranks = 0;
  int64_t threads = 0;
  std::string dtype;
  std::string kv_cache_dtype = "auto";
  int64_t kv_cache_tokens = 0;
  double gpu_memory_utilization = 0.9;
  double kv_host_cache_gb = 4;
  double kv_cache_dir_gb = 16;
  int64_t max_batch_tokens = 2048;
  int64_t max_running = 256;
  int64_t load_threads = 0;
  int64_t speculative_tokens = 0;
  double draft_min_confidence = 0.0;
  int64_t collective_timeout_s = 300;
  bool pdl = true;
  std::string prefill_attention = "auto";

  deepinfer::FlagSet flags(
      "deepinfer-worker --coordinator HOST:PORT [flags]",
      "The per-node worker daemon: owns this node's GPUs (one rank per GPU) or its CPU,\n"
      "runs its ranks of the expert-parallel group the coordinator configures, registers\n"
      "with the coordinator, heartbeats and reports results. Re-registers by itself when\n"
      "the coordinator restarts. Runs until SIGTERM or SIGINT.");
  flags.AddString("coordinator", &config.coordinator_address, "Coordinator address, HOST:PORT.");
  flags.Require("coordinator");
  flags.AddString("host", &config.host,
                  "Address the worker's own gRPC service listens on (local only by default).");
  flags.AddInt("port", &port, "Port of the worker's service; 0 picks a free one.");
  flags.AddString("port-file", &port_file, "If set, the bound port is written to this file.");
  flags.AddString("advertise-host", &config.advertise_host,
                  "Host name the coordinator should use to reach this worker\n"
                  "(default: --host, or the hostname when --host is 0.0.0.0).");
  flags.AddString("worker-id", &config.worker_id,
                  "Stable name of this worker (default: NODE_NAME:PORT).");
  flags.AddString("node-name", &config.node_name, "Node name (default: the hostname).");
  flags.AddString("devices", &devices,
                  "auto: every CUDA GPU, else the CPU; cpu: the CPU only;\n"
                  "cuda: CUDA GPUs, an error if there are none.");
  flags.AddString("auth-token-file", &auth_token_file,
                  "File holding the cluster token: sent to the coordinator, and required\n"
                  "from anyone calling this worker.");
  flags.AddString("model", &config.engine.model,
                  "Checkpoint directory (config.json, safetensors, optional tokenizer.json and\n"
                  "generation_config.json), or dummy:CONFIG.json@SEED for random weights.");
  flags.Require("model");
  flags.AddString("backend", &backend,
                  "cpu, or cuda (CUDA backend, one rank per GPU; see docs/cuda.md).");
  flags.AddString("dtype", &dtype,
                  "Weight storage: bfloat16 (fp32 accumulation), float32, auto (the\n"
                  "checkpoint's precision: with --backend cuda its FP8 block-scaled matrices stay\n"
                  "FP8, the rest bfloat16), or mxfp4 (--backend cuda, one rank: as auto, with the\n"
                  "routed experts quantised to MXFP4 at load). Default: bfloat16 with --backend\n"
                  "cuda, float32 with --backend cpu.");
  flags.AddBool("cuda-graphs", &config.engine.cuda_graphs,
                "With --backend cuda: replay decode steps from CUDA graphs recorded per\n"
                "batch-size bucket (batches padded to 1 2 4 8 16 24 32 48 64 96 128 160 192\n"
                "256 ...); --cuda-graphs=false launches every op eagerly. docs/cuda.md.");
  flags.AddBool("gemm-autotune", &config.engine.gemm_autotune,
                "With --backend cuda: prefill GEMMs of 1024+ rows use the fastest of cuBLASLt's\n"
                "suggested algorithms, timed once per shape (the first step of a new shape pays\n"
                "it; ~3% faster prefill on the H200). The pick can differ between processes, so\n"
                "--gemm-autotune=false for run-to-run reproducible prefill. docs/cuda.md.");
  absl::StatusOr<bool> batch_invariant_env =
      deepinfer::ParseBatchInvariantEnv(std::getenv(deepinfer::kBatchInvariantEnv));
  if (!batch_invariant_env.ok()) {
    std::cerr << "deepinfer-worker: " << batch_invariant_env.status().message() << "\n";
    return 2;
  }
  config.engine.batch_invariant = *batch_invariant_env;
  flags.AddBool("batch-invariant", &config.engine.batch_invariant,
                "With --backend cuda: the batch-invariant mode: every op computes a row the same\n"
                "way at any batch size, so a request's logprobs (and, seeded, its samples) do not\n"
                "depend on the requests batched with it; slower decode (docs/engine.md, \"Batch\n"
                "invariance\"). Default: on when DEEPINFER_BATCH_INVARIANT=1.");
  flags.AddInt("cuda-graph-max-batch", &config.engine.cuda_graph_max_batch,
               "Largest decode batch run from a CUDA graph (the last bucket).");
  flags.AddBool("pdl", &pdl,
                "With --backend cuda on sm_90+: launch our kernels with programmatic dependent\n"
                "launch (each may start while the one before it finishes; docs/cuda.md).");
  flags.AddString("kv-cache-dtype", &kv_cache_dtype,
                  "Latent KV cache elements: auto (the weights' --dtype), bfloat16 (half the\n"
                  "bytes per token: twice the tokens, less for attention to read), float32, or\n"
                  "fp8 (the latent in e4m3 with one scale per token, the rope key bf16: 1.76x\n"
                  "the tokens of bfloat16 for DeepSeek-V3; MLA models only).");
  flags.AddString("communicator", &communicator,
                  "What carries the expert-parallel exchange: auto (nccl when --backend cuda\n"
                  "and the group has more than one rank, tcp otherwise), tcp, or nccl (GPU to\n"
                  "GPU; needs --backend cuda). docs/communicator.md.");
  flags.AddString("ep-exchange", &ep_exchange,
                  "How expert-parallel ranks on the NCCL data plane move rows: collective (NCCL\n"
                  "all-to-all, the default), auto (the device exchange through NVLink windows,\n"
                  "no host in the loop, where the group allows it; NCCL all-to-all otherwise,\n"
                  "logged), device (or fail). The device exchange is opt-in until measured on\n"
                  "several GPUs. docs/communicator.md.");
  flags.AddInt("ranks", &ranks,
               "Engine ranks on this worker (default: one per GPU; 1 on the CPU).");
  flags.AddInt("threads", &threads, "CPU threads per rank (default: cores / ranks).");
  flags.AddInt("kv-cache-tokens", &kv_cache_tokens,
               "KV cache capacity per rank, in tokens. 0 (default): on a GPU, what\n"
               "--gpu-memory-utilization leaves after the weights and an activation reserve;\n"
               "on the CPU, 16384.");
  flags.AddDouble("gpu-memory-utilization", &gpu_memory_utilization,
                  "Fraction of each GPU's memory a rank may use for weights, activations and\n"
                  "the KV cache, in (0, 1].");
  flags.AddInt("max-batch-tokens", &max_batch_tokens,
               "New tokens per engine step (decode + prefill chunks).");
  flags.AddInt("max-running", &max_running, "Sequences per engine step.");
  flags.AddInt("load-threads", &load_threads,
               "Threads per rank that read and convert checkpoint weights (a thread per\n"
               "safetensors shard first; staged uploads): 1 loads one tensor after the other,\n"
               "0 (default) the machine's hardware threads, at most 8. Same weights either way.");
  flags.AddInt("speculative-tokens", &speculative_tokens,
               "Speculative decoding with the model's MTP layers (DeepSeek-V3): up to this many\n"
               "drafted tokens per sequence and step, verified in the step (outputs unchanged;\n"
               "docs/engine.md). 0 (default): off, and the MTP layers are not loaded.");
  flags.AddDouble("draft-min-confidence", &draft_min_confidence,
                  "Speculative decoding: a sequence stops drafting at the first draft whose\n"
                  "probability under the draft head is below this, in [0, 1] (0: always\n"
                  "--speculative-tokens drafts).");
  flags.AddBool("async-scheduling", &config.engine.async_scheduling,
                "Form each engine step while the one before runs on the device (its tokens read\n"
                "back one step late, outputs unchanged; docs/engine.md); --no-async-scheduling\n"
                "runs every step to the end before the next one is formed.");
  flags.AddBool("prefix-caching", &config.engine.prefix_caching,
                "Reuse the KV cache blocks of prompt prefixes computed before (full blocks of\n"
                "16 tokens; docs/kv-cache.md); --no-prefix-caching computes every prompt whole.");
  flags.AddDouble("kv-host-cache-gb", &kv_host_cache_gb,
                  "Host memory (GiB, for the whole worker) that keeps cached KV blocks evicted\n"
                  "from the ranks' pools, so a later prompt with their prefix copies them back\n"
                  "instead of recomputing them; 0: none.");
  flags.AddString("kv-cache-dir", &config.engine.kv_cache_dir,
                  "Local directory for cached KV blocks leaving host memory, and for every cached\n"
                  "block when the worker stops: a later worker on the same directory (same model\n"
                  "and cache layout) skips the prefill of those prefixes. Files are checked\n"
                  "before use (model, hashes, tokens, checksum); docs/kv-cache.md. Empty: none.");
  flags.AddDouble("kv-cache-dir-gb", &kv_cache_dir_gb,
                  "Bound on --kv-cache-dir's block files, GiB (least recently used go first).");
  flags.AddString("prefill-attention", &prefill_attention,
                  "auto, absorbed or mha: the MLA form of prefill steps (auto: mha where every\n"
                  "sequence of the step brings >= 64 new tokens and the backend has it). The\n"
                  "forms round differently; absorbed makes every result independent of how\n"
                  "requests are batched, chunked or served from the prefix cache.");
  int64_t micro_batches = 1;
  flags.AddInt("micro-batches", &micro_batches,
               "1, or 2: each step's sequences in two halves whose expert exchanges overlap the\n"
               "other half's compute (DeepSeek's two-micro-batch overlap; the same tokens).\n"
               "Every worker of a group must use the same value. DeepSeek-V3 models only.");
  flags.AddBool("expert-parallel", &config.engine.expert_parallel,
                "Split the routed experts over the ranks of a multi-rank group (each rank\n"
                "loads E / world_size of them; tokens travel by all-to-all). false: every\n"
                "rank loads every expert and computes its own tokens.");
  flags.AddString("expert-placement", &expert_placement,
                  "EPLB placement JSON (as `deepinfer-admin plan` prints it) for the expert-\n"
                  "parallel groups this worker joins, when the coordinator sends none; its\n"
                  "physical slots are spread evenly over the group's ranks (docs/eplb.md).");
  flags.AddInt("collective-timeout-s", &collective_timeout_s,
               "Seconds a rank waits for its peers (forming a group, each collective).");
  flags.AddString("step-stats-dir", &config.engine.step_stats_dir,
                  "If set, each rank writes what its steps did with their time (batch sizes,\n"
                  "step times, gaps between steps, time to first token) to\n"
                  "DIR/rank-N.json whenever it runs out of work (tools/bench/e2e_job.py).");
  flags.AddString("log-dir", &log_dir, "Write glog files here instead of to stderr.");
  flags.AddInt("v", &verbosity, "Verbose logging level (glog --v).");

  if (int rc = flags.ParseMain(argc, argv, "deepinfer-worker"); rc >= 0) return rc;
  if (absl::Status built = deepinfer::CheckBackendBuilt(backend); !built.ok()) {
    std::cerr << "deepinfer-worker: " << built.message() << "\n";
    return 2;
  }
  deepinfer::kernels::SetProgrammaticDependentLaunch(pdl);
  deepinfer::InitDaemonLogging(argv[0], log_dir, static_cast<int>(verbosity));
  LOG(INFO) << "start-up: main at unix "
            << absl::StrFormat("%.3f", absl::ToUnixMicros(absl::Now()) / 1e6);
  config.port = static_cast<int>(port);

  absl::StatusOr<deepinfer::DeviceSelection> selection = deepinfer::ParseDeviceSelection(devices);
  if (!selection.ok()) {
    std::cerr << "deepinfer-worker: --devices: " << selection.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<std::vector<deepinfer::Device>> found = deepinfer::FindDevices(*selection);
  if (!found.ok()) {
    std::cerr << "deepinfer-worker: " << found.status().message() << "\n";
    return 1;
  }
  config.devices = *found;
  int cuda_devices = 0;
  for (const auto& d : config.devices) cuda_devices += d.kind() == deepinfer::Device::CUDA;
  if (backend == "cuda") {
    const std::vector<std::string> kinds = deepinfer::AvailableBackends();
    if (std::find(kinds.begin(), kinds.end(), "cuda") == kinds.end()) {
      std::cerr << "deepinfer-worker: --backend cuda: this build has no CUDA support; use "
                   "--backend cpu\n";
      return 2;
    }
    if (cuda_devices == 0) {
      std::cerr << "deepinfer-worker: --backend cuda: no CUDA GPU found (--devices=" << devices
                << ")\n";
      return 1;
    }
  } else if (backend != "cpu") {
    std::cerr << "deepinfer-worker: --backend must be cpu or cuda, not '" << backend << "'\n";
    return 2;
  }
  absl::StatusOr<deepinfer::comm::DataPlaneChoice> plane =
      deepinfer::comm::ParseDataPlaneChoice(communicator);
  if (plane.ok()) {
    if (absl::Status s = deepinfer::comm::CheckDataPlaneChoice(*plane, backend); !s.ok()) {
      plane = s;
    }
  }
  if (!plane.ok()) {
    std::cerr << "deepinfer-worker: --communicator: " << plane.status().message() << "\n";
    return 2;
  }
  config.engine.communicator = *plane;
  absl::StatusOr<deepinfer::EpExchangeKind> ep_kind = deepinfer::ParseEpExchangeKind(ep_exchange);
  if (!ep_kind.ok()) {
    std::cerr << "deepinfer-worker: --ep-exchange: " << ep_kind.status().message() << "\n";
    return 2;
  }
  config.engine.ep_exchange = *ep_kind;
  if (ranks < 0 || threads < 0 || kv_cache_tokens < 0 || max_batch_tokens <= 0 ||
      max_running <= 0 || collective_timeout_s <= 0) {
    std::cerr << "deepinfer-worker: --ranks, --threads, --kv-cache-tokens, --max-batch-tokens,\n"
                 "--max-running and --collective-timeout-s must be positive\n";
    return 2;
  }
  if (!(kv_host_cache_gb >= 0) || !(kv_cache_dir_gb > 0)) {
    std::cerr << "deepinfer-worker: --kv-host-cache-gb must be >= 0 and --kv-cache-dir-gb > 0\n";
    return 2;
  }
  if (speculative_tokens < 0 || !(draft_min_confidence >= 0 && draft_min_confidence <= 1)) {
    std::cerr << "deepinfer-worker: --speculative-tokens must be >= 0 and "
                 "--draft-min-confidence in [0, 1]\n";
    return 2;
  }
  if (!(gpu_memory_utilization > 0 && gpu_memory_utilization <= 1)) {
    std::cerr << "deepinfer-worker: --gpu-memory-utilization must be in (0, 1], not "
              << gpu_memory_utilization << "\n";
    return 2;
  }
  if (!dtype.empty() && dtype != deepinfer::kStoredPrecisionDType &&
      dtype != deepinfer::kMxfp4ExpertsDType) {
    if (absl::StatusOr<deepinfer::WeightDType> d = deepinfer::ParseWeightDType(dtype); !d.ok()) {
      std::cerr << "deepinfer-worker: --dtype: " << d.status().message() << "\n";
      return 2;
    }
  }
  if (absl::StatusOr<deepinfer::WeightDType> d =
          deepinfer::ResolveKvCacheDType(kv_cache_dtype, deepinfer::WeightDType::kFloat32);
      !d.ok()) {
    std::cerr << "deepinfer-worker: --kv-cache-dtype: " << d.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<deepinfer::PrefillAttention> prefill =
      deepinfer::ParsePrefillAttention(prefill_attention);
  if (!prefill.ok()) {
    std::cerr << "deepinfer-worker: --prefill-attention: " << prefill.status().message() << "\n";
    return 2;
  }
  config.engine.prefill_attention = *prefill;
  if (micro_batches != 1 && micro_batches != 2) {
    std::cerr << "deepinfer-worker: --micro-batches must be 1 or 2, not " << micro_batches << "\n";
    return 2;
  }
  config.engine.micro_batches = static_cast<int32_t>(micro_batches);
  if (ranks == 0) {
    // One rank per GPU on CUDA; the CPU backend runs one by default.
    ranks = backend == "cuda" ? cuda_devices : 1;
  }
  if (backend == "cuda" && ranks > cuda_devices) {
    std::cerr << "deepinfer-worker: --ranks " << ranks << " but only " << cuda_devices
              << " CUDA GPU(s)\n";
    return 2;
  }
  config.engine.backend = backend;
  if (!expert_placement.empty()) {
    absl::StatusOr<deepinfer::ExpertPlacement> placement =
        deepinfer::ReadPlacementFile(expert_placement);
    if (!placement.ok()) {
      std::cerr << "deepinfer-worker: --expert-placement: " << placement.status().message() << "\n";
      return 2;
    }
    config.engine.placement =
        std::make_shared<const deepinfer::ExpertPlacement>(std::move(*placement));
  }
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  config.engine.num_ranks = static_cast<int>(ranks);
  config.engine.threads_per_rank =
      threads > 0 ? static_cast<int>(threads) : std::max(1, cores / static_cast<int>(ranks));
  config.engine.dtype = dtype;
  if (config.engine.cuda_graph_max_batch < 1) {
    std::cerr << "deepinfer-worker: --cuda-graph-max-batch must be >= 1, not "
              << config.engine.cuda_graph_max_batch << "\n";
    return 2;
  }
  config.engine.kv_cache_dtype = kv_cache_dtype;
  config.engine.kv_cache_tokens = kv_cache_tokens;
  config.engine.gpu_memory_utilization = gpu_memory_utilization;
  config.engine.kv_host_cache_bytes = static_cast<int64_t>(kv_host_cache_gb * (1ll << 30));
  config.engine.kv_cache_dir_bytes = static_cast<int64_t>(kv_cache_dir_gb * (1ll << 30));
  config.engine.max_batch_tokens = static_cast<int32_t>(max_batch_tokens);
  config.engine.max_running = static_cast<int32_t>(max_running);
  if (load_threads < 0) {
    std::cerr << "deepinfer-worker: --load-threads must be >= 0, not " << load_threads << "\n";
    return 2;
  }
  config.engine.load_threads = static_cast<int>(load_threads);
  config.engine.speculative_tokens = static_cast<int32_t>(speculative_tokens);
  config.engine.draft_min_confidence = static_cast<float>(draft_min_confidence);
  config.engine.collective_timeout = absl::Seconds(collective_timeout_s);
  for (const auto& d : config.devices) {
    LOG(INFO) << "device: " << deepinfer::Device::Kind_Name(d.kind()) << ":" << d.index() << " "
              << d.name() << " (" << d.total_memory_bytes() / (1 << 20) << " MiB)";
  }
  if (!auth_token_file.empty()) {
    absl::StatusOr<std::string> token = deepinfer::ReadAuthTokenFile(auth_token_file);
    if (!token.ok()) {
      std::cerr << "deepinfer-worker: " << token.status().message() << "\n";
      return 2;
    }
    config.auth_token = *token;
  }

  return deepinfer::ServeUntilSignal("deepinfer-worker", deepinfer::WorkerServer::Start(config),
                                     port_file);
}
