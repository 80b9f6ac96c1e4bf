// RequestQueue: the thread-safe inbox of one rank's engine. RPC handlers push work items and
// cancellations from any thread without waiting for the engine; the engine loop drains it
// between steps and sleeps on it when the group is idle. It exists apart from the Engine so
// that a rank can take requests while its model is still loading.
#ifndef DEEPINFER_WORKER_ENGINE_REQUEST_QUEUE_H_
#define DEEPINFER_WORKER_ENGINE_REQUEST_QUEUE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/worker.pb.h"

namespace deepinfer {

class RequestQueue {
 public:
  struct Drained {
    std::vector<WorkItem> items;
    std::vector<std::string> cancelled;
  };

  void Push(std::vector<WorkItem> items);
  void Cancel(const std::vector<std::string>& request_ids);
  // Takes everything pushed so far.
  Drained Drain();
  // Returns once something was pushed or cancelled, Wake() was called, or `timeout` passed.
  void WaitForWork(absl::Duration timeout);
  void Wake();

  // What waits in the queue (not yet in the engine).
  int32_t num_items() const;
  int64_t num_tokens() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<WorkItem> items_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> cancelled_ ABSL_GUARDED_BY(mu_);
  int64_t tokens_ ABSL_GUARDED_BY(mu_) = 0;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_ENGINE_REQUEST_QUEUE_H_
