// HostMemory: how much memory this machine can still give, for planning CPU ranks (whose
// weights and KV caches live in host memory; a GPU rank asks its Backend::MemoryInfo). Behind
// an interface so that tests can say how much there is.
#ifndef DEEPINFER_WORKER_ENGINE_HOST_MEMORY_H_
#define DEEPINFER_WORKER_ENGINE_HOST_MEMORY_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deepinfer {

class HostMemory {
 public:
  virtual ~HostMemory() = default;
  // Bytes new allocations can get without swapping.
  virtual absl::StatusOr<int64_t> AvailableBytes() const = 0;
};

// Linux's estimate, MemAvailable in /proc/meminfo (free memory plus the page cache and slabs
// that can be reclaimed). It does not know cgroup limits.
class ProcMeminfo final : public HostMemory {
 public:
  explicit ProcMeminfo(std::string path = "/proc/meminfo") : path_(std::move(path)) {}
  // NOT_FOUND if the file cannot be read; DATA_LOSS if it has no MemAvailable line.
  absl::StatusOr<int64_t> AvailableBytes() const override;

 private:
  std::string path_;
};

// The MemAvailable line of /proc/meminfo text ("MemAvailable:   21612004 kB"), in bytes.
absl::StatusOr<int64_t> ParseMemAvailable(absl::string_view meminfo);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_ENGINE_HOST_MEMORY_H_
