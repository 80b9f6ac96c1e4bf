// BuildRank: sets up one rank of an expert-parallel group, the same way for the worker
// (RankGroup), the benchmark (tools/bench) and the tests: joins the TCP group (the control
// plane: agreement, barriers, NCCL's bootstrap), opens the backend, forms the NCCL data plane
// over the TCP group where the expert exchange runs GPU to GPU, plans the GPU memory (the weights
// must fit before anything is loaded; the KV cache gets what is left), loads the rank's share of
// the model (with a partitioned dispatcher only its routed experts: a contiguous range, or the
// experts of its EPLB slots) and makes its KV pool from the model's cache spec; optionally it
// records the decode graphs and warms up (WarmUpSteps). The weight load, the graph capture and
// the warm-up each log one line (`start-up: weights loaded in ...`, `start-up: decode graphs
// recorded in ...`, `start-up: warm-up ran in ...`).
//
// What a rank is made of is a RankParts, filled as each part comes up, so that whoever owns it
// tears a half-built rank down in the right order too.
#ifndef DEEPINFER_WORKER_ENGINE_RANK_BUILDER_H_
#define DEEPINFER_WORKER_ENGINE_RANK_BUILDER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/eplb/expert_placement.h"
#include "worker/backend/backend.h"
#include "worker/backend/backend_factory.h"
#include "worker/comm/communicator.h"
#include "worker/comm/data_plane.h"
#include "worker/comm/tcp_communicator.h"
#include "worker/engine/memory_plan.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/causal_lm.h"
#include "worker/model/model_registry.h"
#include "worker/model/weight_source.h"

namespace deepinfer {

// Routed experts [first, first + count) of every MoE layer.
struct ExpertRange {
  int64_t first = 0;
  int64_t count = 0;
};
// The experts global rank `rank` hosts when experts are partitioned contiguously.
ExpertRange ExpertsOfRank(int64_t num_experts, int world_size, int rank);

// How a rank gets its ExpertDispatcher. The local one serves every expert without
// communication, so each rank loads all experts; an expert-parallel one (partitioned = true)
// serves the rank's range and exchanges tokens through the rank's communicator, so each rank
// loads only its range.
struct DispatcherFactory {
  bool partitioned = false;
  // `placement`: the EPLB placement the rank starts with (null: contiguous `range`).
  std::function<absl::StatusOr<std::unique_ptr<ExpertDispatcher>>(
      comm::Communicator* comm, ExpertRange range, std::shared_ptr<const ExpertPlacement> placement,
      const ModelConfig& config, const ModelWeights& weights, Backend* backend)>
      make;
};
DispatcherFactory LocalDispatcherFactory();

// How an expert-parallel dispatcher moves rows over a device (NCCL) data plane
// (--ep-exchange): kCollective (the default): NCCL all-to-all (EpExpertDispatcher); kAuto: the
// device exchange (EpDeviceDispatcher: NVLink windows, no host in the loop) where the group can
// map each other's memory and the sizes fit its limits, else NCCL all-to-all, logging why;
// kDevice: the device exchange or an error. The device exchange is opt-in until it is measured
// faster on several GPUs (docs/communicator.md). A host (TCP) data plane always uses
// EpExpertDispatcher.
enum class EpExchangeKind { kAuto, kDevice, kCollective };
absl::StatusOr<EpExchangeKind> ParseEpExchangeKind(const std::string& name);
struct EpExchangeOptions {
  EpExchangeKind kind = EpExchangeKind::kCollective;
  // Tokens one rank sends per MoE layer, at most: the step budget (or the largest decode batch
  // if larger). Sizes the device exchange's windows.
  int32_t max_tokens = 2048;
};
// Expert parallelism, what the worker runs by default. A group of one rank gets the local
// dispatcher (same experts, no exchange to pay for).
DispatcherFactory EpDispatcherFactory(const EpExchangeOptions& exchange = {});

inline constexpr int64_t kDefaultCpuKvCacheTokens = 16384;

// Which routed experts a rank loads: those of its EPLB slots (placement), its contiguous range
// when partitioned, else all of them.
LoadOptions ExpertsToLoad(const ModelConfig& config, int world_size, int rank, bool partitioned,
                          const std::shared_ptr<const ExpertPlacement>& placement);

struct RankSpec {
  // The group: this rank's global rank and the world; the TCP group is formed when the world has
  // several ranks or `always_form_group` is set (the worker's lock-step loop runs over it even
  // alone).
  int rank = 0;
  int world_size = 1;
  bool always_form_group = false;
  std::string root_address;  // rank 0 listens on it (or takes the listener handed to BuildRank)
  uint64_t group_incarnation = 0;
  std::string listen_host = "127.0.0.1";            // TcpCommunicatorSpec::listen_host
  absl::Duration group_timeout = absl::Minutes(5);  // forming the TCP group and each collective
  absl::Duration data_plane_timeout = absl::Minutes(5);  // forming NCCL and each exchange

  BackendOptions backend;

  // Experts: the dispatcher, what carries its exchange (auto: NCCL for a cuda backend, a
  // partitioned dispatcher and several ranks; TCP otherwise) and the EPLB placement to start
  // with (null: contiguous ranges; ignored unless partitioned).
  DispatcherFactory dispatcher = LocalDispatcherFactory();
  comm::DataPlaneChoice communicator = comm::DataPlaneChoice::kAuto;
  std::shared_ptr<const ExpertPlacement> placement;

