// gRPC glue for JobService (proto/job.proto) over the JobManager. Without a job
// manager (coordinator started without --model) every RPC fails with
// FAILED_PRECONDITION saying so.
#ifndef DEEPINFER_COORDINATOR_JOB_SERVICE_H_
#define DEEPINFER_COORDINATOR_JOB_SERVICE_H_

#include <functional>
#include <string>

#include "common/rpc/auth.h"
#include "coordinator/job_manager.h"
#include "proto/job.grpc.pb.h"

namespace deepinfer {

class JobServiceImpl final : public JobService::CallbackService {
 public:
  // `jobs` may be null; both pointers must outlive the service. `after_stored` (may be empty)
  // runs once an uploaded job is stored, before the answer is sent: a hook for tests.
  JobServiceImpl(JobManager* jobs, const TokenAuthenticator* auth,
                 std::function<void(const std::string& job_id)> after_stored = nullptr)
      : jobs_(jobs), auth_(auth), after_stored_(std::move(after_stored)) {}

  grpc::ServerReadReactor<JobUploadChunk>* UploadJob(grpc::CallbackServerContext* context,
                                                     SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const SubmitJobRequest* request,
                                      SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const GetJobRequest* request, Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const ListJobsRequest* request,
                                     ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const CancelJobRequest* request, Job* response) override;
  grpc::ServerWriteReactor<Job>* WatchJob(grpc::CallbackServerContext* context,
                                          const GetJobRequest* request) override;
  grpc::ServerUnaryReactor* GetJobResults(grpc::CallbackServerContext* context,
                                          const GetJobResultsRequest* request,
                                          GetJobResultsResponse* response) override;

 private:
  // OK, or the status to finish the call with.
  grpc::Status Admit(grpc::CallbackServerContext* context) const;

  JobManager* const jobs_;
  const TokenAuthenticator* const auth_;
  const std::function<void(const std::string&)> after_stored_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_JOB_SERVICE_H_
