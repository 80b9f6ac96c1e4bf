// WorkerChannel: the calls the coordinator makes to workers (WorkerService), behind an
// interface so the job manager runs against fakes in tests. GrpcWorkerChannel is the
// real one.
#ifndef DEEPINFER_COORDINATOR_WORKER_CHANNEL_H_
#define DEEPINFER_COORDINATOR_WORKER_CHANNEL_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/worker.grpc.pb.h"

namespace deepinfer {

class WorkerChannel {
 public:
  virtual ~WorkerChannel() = default;
  // `address` is the worker's listen address ("host:port").
  virtual absl::StatusOr<std::string> PrepareGroup(const std::string& address,
                                                   const PrepareGroupRequest& request) = 0;
  virtual absl::Status ConfigureGroup(const std::string& address,
                                      const ConfigureGroupRequest& request) = 0;
  virtual absl::Status SubmitRequests(const std::string& address,
                                      const SubmitRequestsRequest& request) = 0;
  virtual absl::Status CancelRequests(const std::string& address,
                                      const CancelRequestsRequest& request) = 0;
  virtual absl::Status SetExpertPlacement(const std::string& address,
                                          const SetExpertPlacementRequest& request) = 0;
};

class GrpcWorkerChannel : public WorkerChannel {
 public:
  GrpcWorkerChannel(std::string auth_token, absl::Duration timeout)
      : auth_token_(std::move(auth_token)), timeout_(timeout) {}

  absl::StatusOr<std::string> PrepareGroup(const std::string& address,
                                           const PrepareGroupRequest& request) override;
  absl::Status ConfigureGroup(const std::string& address,
                              const ConfigureGroupRequest& request) override;
  absl::Status SubmitRequests(const std::string& address,
                              const SubmitRequestsRequest& request) override;
  absl::Status CancelRequests(const std::string& address,
                              const CancelRequestsRequest& request) override;
  absl::Status SetExpertPlacement(const std::string& address,
                                  const SetExpertPlacementRequest& request) override;

 private:
  WorkerService::Stub* Stub(const std::string& address);
  std::unique_ptr<grpc::ClientContext> Context() const;
  absl::Status Annotate(const grpc::Status& status, const char* rpc,
                        const std::string& address) const;

  const std::string auth_token_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<WorkerService::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_WORKER_CHANNEL_H_
