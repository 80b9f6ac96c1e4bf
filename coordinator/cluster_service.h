// gRPC glue for ClusterService (proto/cluster.proto): authenticates each call and
// hands it to the WorkerRegistry. Callback API; every handler finishes inline
// because registry operations only take a short mutex.
#ifndef DEEPINFER_COORDINATOR_CLUSTER_SERVICE_H_
#define DEEPINFER_COORDINATOR_CLUSTER_SERVICE_H_

#include "absl/time/time.h"
#include "common/rpc/auth.h"
#include "coordinator/expert_balancer.h"
#include "coordinator/job_manager.h"
#include "coordinator/worker_registry.h"
#include "proto/cluster.grpc.pb.h"

namespace deepinfer {

class ClusterServiceImpl final : public ClusterService::CallbackService {
 public:
  // Both pointers must outlive the service.
  ClusterServiceImpl(WorkerRegistry* registry, const TokenAuthenticator* auth,
                     absl::Duration heartbeat_interval);

  // Results, and the request progress in heartbeats, go to `jobs` once it is set (before
  // serving starts); may stay null.
  void set_job_manager(JobManager* jobs) { jobs_ = jobs; }
  // EPLB load statistics from heartbeats go here (optional; must outlive the service).
  void set_expert_balancer(ExpertBalancer* balancer) { balancer_ = balancer; }

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const RegisterRequest* request,
                                     RegisterResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const HeartbeatRequest* request,
                                      HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* ReportResults(grpc::CallbackServerContext* context,
                                          const ReportResultsRequest* request,
                                          ReportResultsResponse* response) override;
  grpc::ServerUnaryReactor* Deregister(grpc::CallbackServerContext* context,
                                       const DeregisterRequest* request,
                                       DeregisterResponse* response) override;

 private:
  WorkerRegistry* const registry_;
  const TokenAuthenticator* const auth_;
  const absl::Duration heartbeat_interval_;
  JobManager* jobs_ = nullptr;
  ExpertBalancer* balancer_ = nullptr;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_CLUSTER_SERVICE_H_
