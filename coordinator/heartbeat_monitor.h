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

  // `registry` must outlive the monitor. `on_transition` (may be empty) runs after each
  // worker is marked LOST, on the thread that made the check. The first check runs one
  // `check_interval` after construction.
  HeartbeatMonitor(WorkerRegistry* registry, absl::Duration check_interval,
                   TransitionCallback on_transition = {});
  ~HeartbeatMonitor();  // Stops and joins the thread.

  HeartbeatMonitor(const HeartbeatMonitor&) = delete;
  HeartbeatMonitor& operator=(const HeartbeatMonitor&) = delete;

  // One check, as the monitor thread makes it every interval: expires the workers past their
  // deadline, logs and reports each transition, and returns them. Checks never overlap (a call
  // waits for the thread's check in progress), so `on_transition` runs once per transition.
  // Lets tests step the monitor one check at a time.
  std::vector<WorkerTransition> CheckNow();

 private:
  void Run();

  WorkerRegistry* const registry_;
  const absl::Duration check_interval_;
  const TransitionCallback on_transition_;

  absl::Mutex check_mu_;  // held for one whole check

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_HEARTBEAT_MONITOR_H_
