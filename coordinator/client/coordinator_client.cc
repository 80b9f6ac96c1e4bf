#include "coordinator/client/coordinator_client.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

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
  jobs_ = JobService::NewStub(
      grpc::CreateCustomChannel(options_.address, grpc::InsecureChannelCredentials(), args));
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
  return absl::Status(
      static_cast<absl::StatusCode>(status.error_code()),
      absl::StrCat(rpc, " to coordinator ", options_.address, ": ", status.error_message(), hint));
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

absl::StatusOr<SubmittedJob> CoordinatorClient::Upload(
    const std::string& name, int64_t size, const UploadOptions& options,
    const std::function<bool(size_t, std::string*)>& read) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout +
                                          absl::Seconds(size / kUploadBytesPerSecond)));
  AttachAuthToken(options_.auth_token, &context);
  SubmitJobResponse response;
  std::unique_ptr<grpc::ClientWriter<JobUploadChunk>> writer =
      jobs_->UploadJob(&context, &response);
  JobUploadChunk chunk;
  JobUploadHeader* header = chunk.mutable_header();
  header->set_client_id(options_.client_id);
  header->set_name(name);
  header->set_idempotency_key(options.idempotency_key);
  header->set_input_bytes(size);
  header->set_input_sha256(options.input_sha256);
  const size_t chunk_bytes = std::max<size_t>(1, options.chunk_bytes);
  int64_t sent = 0;
  bool read_failed = false;
  // A Write that fails means the coordinator answered already (a known idempotency key, or an
  // error): Finish says which.
  for (bool first = true; first || sent < size; first = false) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(chunk_bytes, size - sent));
    if (!read(n, chunk.mutable_data())) {
      read_failed = true;
      context.TryCancel();
      break;
    }
    sent += static_cast<int64_t>(n);
    if (!writer->Write(chunk)) break;
    chunk.clear_header();
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (read_failed) return absl::DataLossError("the input could not be read to the end");
  if (!status.ok()) return Annotate(status, "UploadJob");
  return SubmittedJob{response.job_id(), response.existing()};
}

absl::StatusOr<SubmittedJob> CoordinatorClient::UploadJob(const std::string& name,
                                                          absl::string_view input,
                                                          const UploadOptions& options) {
  size_t at = 0;
  return Upload(name, static_cast<int64_t>(input.size()), options, [&](size_t n, std::string* out) {
    out->assign(input.data() + at, n);
    at += n;
    return true;
  });
}

absl::StatusOr<SubmittedJob> CoordinatorClient::UploadJobFile(const std::string& name,
                                                              const std::string& path,
                                                              const UploadOptions& options) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (file == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot read '", path, "': ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fileno(file.get()), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  }
  absl::StatusOr<SubmittedJob> job =
      Upload(name, st.st_size, options, [&](size_t n, std::string* out) {
        out->resize(n);
        return std::fread(out->data(), 1, n, file.get()) == n;
      });
  if (!job.ok() && job.status().code() == absl::StatusCode::kDataLoss) {
    return absl::DataLossError(
        absl::StrCat("'", path, "' could not be read to its end (did it change?)"));
  }
  return job;
}

absl::StatusOr<std::string> CoordinatorClient::SubmitJob(const std::string& name,
                                                         const std::string& input_jsonl) {
  absl::StatusOr<SubmittedJob> job = UploadJob(name, input_jsonl, UploadOptions());
  if (!job.ok()) return job.status();
  return job->job_id;
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
