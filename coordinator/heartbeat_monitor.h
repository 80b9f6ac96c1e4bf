// HeartbeatMonitor: the coordinator's one staleness thread. Every check interval it
// asks the WorkerRegistry to expire workers that missed their heartbeat deadline and
// logs each transition to LOST.
#ifndef DEEPINFER_COORDINATOR_HEARTBEAT_MONITOR_H_
#define DEEPINFER_COORDINATOR_HEARTBEAT_MONITOR_H_

#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/worker_registry.h"

namespace deepinfer {

class HeartbeatMonitor {
 public:
  using TransitionCallback = std::function<void(const WorkerTransition&)>;

  // `registry` must outlive the monitor. `on_transition` (may be empty) runs on the
  // monitor thread after each worker is marked LOST.
  HeartbeatMonitor(WorkerRegistry* registry, absl::Duration check_interval,
                   TransitionCallback on_transition = {});
  ~HeartbeatMonitor();  // Stops and joins the thread.

  HeartbeatMonitor(const HeartbeatMonitor&) = delete;
  HeartbeatMonitor& operator=(const HeartbeatMonitor&) = delete;

 private:
  void Run();

  WorkerRegistry* const registry_;
  const absl::Duration check_interval_;
  const TransitionCallback on_transition_;

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_HEARTBEAT_MONITOR_H_
