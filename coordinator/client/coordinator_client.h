// CoordinatorClient: what the CLI and the admin tool say to the coordinator, with a
// deadline on every call and the auth token attached. Errors come back as
// absl::Status with the gRPC code and a message that names the coordinator.
#ifndef DEEPINFER_COORDINATOR_CLIENT_COORDINATOR_CLIENT_H_
#define DEEPINFER_COORDINATOR_CLIENT_COORDINATOR_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/admin.grpc.pb.h"
#include "proto/job.grpc.pb.h"

namespace deepinfer {

struct CoordinatorClientOptions {
  std::string address;
  std::string auth_token;
  // Sender id on each request, e.g. "deepinfer-admin@host".
  std::string client_id;
  absl::Duration timeout = absl::Seconds(10);
};

// How a job's input travels (JobService.UploadJob).
struct UploadOptions {
  // A retry with the same key returns the job the first attempt made, if it made one; ""
  // makes a new job every time.
  std::string idempotency_key;
  // SHA-256 of the input (32 bytes), which the coordinator checks; "": not checked.
  std::string input_sha256;
  // Bytes per message.
  size_t chunk_bytes = size_t{1} << 20;
};

struct SubmittedJob {
  std::string job_id;
  // The idempotency key named a job stored before: this is that job.
  bool existing = false;
};

// The deadline of an upload: the client's timeout plus one second per this many bytes, so a
// large input has time to travel.
inline constexpr int64_t kUploadBytesPerSecond = int64_t{16} << 20;

class CoordinatorClient {
 public:
  explicit CoordinatorClient(CoordinatorClientOptions options);

  absl::StatusOr<ClusterStatusResponse> ClusterStatus();
  absl::StatusOr<DrainWorkerResponse> DrainWorker(const std::string& worker_id);
  // EPLB (docs/eplb.md).
  absl::StatusOr<GetExpertLoadResponse> GetExpertLoad();
  absl::StatusOr<RebalanceResponse> Rebalance(const std::string& policy, bool dry_run);

  // Jobs (JobService). Streams the input file at `path` in chunks (UploadJob); the answer
  // comes once the coordinator stored it (before validation).
  absl::StatusOr<SubmittedJob> UploadJobFile(const std::string& name, const std::string& path,
                                             const UploadOptions& options);
  // The same for an input in memory.
  absl::StatusOr<SubmittedJob> UploadJob(const std::string& name, absl::string_view input,
                                         const UploadOptions& options);
  // UploadJob without a key: a new job.
  absl::StatusOr<std::string> SubmitJob(const std::string& name, const std::string& input_jsonl);
  absl::StatusOr<Job> GetJob(const std::string& job_id);
  absl::StatusOr<ListJobsResponse> ListJobs(int page_size, const std::string& page_token);
  absl::StatusOr<Job> CancelJob(const std::string& job_id);
  // Calls `on_update` with the job's state as it changes, until it is final; returns
  // the final state. No deadline of its own beyond `timeout` (infinite if zero).
  absl::StatusOr<Job> WatchJob(const std::string& job_id,
                               const std::function<void(const Job&)>& on_update,
                               absl::Duration timeout = absl::ZeroDuration());
  // Every output line of the job, page by page, to `on_line`.
  absl::Status ReadResults(const std::string& job_id,
                           const std::function<void(const std::string&)>& on_line);

 private:
  std::unique_ptr<grpc::ClientContext> NewContext() const;
  // Streams `size` bytes that `read` hands out (it fills the string with the next piece and
  // returns false on a read error).
  absl::StatusOr<SubmittedJob> Upload(const std::string& name, int64_t size,
                                      const UploadOptions& options,
                                      const std::function<bool(size_t, std::string*)>& read);
  absl::Status Annotate(const grpc::Status& status, const char* rpc) const;

  CoordinatorClientOptions options_;
  std::unique_ptr<AdminService::Stub> admin_;
  std::unique_ptr<JobService::Stub> jobs_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_CLIENT_COORDINATOR_CLIENT_H_
