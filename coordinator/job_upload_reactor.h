// JobUploadReactor: serves one JobService.UploadJob stream (proto/job.proto): the header, then
// the input's bytes to a JobInputUpload in the state directory, then the job through
// JobManager::SubmitStaged. An idempotency key that names a stored job is answered at the
// first message, without reading the rest. The file writes happen on a thread of the
// reactor's own, never inside a gRPC callback.
#ifndef DEEPINFER_COORDINATOR_JOB_UPLOAD_REACTOR_H_
#define DEEPINFER_COORDINATOR_JOB_UPLOAD_REACTOR_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "coordinator/job_manager.h"
#include "grpcpp/grpcpp.h"
#include "proto/job.grpc.pb.h"

namespace deepinfer {

// Longest idempotency key taken.
inline constexpr size_t kMaxIdempotencyKeyBytes = 256;

// The checks of an upload's header shared with the unary SubmitJob: the key's length, the
// checksum's size, the size's sign. INVALID_ARGUMENT saying which.
absl::Status CheckUploadHeader(const std::string& idempotency_key, int64_t input_bytes,
                               const std::string& input_sha256);
// RESOURCE_EXHAUSTED when `input_bytes` do not fit in the free space of `dir`'s filesystem.
absl::Status CheckRoomFor(const std::string& dir, int64_t input_bytes);

class JobUploadReactor : public grpc::ServerReadReactor<JobUploadChunk> {
 public:
  // `admitted`: the call's authentication (not OK: answered with it at once). `after_stored`
  // (may be empty) runs once a new job is stored, before the answer: a hook for tests.
  JobUploadReactor(JobManager* jobs, grpc::Status admitted, SubmitJobResponse* response,
                   std::function<void(const std::string& job_id)> after_stored);

  void OnReadDone(bool ok) override;
  void OnDone() override;

 private:
  void Run();
  // Reads the next message; false at the end of the stream (or when the call is gone).
  bool Read();
  grpc::Status Upload();

  JobManager* const jobs_;
  const grpc::Status admitted_;
  SubmitJobResponse* const response_;
  const std::function<void(const std::string&)> after_stored_;
  JobUploadChunk chunk_;

  absl::Mutex mu_;
  bool read_done_ ABSL_GUARDED_BY(mu_) = false;
  bool read_ok_ ABSL_GUARDED_BY(mu_) = false;
  absl::Notification started_;
  std::thread thread_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_JOB_UPLOAD_REACTOR_H_
