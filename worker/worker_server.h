// WorkerServer: everything a deepinfer-worker process runs, as one object main.cc
// (and tests) start and stop: the WorkerService gRPC server, the CoordinatorLink that
// registers, heartbeats and delivers results, and the GroupController that runs this
// worker's ranks of the expert-parallel group (docs/engine.md).
#ifndef DEEPINFER_WORKER_WORKER_SERVER_H_
#define DEEPINFER_WORKER_WORKER_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/auth.h"
#include "grpcpp/grpcpp.h"
#include "proto/worker.grpc.pb.h"
#include "worker/comm/data_plane.h"
#include "worker/coordinator_link.h"
#include "worker/engine/group_controller.h"
#include "worker/engine/model_files.h"
#include "worker/kv_cache/kv_block_store.h"
#include "worker/result_outbox.h"

namespace deepinfer {

// What the worker's ranks run.
struct WorkerEngineConfig {
  // Checkpoint directory or "dummy:CONFIG.json@SEED". Empty: no engine; the worker only
  // registers and heartbeats, and the group RPCs fail with FAILED_PRECONDITION.
  std::string model;
  int num_ranks = 1;
  int threads_per_rank = 1;
  // KV cache per rank in tokens; 0: planned from GPU memory (CPU: 16384). RankGroupOptions.
  int64_t kv_cache_tokens = 0;
  double gpu_memory_utilization = 0.9;
  int32_t max_batch_tokens = 2048;
  int32_t max_running = 256;
  // Bound on forming a group and on each collective.
  absl::Duration collective_timeout = absl::Minutes(5);
  // Groups of several ranks split the routed experts over the ranks (each rank loads E / world
  // of them and tokens travel by all-to-all); false: every rank loads every expert.
  bool expert_parallel = true;
  // "cpu" or "cuda" (one rank per GPU).
  std::string backend = "cpu";
  // EPLB placement (--expert-placement) for groups the coordinator configures without one.
  std::shared_ptr<const ExpertPlacement> placement;
  // Matrix weights: "bfloat16" or "float32"; empty: the backend's default (bf16 on cuda).
  std::string dtype;
  // Decode steps replayed from CUDA graphs (RankGroupOptions::decode_graphs).
  bool cuda_graphs = true;
  // BackendOptions::gemm_autotune (cuda: per-shape cuBLASLt algorithms for prefill GEMMs).
  bool gemm_autotune = true;
  // BackendOptions::batch_invariant (cuda: the batch-invariant mode, --batch-invariant).
  bool batch_invariant = false;
  int64_t cuda_graph_max_batch = 256;
  // Latent KV cache elements: "auto"/empty (= the weights' dtype), "bfloat16" or "float32".
  std::string kv_cache_dtype;
  // What carries the expert exchange: auto (NCCL for several cuda ranks), tcp or nccl.
  comm::DataPlaneChoice communicator = comm::DataPlaneChoice::kAuto;
  // How expert-parallel ranks move rows over that data plane (EpExchangeKind, --ep-exchange).
  EpExchangeKind ep_exchange = EpExchangeKind::kCollective;
  // RankGroupOptions::step_stats_dir.
  std::string step_stats_dir;
  // Prefix caching (RankGroupOptions::prefix_caching).
  bool prefix_caching = true;
  // Async scheduling (RankGroupOptions::async_scheduling).
  bool async_scheduling = true;
  // RankGroupOptions::load_threads.
  int load_threads = 0;
  // Lower tiers of the prefix cache (KvBlockStoreOptions): host memory for evicted blocks, and
  // a local directory (empty: none) bounded to kv_cache_dir_bytes.
  int64_t kv_host_cache_bytes = 0;
  std::string kv_cache_dir;
  int64_t kv_cache_dir_bytes = 0;
  // Speculative decoding (RankGroupOptions::speculative_tokens, draft_min_confidence).
  int32_t speculative_tokens = 0;
  float draft_min_confidence = 0.0f;
  // The MLA prefill form (RankGroupOptions::prefill_attention).
  PrefillAttention prefill_attention = PrefillAttention::kAuto;
  // Micro-batches per step (RankGroupOptions::micro_batches).
  int32_t micro_batches = 1;
};

struct WorkerConfig {
  std::string coordinator_address;
  std::string auth_token;
  // Where WorkerService listens; port 0 picks a free one.
  std::string host = "127.0.0.1";
  int port = 0;
  // Host name others use to reach this worker; empty: `host`, or this machine's
  // hostname when `host` is a wildcard address.
  std::string advertise_host;
  // Empty: "<node_name>:<port>".
  std::string worker_id;
  // Empty: this machine's hostname.
  std::string node_name;
  std::vector<Device> devices;
  WorkerEngineConfig engine;
};

class WorkerServer {
 public:
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(WorkerConfig config);
  ~WorkerServer();

  WorkerServer(const WorkerServer&) = delete;
  WorkerServer& operator=(const WorkerServer&) = delete;

  // Delivers the results waiting, deregisters from the coordinator (CoordinatorLink::Leave),
  // then stops serving, heartbeating and the group; logs how long each part took. Idempotent.
  void Shutdown();

  int port() const { return port_; }
  const std::string& worker_id() const { return config_.worker_id; }
  uint64_t incarnation() const { return incarnation_; }
  CoordinatorLink::State link_state() const;
  // Results not yet acknowledged by the coordinator.
  size_t undelivered_results() const { return outbox_ != nullptr ? outbox_->size() : 0; }

 private:
  class Service;
  WorkerServer() = default;

  WorkerConfig config_;
  uint64_t incarnation_ = 0;
  int port_ = 0;
  absl::Time start_time_;
  bool shut_down_ = false;
  std::unique_ptr<TokenAuthenticator> auth_;
  // Declared before what uses them: rank threads add to the outbox, the link reads both.
  std::unique_ptr<ModelFiles> model_;
  std::unique_ptr<ResultOutbox> outbox_;
  std::shared_ptr<KvBlockStore> kv_block_store_;
  std::unique_ptr<GroupController> controller_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CoordinatorLink> link_;
};

// This machine's hostname ("localhost" if it cannot be read).
std::string LocalHostname();

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_WORKER_SERVER_H_
