#include "coordinator/job_upload_reactor.h"

#include <sys/statvfs.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rpc/auth.h"
#include "coordinator/batch/job_input_upload.h"
#include "glog/logging.h"

namespace deepinfer {
namespace {

std::string GiB(int64_t bytes) { return absl::StrFormat("%.2f GiB", bytes / double(1 << 30)); }

}  // namespace

absl::Status CheckUploadHeader(const std::string& idempotency_key, int64_t input_bytes,
                               const std::string& input_sha256) {
  if (idempotency_key.size() > kMaxIdempotencyKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the idempotency key has ",
                                                   idempotency_key.size(), " bytes; at most ",
                                                   kMaxIdempotencyKeyBytes, " are taken"));
  }
  if (!input_sha256.empty() && input_sha256.size() != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("input_sha256 has ", input_sha256.size(), " bytes, not 32"));
  }
  if (input_bytes < 0) return absl::InvalidArgumentError("input_bytes is negative");
  return absl::OkStatus();
}

absl::Status CheckRoomFor(const std::string& dir, int64_t input_bytes) {
  struct statvfs fs;
  if (statvfs(dir.c_str(), &fs) == 0) {
    const int64_t free = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
    if (input_bytes > free) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the job's input (", GiB(input_bytes),
                       ") does not fit in the free space of the coordinator's state directory (",
                       GiB(free), ")"));
    }
  }
  return absl::OkStatus();
}

JobUploadReactor::JobUploadReactor(JobManager* jobs, grpc::Status admitted,
                                   SubmitJobResponse* response,
                                   std::function<void(const std::string&)> after_stored)
    : jobs_(jobs),
      admitted_(std::move(admitted)),
      response_(response),
      after_stored_(std::move(after_stored)) {
  thread_ = std::thread([this] {
    // Not before thread_ is set: OnDone, which may follow Finish at once, joins it.
    started_.WaitForNotification();
    Run();
  });
  started_.Notify();
}

void JobUploadReactor::OnReadDone(bool ok) {
  absl::MutexLock lock(&mu_);
  read_done_ = true;
  read_ok_ = ok;
}

void JobUploadReactor::OnDone() {
  // gRPC may run OnDone inline from Finish on our own thread; never join ourselves.
  if (std::this_thread::get_id() == thread_.get_id()) {
    thread_.detach();
  } else {
    thread_.join();
  }
  delete this;
}

bool JobUploadReactor::Read() {
  {
    absl::MutexLock lock(&mu_);
    read_done_ = false;
  }
  StartRead(&chunk_);
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&read_done_));
  return read_ok_;
}

void JobUploadReactor::Run() {
  if (!admitted_.ok()) {
    Finish(admitted_);
    return;
  }
  Finish(Upload());
}

grpc::Status JobUploadReactor::Upload() {
  auto invalid = [](const std::string& message) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
  };
  if (!Read()) return invalid("the upload ended before its header");
  if (!chunk_.has_header()) return invalid("the first message of an upload must carry the header");
  const JobUploadHeader header = chunk_.header();
  if (absl::Status s =
          CheckUploadHeader(header.idempotency_key(), header.input_bytes(), header.input_sha256());
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (!header.idempotency_key().empty()) {
    absl::StatusOr<std::optional<BatchJobStore::KeyedJob>> keyed =
        jobs_->FindJobByIdempotencyKey(header.idempotency_key());
    if (!keyed.ok()) return ToGrpcStatus(keyed.status());
    if (keyed->has_value()) {
      const BatchJobStore::KeyedJob& job = **keyed;
      if (!header.input_sha256().empty() && !job.input_sha256.empty() &&
          header.input_sha256() != job.input_sha256) {
        return grpc::Status(
            grpc::StatusCode::ALREADY_EXISTS,
            absl::StrCat("idempotency key '", header.idempotency_key(), "' belongs to job ",
                         job.job_id, ", whose input was different"));
      }
      // The rest of the stream is not needed: answering now ends it.
      LOG(INFO) << "job " << job.job_id << " uploaded again (idempotency key)";
      response_->set_job_id(job.job_id);
      response_->set_existing(true);
      return grpc::Status::OK;
    }
  }
  if (absl::Status s = CheckRoomFor(jobs_->StagingDir(), header.input_bytes()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<std::unique_ptr<JobInputUpload>> upload =
      JobInputUpload::Create(jobs_->NewStagingPath(), header.input_bytes());
  if (!upload.ok()) return ToGrpcStatus(upload.status());
  for (bool first = true;; first = false) {
    if (!first && chunk_.has_header()) {
      return invalid("only the first message of an upload may carry a header");
    }
    if (absl::Status s = (*upload)->Append(chunk_.data()); !s.ok()) return ToGrpcStatus(s);
    if (!Read()) break;
  }
  // The stream ended: either the client said it was done, or the call is gone (then no answer
  // reaches anyone, and the job is not made).
  absl::StatusOr<StagedInput> staged = (*upload)->Finish(header.input_sha256());
  if (!staged.ok()) return ToGrpcStatus(staged.status());
  absl::StatusOr<BatchJobStore::CreatedJob> created =
      jobs_->SubmitStaged(header.name(), header.idempotency_key(), *staged);
  if (!created.ok()) return ToGrpcStatus(created.status());
  if (!created->existing && after_stored_) after_stored_(created->job_id);
  response_->set_job_id(created->job_id);
  response_->set_existing(created->existing);
  return grpc::Status::OK;
}

}  // namespace deepinfer
