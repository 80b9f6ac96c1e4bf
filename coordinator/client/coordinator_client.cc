#include "coordinator/client/coordinator_client.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/rpc/auth.h"

namespace deepinfer {

CoordinatorClient::CoordinatorClient(CoordinatorClientOptions options)
    : options_(std::move(options)),
      admin_(AdminService::NewStub(
          grpc::CreateChannel(options_.address, grpc::InsecureChannelCredentials()))) {}

std::unique_ptr<grpc::ClientContext> CoordinatorClient::NewContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  AttachAuthToken(options_.auth_token, context.get());
  return context;
}

absl::Status CoordinatorClient::Annotate(const grpc::Status& status, const char* rpc) const {
  std::string hint;
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    hint = " (is deepinfer-coordinator running there?)";
  } else if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    hint = " (pass the cluster token with --auth-token-file)";
  }
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(rpc, " to coordinator ", options_.address, ": ",
                                   status.error_message(), hint));
}

absl::StatusOr<ClusterStatusResponse> CoordinatorClient::ClusterStatus() {
  ClusterStatusRequest request;
  request.set_client_id(options_.client_id);
  ClusterStatusResponse response;
  grpc::Status status = admin_->ClusterStatus(NewContext().get(), request, &response);
  if (!status.ok()) return Annotate(status, "ClusterStatus");
  return response;
}

absl::StatusOr<DrainWorkerResponse> CoordinatorClient::DrainWorker(const std::string& worker_id) {
  DrainWorkerRequest request;
  request.set_client_id(options_.client_id);
  request.set_worker_id(worker_id);
  DrainWorkerResponse response;
  grpc::Status status = admin_->DrainWorker(NewContext().get(), request, &response);
  if (!status.ok()) return Annotate(status, "DrainWorker");
  return response;
}

}  // namespace deepinfer