  // The model: a checkpoint directory or "dummy:CONFIG[@SEED]", opened by `open_weights` (null:
  // OpenWeightSource), and how it computes.
  std::string model;
  std::function<absl::StatusOr<std::unique_ptr<WeightSource>>(const std::string& model,
                                                              ModelConfig* config)>
      open_weights;
  // LoadOptions::load_threads (0: the machine's hardware threads, at most 8).
  int load_threads = 0;
  DecodeGraphOptions decode_graphs;
  // Record the decode graphs at start-up (CausalLm::CaptureDecodeGraphs), for the buckets up to
  // min(decode_graphs.max_batch, max_running): a rank never decodes more sequences at once, and
  // the memory plan reserves exactly those graphs. Only where the steps exchange nothing between
  // ranks (every rank would have to capture in lock-step); false: each bucket is recorded on its
  // first step.
  bool capture_decode_graphs = false;
  // Run WarmUpSteps at start-up (after the graph capture), where capture_decode_graphs would
  // capture: only where the steps exchange nothing between ranks.
  bool warm_up = false;
  bool fused_ops = true;
  int32_t micro_batches = 1;  // CausalLm::SetMicroBatches
  PrefillAttention prefill_attention = PrefillAttention::kAuto;

  // The KV cache: entries "auto" (the weights' dtype), "bfloat16" or "float32"; its size in
  // blocks if kv_cache_blocks > 0, else in tokens if kv_cache_tokens > 0 (rounded up to whole
  // blocks), else planned from GPU memory (memory_plan.h) on a GPU and
  // kDefaultCpuKvCacheTokens on the CPU.
  std::string kv_cache_dtype = "auto";
  int32_t block_size = 16;
  int64_t kv_cache_blocks = 0;
  int64_t kv_cache_tokens = 0;
  double gpu_memory_utilization = 0.9;
  int32_t max_batch_tokens = 2048;  // sizes the activation reserve of the memory plan
  // Drafted tokens per sequence and step (--speculative-tokens; 0: none): the MTP modules to
  // load as the model's draft head (ModelConfig::num_draft_layers), at most the model's
  // num_nextn_predict_layers, and the drafts a step verifies (ModelConfig::speculative_tokens).
  // Their weights and cache entries are planned.
  int32_t draft_layers = 0;
  // Sequences the engine runs at once: the cache's per-sequence state slots (a model whose cache
  // keeps state per sequence, KvCacheSpec::StateBytesPerSequence; DeepSeek-V4's window rings
  // and compressor rows), reserved before the KV blocks are planned.
  int32_t max_running = 256;
};

// Start-up warm-up (BuildRank's `warm-up` phase): runs the step shapes serving uses once before
// any request, so that first-use costs (kernel module loading, GEMM library handles and
// heuristics, workspaces) are not paid by the first requests: a prefill step of one scratch
// sequence of `max_batch_tokens` tokens (token 0 throughout; fewer where the model's positions or
// the cache's free blocks allow fewer), then a mixed step of that sequence's next token (greedy)
// and a second scratch sequence's prompt chunk (sampled, temperature 1; not run where the pool's
// per-sequence state has a single slot). Every block it takes is
// freed again (with any state slot bound to it) and the expert counts the steps made are
// discarded: the pool's free blocks are as before and nothing is visible to later steps, which
// write every cache entry they read. Runs forward steps: on an expert-parallel rank only when
// every rank of the group calls it. Returns the steps run (0 where the cache has too few free
// blocks); the steps' errors.
struct WarmUpResult {
  int steps = 0;
  int64_t tokens = 0;  // tokens stepped, over all steps
};
absl::StatusOr<WarmUpResult> WarmUpSteps(CausalLm* model, KvBlockPool* pool,
                                         int64_t max_batch_tokens);

// One rank's parts, declared so that they are destroyed in dependency order (pool, model,
// exchange wrapper, data-plane communicator, backend, TCP communicator).
struct RankParts {
  std::unique_ptr<comm::TcpCommunicator> group;  // null when not formed (see RankSpec)
  std::unique_ptr<Backend> backend;
  // The NCCL communicator when the data plane is NCCL (uses the backend's stream); null for TCP,
  // whose exchange runs over `group`.
  std::unique_ptr<comm::Communicator> data_comm;
  // What RankHooks::wrap_exchange put between the dispatcher and the data plane, if anything.
  std::unique_ptr<comm::Communicator> exchange;
  std::unique_ptr<CausalLm> model;
  std::unique_ptr<KvBlockPool> pool;
  comm::DataPlane data_plane = comm::DataPlane::kTcp;
  // How the dispatcher moves rows (ExpertDispatcher::exchange_name), for the status.
  std::string expert_exchange = "local";
};

struct RankHooks {
  // Each communicator as soon as it exists (a failing group aborts them all); false: the group
  // stopped, BuildRank aborts it and returns CANCELLED.
  std::function<bool(comm::Communicator*)> on_communicator;
  // Wraps the communicator the dispatcher exchanges over (the benchmark meters it).
  std::function<std::unique_ptr<comm::Communicator>(comm::Communicator* data, Backend* backend)>
      wrap_exchange;
};

// Builds the rank into `parts` (left as far as it got on error). `root`: rank 0's rendezvous
// socket when the caller bound it (null: rank 0 binds root_address). Errors: INVALID_ARGUMENT for
// a bad spec, RESOURCE_EXHAUSTED when the weights or the cache do not fit (the message names
// every term), CANCELLED when a hook stopped it, and the communicator's, backend's or loader's
// errors as they are. Does not wait for the other ranks (the caller's barrier does).
absl::Status BuildRank(const RankSpec& spec, const RankHooks& hooks,
                       std::unique_ptr<comm::TcpCommunicator::RootListener> root, RankParts* parts);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_ENGINE_RANK_BUILDER_H_
