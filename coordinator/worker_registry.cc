#include "coordinator/worker_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace deepinfer {

const char* WorkerStateName(WorkerState state) {
  switch (state) {
    case REGISTERED:
      return "REGISTERED";
    case READY:
      return "READY";
    case DRAINING:
      return "DRAINING";
    case LOST:
      return "LOST";
    case LEFT:
      return "LEFT";
    default:
      return "UNSPECIFIED";
  }
}

WorkerRegistry::WorkerRegistry(const Clock* clock, uint64_t coordinator_incarnation,
                               absl::Duration heartbeat_timeout)
    : clock_(clock),
      coordinator_incarnation_(coordinator_incarnation),
      heartbeat_timeout_(heartbeat_timeout) {
  CHECK(clock_ != nullptr);
  CHECK_NE(coordinator_incarnation_, 0u);
  CHECK_GT(heartbeat_timeout_, absl::ZeroDuration());
}

absl::Status WorkerRegistry::Register(const WorkerRegistration& registration) {
  if (registration.worker_id.empty()) {
    return absl::InvalidArgumentError("Register: worker_id is empty");
  }
  if (registration.listen_address.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Register from '", registration.worker_id, "': listen_address is empty"));
  }
  if (registration.worker_incarnation == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Register from '", registration.worker_id, "': incarnation is 0"));
  }
  if (registration.devices.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Register from '", registration.worker_id, "': no devices"));
  }
  if (registration.num_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Register from '", registration.worker_id, "': no ranks"));
  }
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = workers_.try_emplace(registration.worker_id);
  Entry& entry = it->second;
  if (!inserted && entry.registration.worker_incarnation != registration.worker_incarnation) {
    ++entry.restarts;
    LOG(INFO) << "worker " << registration.worker_id << " restarted (incarnation "
              << entry.registration.worker_incarnation << " -> "
              << registration.worker_incarnation << ")";
  }
  entry.registration = registration;
  entry.state = REGISTERED;
  entry.report = WorkerReport();
  entry.last_seen = clock_->Now();
  return absl::OkStatus();
}

absl::Status WorkerRegistry::CheckSenderLocked(const std::string& worker_id,
                                               uint64_t worker_incarnation,
                                               uint64_t coordinator_incarnation) const {
  if (coordinator_incarnation != coordinator_incarnation_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "call from '", worker_id, "' names coordinator incarnation ", coordinator_incarnation,
        ", this coordinator is ", coordinator_incarnation_, ": register again"));
  }
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown worker '", worker_id, "': register first"));
  }
  const Entry& entry = it->second;
  if (entry.registration.worker_incarnation != worker_incarnation) {
    return absl::FailedPreconditionError(
        absl::StrCat("call from '", worker_id, "' incarnation ", worker_incarnation,
                     ", registered incarnation is ", entry.registration.worker_incarnation));
  }
  if (entry.state == LOST) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker '", worker_id, "' was declared LOST: register again"));
  }
  if (entry.state == LEFT) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker '", worker_id, "' deregistered: register again"));
  }
  return absl::OkStatus();
}

absl::Status WorkerRegistry::CheckSender(const std::string& worker_id,
                                         uint64_t worker_incarnation,
                                         uint64_t coordinator_incarnation) const {
  absl::MutexLock lock(&mu_);
  return CheckSenderLocked(worker_id, worker_incarnation, coordinator_incarnation);
}

absl::StatusOr<WorkerState> WorkerRegistry::Heartbeat(const std::string& worker_id,
                                                      uint64_t worker_incarnation,
                                                      uint64_t coordinator_incarnation,
                                                      WorkerReport report) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckSenderLocked(worker_id, worker_incarnation, coordinator_incarnation);
      !s.ok()) {
    return s;
  }
  Entry& entry = workers_.find(worker_id)->second;
  entry.last_seen = clock_->Now();
  entry.report = std::move(report);
  if (entry.state == REGISTERED) entry.state = READY;
  return entry.state;
}

absl::StatusOr<WorkerState> WorkerRegistry::Drain(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("no worker '", worker_id, "'"));
  }
  if (it->second.state == LOST || it->second.state == LEFT) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker '", worker_id, "' is ", WorkerStateName(it->second.state)));
  }
  it->second.state = DRAINING;
  return it->second.state;
}

absl::StatusOr<WorkerTransition> WorkerRegistry::Deregister(const std::string& worker_id,
                                                            uint64_t worker_incarnation,
                                                            uint64_t coordinator_incarnation) {
  absl::MutexLock lock(&mu_);
  if (coordinator_incarnation != coordinator_incarnation_) {
    return absl::FailedPreconditionError(
        absl::StrCat("Deregister from '", worker_id, "' names coordinator incarnation ",
                     coordinator_incarnation, ", this coordinator is ", coordinator_incarnation_));
  }
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("Deregister: unknown worker '", worker_id, "'"));
  }
  Entry& entry = it->second;
  if (entry.registration.worker_incarnation != worker_incarnation) {
    return absl::FailedPreconditionError(
        absl::StrCat("Deregister from '", worker_id, "' incarnation ", worker_incarnation,
                     ", registered incarnation is ", entry.registration.worker_incarnation));
  }
  WorkerTransition transition{worker_id, entry.state, LEFT};
  entry.state = LEFT;
  entry.last_seen = clock_->Now();
  return transition;
}

std::vector<WorkerTransition> WorkerRegistry::ExpireStale() {
  std::vector<WorkerTransition> transitions;
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  for (auto& [id, entry] : workers_) {
    if (entry.state != LOST && entry.state != LEFT && now - entry.last_seen > heartbeat_timeout_) {
      transitions.push_back({id, entry.state, LOST});
      entry.state = LOST;
    }
  }
  return transitions;
}

std::vector<WorkerSnapshot> WorkerRegistry::Snapshot() const {
  std::vector<WorkerSnapshot> out;
  {
    absl::MutexLock lock(&mu_);
    out.reserve(workers_.size());
    for (const auto& [id, entry] : workers_) {
      out.push_back({entry.registration, entry.state, entry.last_seen, entry.restarts, entry.report});
    }
  }
  std::sort(out.begin(), out.end(), [](const WorkerSnapshot& a, const WorkerSnapshot& b) {
    return a.registration.worker_id < b.registration.worker_id;
  });
  return out;
}

}  // namespace deepinfer
