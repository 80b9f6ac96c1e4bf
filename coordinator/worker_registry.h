// WorkerRegistry: the coordinator's view of every worker daemon, and the state
// machine each one moves through. No gRPC in here: the service glue
// (cluster_service.h, admin_service.h) translates calls into these methods.
//
// Worker states:
//
//                 Register                  first Heartbeat
//     (unknown) ───────────▶ REGISTERED ─────────────────────▶ READY
//                              ▲  │ │                           │  │
//                              │  │ └──── Drain ─────┐   Drain  │  │
//              Register        │  │                  ▼          ▼  │
//              (any state,     │  │               DRAINING ◀─────┘  │
//              new or same     │  │                  │              │
//              incarnation)    │  │ deadline         │ deadline     │ deadline
//                              │  ▼                  ▼              │
//                              ├─ LOST ◀─────────────┴──────────────┘
//                              │
//                              └─ LEFT ◀── Deregister (from any state but unknown)
//
// * A Register under a known worker id with a different incarnation means the
//   worker process restarted: its previous instance is gone (counted in
//   `restarts`), and the new one starts again at REGISTERED.
// * A Heartbeat is accepted only from the registered incarnation, addressed to this
//   coordinator's incarnation, and not from a LOST or LEFT worker; otherwise the worker
//   is told to register again.
// * A drained worker stays DRAINING across heartbeats (a drain survives until the
//   worker re-registers).
// * Deregister is a worker stopping cleanly (SIGTERM): LEFT at once, where LOST would
//   take the heartbeat timeout. Both are gone for good until the worker registers again.
// * Deadlines are checked by one thread (HeartbeatMonitor) calling ExpireStale().
#ifndef DEEPINFER_COORDINATOR_WORKER_REGISTRY_H_
#define DEEPINFER_COORDINATOR_WORKER_REGISTRY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/clock.h"
#include "proto/common.pb.h"

namespace deepinfer {

// What a worker says about itself when it registers.
struct WorkerRegistration {
  std::string worker_id;
  uint64_t worker_incarnation = 0;
  std::string node_name;
  std::string listen_address;
  std::vector<Device> devices;
  int num_ranks = 1;
};

// What a worker reports with each heartbeat besides being alive.
struct WorkerReport {
  std::vector<RankLoad> rank_loads;
  uint64_t group_generation = 0;
  GroupStatus group_status = GROUP_NONE;
  std::string group_error;
};

// A copy of one worker's entry, for status reports.
struct WorkerSnapshot {
  WorkerRegistration registration;
  WorkerState state = WORKER_STATE_UNSPECIFIED;
  absl::Time last_seen;
  int restarts = 0;
  WorkerReport report;  // from the latest heartbeat
};

// A state change, returned to callers that log or react to it.
struct WorkerTransition {
  std::string worker_id;
  WorkerState from;
  WorkerState to;
};

const char* WorkerStateName(WorkerState state);

class WorkerRegistry {
 public:
  // `clock` must outlive the registry. Workers silent for longer than
  // `heartbeat_timeout` become LOST at the next ExpireStale().
  WorkerRegistry(const Clock* clock, uint64_t coordinator_incarnation,
                 absl::Duration heartbeat_timeout);

  WorkerRegistry(const WorkerRegistry&) = delete;
  WorkerRegistry& operator=(const WorkerRegistry&) = delete;

  // Adds or replaces the worker; it becomes REGISTERED. INVALID_ARGUMENT for an
  // empty id or address, incarnation 0, or no devices.
  absl::Status Register(const WorkerRegistration& registration);

  // Records a heartbeat and returns the worker's state afterwards. NOT_FOUND for an
  // unknown id; FAILED_PRECONDITION when an incarnation does not match or the
  // worker is LOST (the message says which); both mean "register again".
  absl::StatusOr<WorkerState> Heartbeat(const std::string& worker_id,
                                        uint64_t worker_incarnation,
                                        uint64_t coordinator_incarnation,
                                        WorkerReport report = {});

  // Checks that a call from a worker comes from its registered incarnation and is
  // addressed to this coordinator (same errors as Heartbeat), without touching state.
  absl::Status CheckSender(const std::string& worker_id, uint64_t worker_incarnation,
                           uint64_t coordinator_incarnation) const;

  // Moves a REGISTERED or READY worker to DRAINING. NOT_FOUND for an unknown id,
  // FAILED_PRECONDITION for a LOST or LEFT one.
  absl::StatusOr<WorkerState> Drain(const std::string& worker_id);

  // Moves the worker to LEFT (it is stopping) and returns the transition (from == to ==
  // LEFT when it had left already). NOT_FOUND for an unknown id; FAILED_PRECONDITION when
  // an incarnation does not match (nothing changes: a newer instance registered under the
  // id, or the coordinator restarted).
  absl::StatusOr<WorkerTransition> Deregister(const std::string& worker_id,
                                              uint64_t worker_incarnation,
                                              uint64_t coordinator_incarnation);

  // Marks every worker (but LEFT ones) whose last contact is older than the heartbeat
  // timeout as LOST; returns the transitions made.
  std::vector<WorkerTransition> ExpireStale();

  // All workers, sorted by id.
  std::vector<WorkerSnapshot> Snapshot() const;

  uint64_t coordinator_incarnation() const { return coordinator_incarnation_; }
  absl::Duration heartbeat_timeout() const { return heartbeat_timeout_; }

 private:
  struct Entry {
    WorkerRegistration registration;
    WorkerState state = REGISTERED;
    absl::Time last_seen;
    int restarts = 0;
    WorkerReport report;
  };

  absl::Status CheckSenderLocked(const std::string& worker_id, uint64_t worker_incarnation,
                                 uint64_t coordinator_incarnation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock* const clock_;
  const uint64_t coordinator_incarnation_;
  const absl::Duration heartbeat_timeout_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_WORKER_REGISTRY_H_
