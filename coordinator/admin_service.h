// gRPC glue for AdminService (proto/admin.proto): cluster status and worker drain,
// read from and applied to the WorkerRegistry.
#ifndef DEEPINFER_COORDINATOR_ADMIN_SERVICE_H_
#define DEEPINFER_COORDINATOR_ADMIN_SERVICE_H_

#include "absl/time/time.h"
#include "coordinator/clock.h"
#include "coordinator/rpc/auth.h"
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

 private:
  WorkerRegistry* const registry_;
  const TokenAuthenticator* const auth_;
  const Clock* const clock_;
  const absl::Time start_time_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_ADMIN_SERVICE_H_
