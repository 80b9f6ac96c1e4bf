#include "coordinator/job_service.h"

#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"
#include "coordinator/batch/job_input_upload.h"
#include "coordinator/job_upload_reactor.h"
#include "glog/logging.h"

namespace deepinfer {
namespace {

// Largest accepted job input; gRPC's receive limit is raised to match on the server.
constexpr size_t kMaxInputBytes = size_t{1} << 30;

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context, grpc::Status status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(std::move(status));
  return reactor;
}

bool IsFinal(Job::State s) {
  return s == Job::COMPLETED || s == Job::FAILED || s == Job::CANCELLED;
}

// Streams a job's state until it is final. The waiting happens on a thread of its
// own, never inside a reactor callback.
class JobWatcher : public grpc::ServerWriteReactor<Job> {
 public:
  JobWatcher(JobManager* jobs, std::string job_id) : jobs_(jobs), job_id_(std::move(job_id)) {
    thread_ = std::thread([this] { Run(); });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) cancelled_ = true;
    write_done_.store(true);
  }
  void OnCancel() override { cancelled_ = true; }
  void OnDone() override {
    // gRPC may run OnDone inline from Finish on our own thread; never join ourselves.
    if (std::this_thread::get_id() == thread_.get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
    delete this;
  }

 private:
  void Run() {
    uint64_t version = 0;
    std::string last_sent;
    for (;;) {
      jobs_->WaitForChange(&version, absl::Milliseconds(500));
      if (cancelled_) {
        Finish(grpc::Status::CANCELLED);
        return;
      }
      absl::StatusOr<Job> job = jobs_->GetJob(job_id_);
      if (!job.ok()) {
        Finish(ToGrpcStatus(job.status()));
        return;
      }
      // Any change is sent: counts, tokens of running requests, the cluster notice.
      std::string serialized = job->SerializeAsString();
      if (serialized == last_sent) continue;
      last_sent = std::move(serialized);
      current_ = *job;
      write_done_.store(false);
      StartWrite(&current_);
      while (!write_done_.load() && !cancelled_) absl::SleepFor(absl::Milliseconds(2));
      if (cancelled_) {
        Finish(grpc::Status::CANCELLED);
        return;
      }
      if (IsFinal(job->state())) {
        Finish(grpc::Status::OK);
        return;
      }
    }
  }

  JobManager* const jobs_;
  const std::string job_id_;
  Job current_;
  std::atomic<bool> write_done_{false};
  std::atomic<bool> cancelled_{false};
  std::thread thread_;
};

class FailedWriter : public grpc::ServerWriteReactor<Job> {
 public:
  explicit FailedWriter(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

// A unary call answered from a thread of its own.
class OffThreadReactor : public grpc::ServerUnaryReactor {
 public:
  explicit OffThreadReactor(std::function<grpc::Status()> work) {
    thread_ = std::thread([this, work = std::move(work)] {
      // Not before thread_ is set: OnDone, which may follow Finish at once, joins it.
      started_.WaitForNotification();
      Finish(work());
    });
    started_.Notify();
  }
  void OnDone() override {
    // gRPC may run OnDone inline from Finish on our own thread; never join ourselves.
    if (std::this_thread::get_id() == thread_.get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
    delete this;
  }

 private:
  absl::Notification started_;
  std::thread thread_;
};

// SubmitJob's input, in one message, through the same staging as an upload.
grpc::Status StoreWholeInput(JobManager* jobs, const SubmitJobRequest& request,
                             SubmitJobResponse* response,
                             const std::function<void(const std::string&)>& after_stored) {
  const std::string& input = request.input_jsonl();
  const std::string sha256 = [&] {
    Sha256 h;
    h.Update(input);
    return h.Finish();
  }();
  if (absl::Status s =
          CheckUploadHeader(request.idempotency_key(), static_cast<int64_t>(input.size()), sha256);
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (absl::Status s = CheckRoomFor(jobs->StagingDir(), static_cast<int64_t>(input.size()));
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<std::unique_ptr<JobInputUpload>> upload =
      JobInputUpload::Create(jobs->NewStagingPath(), static_cast<int64_t>(input.size()));
  if (!upload.ok()) return ToGrpcStatus(upload.status());
  if (absl::Status s = (*upload)->Append(input); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<StagedInput> staged = (*upload)->Finish(sha256);
  if (!staged.ok()) return ToGrpcStatus(staged.status());
  absl::StatusOr<BatchJobStore::CreatedJob> created =
      jobs->SubmitStaged(request.name(), request.idempotency_key(), *staged);
  if (!created.ok()) return ToGrpcStatus(created.status());
  if (!created->existing && after_stored) after_stored(created->job_id);
  response->set_job_id(created->job_id);
  response->set_existing(created->existing);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status JobServiceImpl::Admit(grpc::CallbackServerContext* context) const {
  if (grpc::Status s = auth_->Check(*context); !s.ok()) return s;
  if (jobs_ == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this coordinator runs without a model (--model): it takes no jobs");
  }
  return grpc::Status::OK;
}

grpc::ServerReadReactor<JobUploadChunk>* JobServiceImpl::UploadJob(
    grpc::CallbackServerContext* context, SubmitJobResponse* response) {
  return new JobUploadReactor(jobs_, Admit(context), response, after_stored_);
}

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* context,
                                                    const SubmitJobRequest* request,
                                                    SubmitJobResponse* response) {
  if (grpc::Status s = Admit(context); !s.ok()) return Finish(context, s);
  if (request->input_jsonl().size() > kMaxInputBytes) {
    return Finish(
        context, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "job input larger than 1 GiB"));
  }
  // Writing and syncing up to 1 GiB is no work for a gRPC thread.
  return new OffThreadReactor([this, request, response] {
    return StoreWholeInput(jobs_, *request, response, after_stored_);
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* context,
                                                 const GetJobRequest* request, Job* response) {
  if (grpc::Status s = Admit(context); !s.ok()) return Finish(context, s);
  absl::StatusOr<Job> job = jobs_->GetJob(request->job_id());
  if (!job.ok()) return Finish(context, ToGrpcStatus(job.status()));
  *response = *job;
  return Finish(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* context,
                                                   const ListJobsRequest* request,
                                                   ListJobsResponse* response) {
  if (grpc::Status s = Admit(context); !s.ok()) return Finish(context, s);
  const int page_size = request->page_size() > 0 ? request->page_size() : 50;
  absl::StatusOr<std::vector<Job>> jobs = jobs_->ListJobs(page_size, request->page_token());
  if (!jobs.ok()) return Finish(context, ToGrpcStatus(jobs.status()));
  for (const Job& j : *jobs) *response->add_jobs() = j;
  if (static_cast<int>(jobs->size()) == page_size) {
    response->set_next_page_token(jobs->back().job_id());
  }
  return Finish(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* context,
                                                    const CancelJobRequest* request,
                                                    Job* response) {
  if (grpc::Status s = Admit(context); !s.ok()) return Finish(context, s);
  absl::StatusOr<Job> job = jobs_->Cancel(request->job_id());
  if (!job.ok()) return Finish(context, ToGrpcStatus(job.status()));
  *response = *job;
  return Finish(context, grpc::Status::OK);
}

grpc::ServerWriteReactor<Job>* JobServiceImpl::WatchJob(grpc::CallbackServerContext* context,
                                                        const GetJobRequest* request) {
  if (grpc::Status s = Admit(context); !s.ok()) return new FailedWriter(s);
  if (absl::StatusOr<Job> job = jobs_->GetJob(request->job_id()); !job.ok()) {
    return new FailedWriter(ToGrpcStatus(job.status()));
  }
  return new JobWatcher(jobs_, request->job_id());
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJobResults(grpc::CallbackServerContext* context,
                                                        const GetJobResultsRequest* request,
                                                        GetJobResultsResponse* response) {
  if (grpc::Status s = Admit(context); !s.ok()) return Finish(context, s);
  absl::StatusOr<Job> job = jobs_->GetJob(request->job_id());
  if (!job.ok()) return Finish(context, ToGrpcStatus(job.status()));
  const int64_t max_lines = request->max_lines() > 0 ? request->max_lines() : 1000;
  absl::StatusOr<std::vector<std::string>> lines =
      jobs_->Results(request->job_id(), request->offset(), max_lines);
  if (!lines.ok()) return Finish(context, ToGrpcStatus(lines.status()));
  int64_t bytes = 0;
  for (std::string& line : *lines) {
    // Stay well under gRPC's 4 MB default on the client side; the rest comes next page.
    bytes += static_cast<int64_t>(line.size());
    if (bytes > (3 << 20) && response->lines_size() > 0) break;
    response->add_lines(std::move(line));
  }
  const int64_t returned_to = request->offset() + response->lines_size();
  response->set_done(IsFinal(job->state()) &&
                     returned_to >= job->completed_requests() + job->failed_requests());
  return Finish(context, grpc::Status::OK);
}

}  // namespace deepinfer
