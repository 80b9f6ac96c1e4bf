// Wall-clock time of a recorded op sequence (Backend::Capture) replayed back to back, for the
// benchmarks of this folder that time whole layers inside a CUDA graph.
#ifndef DEEPINFER_WORKER_BACKEND_CUDA_REPLAY_TIMING_H_
#define DEEPINFER_WORKER_BACKEND_CUDA_REPLAY_TIMING_H_

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"

namespace deepinfer {

// Median microseconds per replay of `ops`: 3 untimed replays, then 7 batches of `replays`
// back-to-back replays, each batch timed to the backend's Synchronize. The first failed
// replay's status otherwise.
inline absl::StatusOr<double> MedianReplayMicros(Backend& backend, CapturedOps& ops, int replays) {
  for (int i = 0; i < 3; ++i) {
    if (absl::Status st = ops.Replay(); !st.ok()) return st;
  }
  backend.Synchronize();
  std::vector<double> us;
  for (int rep = 0; rep < 7; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < replays; ++i) {
      if (absl::Status st = ops.Replay(); !st.ok()) return st;
    }
    backend.Synchronize();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                     .count() /
                 replays);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_CUDA_REPLAY_TIMING_H_
