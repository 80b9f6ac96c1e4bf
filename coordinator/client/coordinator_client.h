// CoordinatorClient: what the CLI and the admin tool say to the coordinator, with a
// deadline on every call and the auth token attached. Errors come back as
// absl::Status with the gRPC code and a message that names the coordinator.
#ifndef DEEPINFER_COORDINATOR_CLIENT_COORDINATOR_CLIENT_H_
#define DEEPINFER_COORDINATOR_CLIENT_COORDINATOR_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/admin.grpc.pb.h"

namespace deepinfer {

struct CoordinatorClientOptions {
  std::string address;
  std::string auth_token;
  // Sender id on each request, e.g. "deepinfer-admin@host".
  std::string client_id;
  absl::Duration timeout = absl::Seconds(10);
};

class CoordinatorClient {
 public:
  explicit CoordinatorClient(CoordinatorClientOptions options);

  absl::StatusOr<ClusterStatusResponse> ClusterStatus();
  absl::StatusOr<DrainWorkerResponse> DrainWorker(const std::string& worker_id);

 private:
  std::unique_ptr<grpc::ClientContext> NewContext() const;
  absl::Status Annotate(const grpc::Status& status, const char* rpc) const;

  CoordinatorClientOptions options_;
  std::unique_ptr<AdminService::Stub> admin_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_CLIENT_COORDINATOR_CLIENT_H_
