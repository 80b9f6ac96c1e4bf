// RankGroup: this worker's ranks of one expert-parallel group (one generation), each a thread
// with its own communicator, backend (CPU, or CUDA on its own GPU), model, KV pool and Engine.
//
// Every rank of the group, in this process or another, runs the same loop in lock-step:
//   1. all-reduce (max) of "I have work";
//   2. if anyone has work, every rank runs one Engine step (a rank without requests steps
//      with an empty batch when its dispatcher exchanges tokens, so the MoE all-to-alls of
//      all ranks match); otherwise every rank sleeps on its RequestQueue for up to idle_wait
//      (a new request wakes it) and loops.
// With async scheduling an Engine step launches a model step on the engine's stepping thread and
// returns while it runs; the rank's thread flushes the engine (Engine::Flush) before it touches
// the model itself (expert counts, placement changes) and before it sleeps.
// Forming: each rank is built by BuildRank (rank_builder.h: the TcpCommunicator group, the
// backend, the NCCL data plane where there is one, the memory plan, its share of the model and
// its KV pool), gets its Engine, then a barrier; after that the group is SERVING.
// On a GPU each rank plans its device's memory before loading; CPU ranks share the machine's
// memory, so Start() plans the weights and KV caches of all of this worker's ranks at once
// against what the machine has available (HostMemoryPlan in memory_plan.h), and a model that
// does not fit fails the group (RESOURCE_EXHAUSTED) before any rank allocates.
//
// EPLB (docs/eplb.md): every rank counts the tokens it routes to each expert on its device and
// reads the counts back about once per `expert_load_interval`; TakeExpertLoads hands them to
// the heartbeat. SetPlacement makes a placement pending: each rank reads the expert weights it
// is missing for it from the checkpoint on a helper thread while it keeps stepping, uploads
// them between two of its steps, and the step agreement (1.) also carries the
// newest placement epoch each rank has ready; when every rank has the same new epoch ready,
// all of them switch before the same step. Requests keep running across the switch.
//
// Any failure (a collective failed because a peer died or aborted, a rank could not load)
// makes the group FAILED: the first error is kept, every local communicator is aborted so the
// other local ranks and the peers stop at once, in-flight requests are dropped (the
// coordinator re-runs them) and the threads end. A FAILED group stays FAILED; the worker waits
// for a new ConfigureGroup.
//
//   FORMING --(all local ranks passed the barrier)--> SERVING
//   FORMING | SERVING --(any error)--> FAILED
#ifndef DEEPINFER_WORKER_ENGINE_RANK_GROUP_H_
#define DEEPINFER_WORKER_ENGINE_RANK_GROUP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/eplb/expert_placement.h"
#include "proto/cluster.pb.h"
#include "proto/common.pb.h"
#include "proto/worker.pb.h"
#include "worker/comm/data_plane.h"
#include "worker/comm/tcp_communicator.h"
#include "worker/engine/engine.h"
#include "worker/engine/host_memory.h"
#include "worker/engine/model_files.h"
#include "worker/engine/rank_builder.h"
#include "worker/engine/request_queue.h"
#include "worker/kv_cache/kv_block_store.h"
#include "worker/model/attention/prefill_attention.h"
#include "worker/model/model_weights.h"

