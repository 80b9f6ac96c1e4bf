#include "coordinator/heartbeat_monitor.h"

#include "glog/logging.h"

namespace deepinfer {

HeartbeatMonitor::HeartbeatMonitor(WorkerRegistry* registry, absl::Duration check_interval,
                                   TransitionCallback on_transition)
    : registry_(registry),
      check_interval_(check_interval),
      on_transition_(std::move(on_transition)),
      thread_([this] { Run(); }) {}

HeartbeatMonitor::~HeartbeatMonitor() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

std::vector<WorkerTransition> HeartbeatMonitor::CheckNow() {
  absl::MutexLock lock(&check_mu_);
  std::vector<WorkerTransition> transitions = registry_->ExpireStale();
  for (const WorkerTransition& t : transitions) {
    LOG(WARNING) << "worker " << t.worker_id << " missed its heartbeat deadline ("
                 << registry_->heartbeat_timeout() << "): " << WorkerStateName(t.from) << " -> "
                 << WorkerStateName(t.to);
    if (on_transition_) on_transition_(t);
  }
  return transitions;
}

void HeartbeatMonitor::Run() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    // Wakes early only to stop.
    mu_.AwaitWithTimeout(absl::Condition(&stop_), check_interval_);
    if (stop_) break;
    mu_.Unlock();
    CheckNow();
    mu_.Lock();
  }
}

}  // namespace deepinfer
