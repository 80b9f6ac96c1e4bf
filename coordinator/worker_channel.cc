#include "coordinator/worker_channel.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/auth.h"

namespace deepinfer {

WorkerService::Stub* GrpcWorkerChannel::Stub(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) {
    stub = WorkerService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }
  return stub.get();
}

std::unique_ptr<grpc::ClientContext> GrpcWorkerChannel::Context() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  AttachAuthToken(auth_token_, context.get());
  return context;
}

absl::Status GrpcWorkerChannel::Annotate(const grpc::Status& status, const char* rpc,
                                         const std::string& address) const {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(rpc, " to worker ", address, ": ", status.error_message()));
}

absl::StatusOr<std::string> GrpcWorkerChannel::PrepareGroup(const std::string& address,
                                                            const PrepareGroupRequest& request) {
  PrepareGroupResponse response;
  grpc::Status status = Stub(address)->PrepareGroup(Context().get(), request, &response);
  if (!status.ok()) return Annotate(status, "PrepareGroup", address);
  return response.root_address();
}

absl::Status GrpcWorkerChannel::ConfigureGroup(const std::string& address,
                                               const ConfigureGroupRequest& request) {
  ConfigureGroupResponse response;
  return Annotate(Stub(address)->ConfigureGroup(Context().get(), request, &response),
                  "ConfigureGroup", address);
}

absl::Status GrpcWorkerChannel::SubmitRequests(const std::string& address,
                                               const SubmitRequestsRequest& request) {
  SubmitRequestsResponse response;
  return Annotate(Stub(address)->SubmitRequests(Context().get(), request, &response),
                  "SubmitRequests", address);
}

absl::Status GrpcWorkerChannel::CancelRequests(const std::string& address,
                                               const CancelRequestsRequest& request) {
  CancelRequestsResponse response;
  return Annotate(Stub(address)->CancelRequests(Context().get(), request, &response),
                  "CancelRequests", address);
}

absl::Status GrpcWorkerChannel::SetExpertPlacement(const std::string& address,
                                                   const SetExpertPlacementRequest& request) {
  SetExpertPlacementResponse response;
  return Annotate(Stub(address)->SetExpertPlacement(Context().get(), request, &response),
                  "SetExpertPlacement", address);
}

}  // namespace deepinfer