namespace deepinfer {

struct RankGroupOptions {
  // Opened once by the worker; must outlive the group.
  const ModelFiles* model = nullptr;
  // "cpu", or "cuda": rank i of this worker then runs on CUDA device i.
  std::string backend = "cpu";
  // Matrix weight storage, "bfloat16" or "float32"; empty: the backend's default
  // (BackendOptions::dtype).
  std::string dtype;
  // BackendOptions::gemm_autotune.
  bool gemm_autotune = true;
  // BackendOptions::batch_invariant.
  bool batch_invariant = false;
  // Decode steps replayed from CUDA graphs per batch-size bucket (used where the backend can
  // record: cuda; CausalLm::SetDecodeGraphOptions).
  DecodeGraphOptions decode_graphs;
  // Latent KV cache elements: "auto" or empty (= the weights' dtype), "bfloat16", "float32".
  std::string kv_cache_dtype;
  int threads_per_rank = 1;
  // KV cache per rank, in tokens. 0: planned from GPU memory (memory_plan.h) on a GPU, and
  // kDefaultCpuKvCacheTokens on the CPU; > 0: exactly this many (rounded up to whole blocks).
  int64_t kv_cache_tokens = 0;
  // Fraction of each GPU's memory a rank plans to use (weights + KV cache + activations).
  double gpu_memory_utilization = 0.9;
  // What the machine has available for CPU ranks' weights and KV caches (HostMemoryPlan);
  // null: /proc/meminfo's MemAvailable.
  std::shared_ptr<const HostMemory> host_memory;
  int32_t block_size = 16;
  int32_t max_batch_tokens = 2048;
  int32_t max_running = 256;
  // Each rank's engine reuses cached prefix blocks of its own pool (docs/kv-cache.md); the
  // cache key is made of the model's fingerprint, the weight dtype and the cache spec.
  bool prefix_caching = true;
  // Lower tiers (host memory, disk) for cached blocks evicted from the ranks' pools, shared by
  // the worker's ranks and kept across group generations; null: none.
  std::shared_ptr<KvBlockStore> kv_block_store;
  // Speculative decoding with the model's MTP layers (EngineOptions::speculative_tokens,
  // draft_min_confidence; 0: off, and the MTP layers are not loaded).
  int32_t speculative_tokens = 0;
  float draft_min_confidence = 0.0f;
  // Async scheduling in every rank's engine (EngineOptions::async_scheduling), except where the
  // model's steps exchange tokens over the TCP group that also carries the lock-step agreement
  // (an expert-parallel group on the TCP data plane): those steps stay on the rank's thread.
  bool async_scheduling = true;
  // Threads that read and convert each rank's weights (LoadOptions::load_threads; 0: automatic).
  int load_threads = 0;
  // The MLA prefill form of every rank's model.
  PrefillAttention prefill_attention = PrefillAttention::kAuto;
  // Micro-batches per step of every rank's model (CausalLm::SetMicroBatches: 1, or 2 to overlap
  // one half's expert exchange with the other's compute).
  int32_t micro_batches = 1;
  DispatcherFactory dispatcher = LocalDispatcherFactory();
  // What carries the expert-parallel exchange (--communicator): auto is NCCL for a cuda
  // backend, a partitioned dispatcher and more than one rank in the group; TCP otherwise. The
  // TCP group is formed in every case: it carries the lock-step agreement and NCCL's bootstrap.
  comm::DataPlaneChoice communicator = comm::DataPlaneChoice::kAuto;
  // Where non-root ranks accept their peers (TcpCommunicatorSpec::listen_host).
  std::string listen_host = "127.0.0.1";
  // Bound on forming the group and on each collective (a rank waits this long for a peer
  // that is slow to load or hangs; a peer that dies is noticed at once).
  absl::Duration collective_timeout = absl::Minutes(5);
  // How long idle ranks sleep between agreement rounds unless a request wakes them.
  absl::Duration idle_wait = absl::Milliseconds(2);
  // How often a stepping rank reads its expert counts back from the device.
  absl::Duration expert_load_interval = absl::Seconds(1);
  // Non-empty: each rank writes its StepStats (step_stats.h) as JSON to
  // <dir>/rank-<global rank>.json whenever the group runs out of work and when it stops.
  std::string step_stats_dir;
};

struct GroupLayout {
  uint64_t generation = 0;
  uint64_t group_incarnation = 0;
  int world_size = 1;
  int first_rank = 0;  // global rank of this worker's first rank
  int num_ranks = 1;   // ranks on this worker
  std::string root_address;
  // EPLB placement to start with (null: experts contiguous), and its epoch.
  std::shared_ptr<const ExpertPlacement> placement;
  uint64_t placement_epoch = 0;
};

// Receives finished requests; called from rank threads, must not block for long.
using ResultSink = std::function<void(std::vector<RequestResult>)>;

class RankGroup {
 public:
  // Checks the layout (INVALID_ARGUMENT: ranks outside the world, experts that do not divide
  // over the world, a placement that does not fit the model or the world) and prepares the
  // queues; no thread runs until Start(). A placement is ignored (logged) where the dispatcher
  // is not partitioned or the world has one rank. `root` is rank 0's
  // rendezvous socket bound by PrepareGroup (null: Create binds root_address itself).
  static absl::StatusOr<std::unique_ptr<RankGroup>> Create(
      const RankGroupOptions& options, const GroupLayout& layout,
      std::unique_ptr<comm::TcpCommunicator::RootListener> root, ResultSink sink);
  ~RankGroup();  // Stop()

  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  // Starts the rank threads (forming, then serving). Once.
  void Start();
  // Leaves the group (aborting the communicators, which fails the peers), drops requests and
  // joins the threads. Idempotent.
  void Stop();

