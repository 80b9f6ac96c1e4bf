// gRPC glue for AdminService (proto/admin.proto): cluster status and worker drain,
// read from and applied to the WorkerRegistry (the group's state from the JobManager); EPLB
// load statistics and rebalancing through the ExpertBalancer and the JobManager (which owns
// the group and sends placements).
#ifndef DEEPINFER_COORDINATOR_ADMIN_SERVICE_H_
#define DEEPINFER_COORDINATOR_ADMIN_SERVICE_H_

#include "absl/time/time.h"
#include "common/rpc/auth.h"
#include "coordinator/clock.h"
#include "coordinator/expert_balancer.h"
#include "coordinator/job_manager.h"
#include "coordinator/worker_registry.h"
#include "proto/admin.grpc.pb.h"

namespace deepinfer {

class AdminServiceImpl final : public AdminService::CallbackService {
 public:
  // All pointers must outlive the service; `start_time` is the coordinator's.
  AdminServiceImpl(WorkerRegistry* registry, const TokenAuthenticator* auth, const Clock* clock,
                   absl::Time start_time);

  grpc::ServerUnaryReactor* ClusterStatus(grpc::CallbackServerContext* context,
                                          const ClusterStatusRequest* request,
                                          ClusterStatusResponse* response) override;
  grpc::ServerUnaryReactor* DrainWorker(grpc::CallbackServerContext* context,
                                        const DrainWorkerRequest* request,
                                        DrainWorkerResponse* response) override;
  grpc::ServerUnaryReactor* GetExpertLoad(grpc::CallbackServerContext* context,
                                          const GetExpertLoadRequest* request,
                                          GetExpertLoadResponse* response) override;
  grpc::ServerUnaryReactor* Rebalance(grpc::CallbackServerContext* context,
                                      const RebalanceRequest* request,
                                      RebalanceResponse* response) override;

  // The group (ClusterStatus) and EPLB; null (the default) when the coordinator runs without
  // a model, and no balancer for a model without routed experts.
  void set_job_manager(JobManager* jobs) { jobs_ = jobs; }
  void set_expert_balancer(ExpertBalancer* balancer) { balancer_ = balancer; }

 private:
  WorkerRegistry* const registry_;
  const TokenAuthenticator* const auth_;
  const Clock* const clock_;
  const absl::Time start_time_;
  JobManager* jobs_ = nullptr;
  ExpertBalancer* balancer_ = nullptr;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_ADMIN_SERVICE_H_
