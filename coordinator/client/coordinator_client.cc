#include "coordinator/client/coordinator_client.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/auth.h"

namespace deepinfer {

CoordinatorClient::CoordinatorClient(CoordinatorClientOptions options)
    : options_(std::move(options)),
      admin_(AdminService::NewStub(
          grpc::CreateChannel(options_.address, grpc::InsecureChannelCredentials()))) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(1 << 30);  // job inputs
  jobs_ = JobService::NewStub(grpc::CreateCustomChannel(
      options_.address, grpc::InsecureChannelCredentials(), args));
}

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

absl::StatusOr<GetExpertLoadResponse> CoordinatorClient::GetExpertLoad() {
  GetExpertLoadRequest request;
  request.set_client_id(options_.client_id);
  GetExpertLoadResponse response;
  grpc::Status status = admin_->GetExpertLoad(NewContext().get(), request, &response);
  if (!status.ok()) return Annotate(status, "GetExpertLoad");
  return response;
}

absl::StatusOr<RebalanceResponse> CoordinatorClient::Rebalance(const std::string& policy,
                                                               bool dry_run) {
  RebalanceRequest request;
  request.set_client_id(options_.client_id);
  request.set_policy(policy);
  request.set_dry_run(dry_run);
  RebalanceResponse response;
  grpc::Status status = admin_->Rebalance(NewContext().get(), request, &response);
  if (!status.ok()) return Annotate(status, "Rebalance");
  return response;
}

absl::StatusOr<std::string> CoordinatorClient::SubmitJob(const std::string& name,
                                                         const std::string& input_jsonl) {
  SubmitJobRequest request;
  request.set_client_id(options_.client_id);
  request.set_name(name);
  request.set_input_jsonl(input_jsonl);
  SubmitJobResponse response;
  grpc::Status status = jobs_->SubmitJob(NewContext().get(), request, &response);
  if (!status.ok()) return Annotate(status, "SubmitJob");
  return response.job_id();
}

absl::StatusOr<Job> CoordinatorClient::GetJob(const std::string& job_id) {
  GetJobRequest request;
  request.set_client_id(options_.client_id);
  request.set_job_id(job_id);
  Job response;
  grpc::Status status = jobs_->GetJob(NewContext().get(), request, &response);
  if (!status.ok()) return Annotate(status, "GetJob");
  return response;
}

absl::StatusOr<ListJobsResponse> CoordinatorClient::ListJobs(int page_size,
                                                             const std::string& page_token) {
  ListJobsRequest request;
  request.set_client_id(options_.client_id);
  request.set_page_size(page_size);
  request.set_page_token(page_token);
  ListJobsResponse response;
  grpc::Status status = jobs_->ListJobs(NewContext().get(), request, &response);
  if (!status.ok()) return Annotate(status, "ListJobs");
  return response;
}

absl::StatusOr<Job> CoordinatorClient::CancelJob(const std::string& job_id) {
  CancelJobRequest request;
  request.set_client_id(options_.client_id);
  request.set_job_id(job_id);
  Job response;
  grpc::Status status = jobs_->CancelJob(NewContext().get(), request, &response);
  if (!status.ok()) return Annotate(status, "CancelJob");
  return response;
}

absl::StatusOr<Job> CoordinatorClient::WatchJob(const std::string& job_id,
                                                const std::function<void(const Job&)>& on_update,
                                                absl::Duration timeout) {
  GetJobRequest request;
  request.set_client_id(options_.client_id);
  request.set_job_id(job_id);
  grpc::ClientContext context;
  if (timeout > absl::ZeroDuration()) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
  AttachAuthToken(options_.auth_token, &context);
  std::unique_ptr<grpc::ClientReader<Job>> reader = jobs_->WatchJob(&context, request);
  Job job;
  bool any = false;
  while (reader->Read(&job)) {
    any = true;
    if (on_update) on_update(job);
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return Annotate(status, "WatchJob");
  if (!any) return absl::InternalError("WatchJob ended without a state");
  return job;
}

absl::Status CoordinatorClient::ReadResults(
    const std::string& job_id, const std::function<void(const std::string&)>& on_line) {
  int64_t offset = 0;
  for (;;) {
    GetJobResultsRequest request;
    request.set_client_id(options_.client_id);
    request.set_job_id(job_id);
    request.set_offset(offset);
    request.set_max_lines(1000);
    GetJobResultsResponse response;
    grpc::Status status = jobs_->GetJobResults(NewContext().get(), request, &response);
    if (!status.ok()) return Annotate(status, "GetJobResults");
    for (const std::string& line : response.lines()) on_line(line);
    offset += response.lines_size();
    if (response.lines_size() == 0) return absl::OkStatus();
  }
}

}  // namespace deepinfer