  // Queues items on their ranks' engines (requests may arrive while forming). INVALID_ARGUMENT
  // (and nothing queued) if an item names a rank this worker does not run.
  absl::Status Submit(std::vector<WorkItem> items);
  void Cancel(const std::vector<std::string>& request_ids);

  const GroupLayout& layout() const { return layout_; }
  GroupStatus status() const;
  std::string error() const;
  // Blocks while the group is FORMING; returns the status after.
  GroupStatus AwaitFormed() const;
  // Blocks until the group is FAILED (tests).
  void AwaitFailed() const;
  std::vector<RankLoad> Loads() const;
  // Tokens generated so far by the requests the local ranks hold (Engine::progress).
  std::vector<RequestProgress> Progress() const;

  // Live EPLB placement change (see the top comment); returns at once. INVALID_ARGUMENT for a
  // placement that does not fit; FAILED_PRECONDITION where placements do not apply (not
  // partitioned, or one rank). An epoch not newer than the pending or running one is ignored.
  absl::Status SetPlacement(std::shared_ptr<const ExpertPlacement> placement, uint64_t epoch);
  // The placement epoch every local rank runs (the smallest, while they switch).
  uint64_t placement_epoch() const;
  // Expert counts gathered since the last call, one report per local rank that stepped.
  std::vector<ExpertLoadReport> TakeExpertLoads();

 private:
  struct Rank;
  RankGroup(const RankGroupOptions& options, const GroupLayout& layout, ResultSink sink);
  void RunRank(int local);
  // Forms the communicator and loads the model; false (group failed) on error.
  bool FormRank(int local);
  // KV cache blocks of a rank whose size is not planned from device memory: --kv-cache-tokens,
  // else kDefaultCpuKvCacheTokens.
  int64_t FixedKvCacheBlocks() const;
  // CPU ranks: the weights and KV caches of all local ranks against the machine's available
  // memory (RESOURCE_EXHAUSTED when they do not fit).
  absl::Status CheckHostMemory() const;
  // Starts reading the missing expert weights of a pending placement newer than what `local`
  // has (on a helper thread), and uploads them once read. Returns the newest epoch the rank
  // has ready (its running one if none); never waits for the read.
  absl::StatusOr<uint64_t> StagePlacement(int local);
  // Switches rank `local` to its staged placement.
  absl::Status SwitchPlacement(int local);
  // Reads the rank's expert counts back into its pending report.
  void CollectExpertCounts(int local);
  // Writes the rank's StepStats when it stepped since the last write (step_stats_dir).
  void WriteStepStats(int local);
  // Processes the rank's steps in flight (Engine::Flush) and hands their results to the sink,
  // so that the rank's thread may use the model; the engine's error otherwise.
  absl::Status FlushEngine(int local);
  // Checks a placement against the model and the world.
  absl::Status CheckPlacement(const ExpertPlacement& placement) const;
  bool placements_apply() const;
  void Fail(int global_rank, const absl::Status& status);
  bool stopping() const;

  const RankGroupOptions options_;
  const GroupLayout layout_;
  const ResultSink sink_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::unique_ptr<comm::TcpCommunicator::RootListener> root_;
  std::vector<std::thread> threads_;
  // CheckHostMemory's verdict for CPU ranks, set by Start() before the rank threads run (and
  // read-only after): after the previous group's weights are freed, before any rank loads.
  absl::Status host_memory_check_;

  mutable absl::Mutex mu_;
  GroupStatus status_ ABSL_GUARDED_BY(mu_) = GROUP_FORMING;
  std::string error_ ABSL_GUARDED_BY(mu_);
  int ranks_formed_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  // Communicators that exist so far, for Fail() and Stop() to abort.
  std::vector<comm::Communicator*> comms_ ABSL_GUARDED_BY(mu_);
  // The newest placement handed to SetPlacement, not yet run by every local rank.
  std::shared_ptr<const ExpertPlacement> pending_placement_ ABSL_GUARDED_BY(mu_);
  uint64_t pending_epoch_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_ENGINE_RANK_GROUP_H_
