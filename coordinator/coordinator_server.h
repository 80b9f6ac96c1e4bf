// CoordinatorServer: everything a deepinfer-coordinator process runs, as one object
// that main.cc (and tests) start and stop: the worker registry, the heartbeat
// monitor, and the gRPC server with ClusterService and AdminService.
#ifndef DEEPINFER_COORDINATOR_COORDINATOR_SERVER_H_
#define DEEPINFER_COORDINATOR_COORDINATOR_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/auth.h"
#include "coordinator/admin_service.h"
#include "coordinator/batch/batch_job_store.h"
#include "coordinator/batch/prompt_builder.h"
#include "coordinator/clock.h"
#include "coordinator/cluster_service.h"
#include "coordinator/heartbeat_monitor.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_service.h"
#include "coordinator/worker_channel.h"
#include "coordinator/worker_registry.h"
#include "grpcpp/grpcpp.h"

namespace deepinfer {

struct CoordinatorConfig {
  // Address to listen on. 127.0.0.1 unless the operator opens it up.
  std::string host = "127.0.0.1";
  // 0 picks a free port; see CoordinatorServer::port().
  int port = 0;
  // Empty: no authentication.
  std::string auth_token;
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  // Batch jobs: both set, or the coordinator takes no jobs (control plane only).
  std::string model;      // checkpoint directory or dummy:CONFIG[@seed]
  std::string state_dir;  // SQLite database and job files
  JobManagerConfig jobs;
  // EPLB (with a model): window, automatic rebalance, redundant slots, initial placement.
  // num_logical and num_groups are filled from the model.
  ExpertBalancerConfig eplb;
  // For tests: runs once an uploaded job is stored, before the answer is sent (a test can
  // hold the answer back past the client's deadline).
  std::function<void(const std::string& job_id)> after_job_stored;
};

class CoordinatorServer {
 public:
  // Starts serving. The clock (RealClock if null) must outlive the server.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(const CoordinatorConfig& config,
                                                                  const Clock* clock = nullptr);
  ~CoordinatorServer();  // Shutdown() if still running.

  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;

  // Stops accepting calls, finishes the ones in flight (up to a short deadline) and
  // stops the heartbeat monitor. Idempotent.
  void Shutdown();

  int port() const { return port_; }
  uint64_t incarnation() const { return registry_->coordinator_incarnation(); }
  WorkerRegistry* registry() { return registry_.get(); }
  // Null when the coordinator runs without a model.
  JobManager* jobs() { return jobs_.get(); }

 private:
  CoordinatorServer() = default;

  RealClock real_clock_;
  const Clock* clock_ = nullptr;
  int port_ = 0;
  std::unique_ptr<TokenAuthenticator> auth_;
  std::unique_ptr<WorkerRegistry> registry_;
  std::unique_ptr<ClusterServiceImpl> cluster_service_;
  std::unique_ptr<AdminServiceImpl> admin_service_;
  std::unique_ptr<BatchJobStore> store_;
  std::unique_ptr<PromptBuilder> prompts_;
  std::unique_ptr<GrpcWorkerChannel> worker_channel_;
  std::unique_ptr<ExpertBalancer> balancer_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HeartbeatMonitor> monitor_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_COORDINATOR_SERVER_H_
