// WeightUploader: makes the device buffers of a model's weights from bytes computed on the host
// (read from the checkpoint, dequantised, converted to the weight dtype), serially or in
// parallel.
//
// The loader adds one job per tensor (or group of tensors made together: an MLP's stacked
// [gate; up], kv_b with its transpose): the sizes of its device buffers, where they go, the
// checkpoint shard it reads and a function that writes the bytes. Run() then makes them all:
//   * threads <= 1: each job in the order added, its bytes in ordinary host memory, uploaded with
//     Backend::CopyToDevice (what loading always did);
//   * threads > 1: the host work runs on `threads` threads, each starting on a shard of its own
//     and going on to other shards' jobs once its shards are done, writing into staging buffers
//     (Backend::AllocateHostStaging: page-locked on CUDA, reused from job to job); the calling
//     thread allocates the device buffers and uploads each job as soon as it is ready
//     (Backend::CopyToDeviceAsync: on CUDA the copies run on the copy engine while the threads
//     go on), synchronising the backend before it reuses staging memory. Staging and host
//     scratch in flight stay within `staging_bytes` (one job larger than that runs alone).
// Either way every buffer gets exactly the bytes its job wrote (weight_uploader_test and
// model_weights' parallel load test check the device bytes against the serial load), and a
// failing run returns the same error.
//
// Not thread-safe: one thread adds the jobs and runs them.
#ifndef DEEPINFER_WORKER_MODEL_WEIGHT_UPLOADER_H_
#define DEEPINFER_WORKER_MODEL_WEIGHT_UPLOADER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/backend/backend.h"

namespace deepinfer {

struct WeightUploadOptions {
  int threads = 1;
  int64_t staging_bytes = int64_t{1} << 30;
};

class WeightUploader {
 public:
  // Writes out[i] (sizes[i] bytes) for each buffer of a job; may run on any thread.
  using Produce = std::function<absl::Status(const std::vector<char*>& out)>;

  WeightUploader(Backend* backend, WeightUploadOptions options);

  // A job: device buffers of `sizes` bytes into `outs` (which must stay valid until Run()
  // returns), their bytes from `produce`, which reads checkpoint shard `shard` (any key; jobs of
  // one shard are taken in order) and needs `scratch_bytes` of host memory of its own meanwhile.
  void Add(const std::string& shard, std::vector<size_t> sizes,
           std::vector<std::unique_ptr<DeviceBuffer>*> outs, int64_t scratch_bytes,
           Produce produce);

  // Makes every job's buffers. On failure, the error of the lowest-numbered failing job (in the
  // order added), whatever the thread count: jobs before it still run, later ones may not
  // (then buffers may be missing).
  absl::Status Run();

  // Device bytes of the jobs added so far.
  int64_t bytes() const { return bytes_; }
  int jobs() const { return static_cast<int>(jobs_.size()); }

 private:
  struct Job {
    std::vector<size_t> sizes;
    std::vector<std::unique_ptr<DeviceBuffer>*> outs;
    int64_t scratch_bytes = 0;
    Produce produce;
  };
  absl::Status RunSerially();
  absl::Status RunInParallel();

  Backend* const backend_;
  const WeightUploadOptions options_;
  std::vector<Job> jobs_;
  std::vector<std::string> shards_;         // in order of first use
  std::vector<std::vector<int>> by_shard_;  // job indices per shard, in order
  int64_t bytes_ = 0;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_WEIGHT_UPLOADER_H_
