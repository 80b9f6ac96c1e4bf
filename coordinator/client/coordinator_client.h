// CoordinatorClient: what the CLI and the admin tool say to the coordinator, with a
// deadline on every call and the auth token attached. Errors come back as
// absl::Status with the gRPC code and a message that names the coordinator.
#ifndef DEEPINFER_COORDINATOR_CLIENT_COORDINATOR_CLIENT_H_
#define DEEPINFER_COORDINATOR_CLIENT_COORDINATOR_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include <functional>
#include <vector>

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

class CoordinatorClient {
 public:
  explicit CoordinatorClient(CoordinatorClientOptions options);

  absl::StatusOr<ClusterStatusResponse> ClusterStatus();
  absl::StatusOr<DrainWorkerResponse> DrainWorker(const std::string& worker_id);
  // EPLB (docs/eplb.md).
  absl::StatusOr<GetExpertLoadResponse> GetExpertLoad();
  absl::StatusOr<RebalanceResponse> Rebalance(const std::string& policy, bool dry_run);

  // Jobs (JobService).
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
  absl::Status Annotate(const grpc::Status& status, const char* rpc) const;

  CoordinatorClientOptions options_;
  std::unique_ptr<AdminService::Stub> admin_;
  std::unique_ptr<JobService::Stub> jobs_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_CLIENT_COORDINATOR_CLIENT_H_
