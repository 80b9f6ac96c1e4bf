// ResultOutbox: finished requests waiting to be delivered to the coordinator. Rank threads
// add results; the CoordinatorLink's sender thread peeks a batch, sends it, and removes it
// only once the coordinator acknowledged it, so results survive failed calls and a coordinator
// restart (they are resent after re-registering; the coordinator ignores duplicates). Lives
// in memory: a worker restart loses them, and the coordinator re-runs those requests.
#ifndef DEEPINFER_WORKER_RESULT_OUTBOX_H_
#define DEEPINFER_WORKER_RESULT_OUTBOX_H_

#include <cstddef>
#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/cluster.pb.h"

namespace deepinfer {

class ResultOutbox {
 public:
  void Add(std::vector<RequestResult> results);
  // Copies of the oldest `max` results (fewer if fewer wait).
  std::vector<RequestResult> Peek(size_t max) const;
  // Removes the oldest `n` (after they were acknowledged).
  void Pop(size_t n);
  // Returns when results wait, `timeout` passed or Interrupt() was called; true if results wait.
  bool WaitForResults(absl::Duration timeout) const;
  // Wakes the WaitForResults calls, and makes later ones return at once (the sender stops).
  void Interrupt();
  size_t size() const;
  // Results acknowledged so far.
  size_t delivered() const;

 private:
  mutable absl::Mutex mu_;
  std::deque<RequestResult> pending_ ABSL_GUARDED_BY(mu_);
  size_t delivered_ ABSL_GUARDED_BY(mu_) = 0;
  bool interrupted_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_RESULT_OUTBOX_H_
