// CoordinatorLink: the worker's side of ClusterService. One thread registers with the
// coordinator, heartbeats at the interval the coordinator asks for, and registers
// again whenever the coordinator says it does not know this worker or names another
// incarnation (the coordinator restarted, or declared this worker LOST). Heartbeats carry
// what `fill_heartbeat` adds (rank loads, group status). A second thread delivers finished
// requests from a ResultOutbox with ReportResults, in batches, retrying until acknowledged;
// after NOT_FOUND / FAILED_PRECONDITION it waits for the re-registration and resends.
// Leave() ends both when the worker stops: the last results go out, then Deregister.
#ifndef DEEPINFER_WORKER_COORDINATOR_LINK_H_
#define DEEPINFER_WORKER_COORDINATOR_LINK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/cluster.grpc.pb.h"
#include "worker/result_outbox.h"

namespace deepinfer {

struct CoordinatorLinkConfig {
  std::string coordinator_address;
  std::string auth_token;
  // What this worker registers as.
  std::string worker_id;
  uint64_t worker_incarnation = 0;
  std::string node_name;
  std::string listen_address;
  std::vector<Device> devices;
  // Engine ranks this worker runs (RegisterRequest.num_ranks).
  int32_t num_ranks = 0;
  // Adds the engine's part to each heartbeat (rank_loads, group_*); may be unset.
  std::function<void(HeartbeatRequest*)> fill_heartbeat;
  // Results to deliver; null: no result sender thread.
  ResultOutbox* outbox = nullptr;
  size_t results_per_call = 32;
  // Wait between failed registration attempts.
  absl::Duration retry_interval = absl::Milliseconds(500);
  // Deadline of each RPC.
  absl::Duration rpc_timeout = absl::Seconds(2);
  // Leave() waits up to this long for the outbox to empty before it deregisters.
  absl::Duration leave_flush_timeout = absl::Seconds(2);
};

class CoordinatorLink {
 public:
  struct State {
    bool registered = false;
    uint64_t coordinator_incarnation = 0;
    int registrations = 0;  // successful Register calls so far
    std::string last_error;
    int64_t results_delivered = 0;  // acknowledged by ReportResults
  };

  // Starts the thread at once.
  explicit CoordinatorLink(CoordinatorLinkConfig config);
  ~CoordinatorLink();  // Stops and joins the thread.

  CoordinatorLink(const CoordinatorLink&) = delete;
  CoordinatorLink& operator=(const CoordinatorLink&) = delete;

  State state() const;

  // The worker is stopping: delivers the results waiting in the outbox (for up to
  // leave_flush_timeout), stops heartbeating and delivering, then calls Deregister so that
  // the coordinator re-queues this worker's requests at once instead of after the heartbeat
  // timeout (results produced after this point are not delivered; those requests run again
  // elsewhere). Afterwards the link is unregistered and does nothing more. Returns the
  // Deregister outcome (UNAVAILABLE and the like when the coordinator is gone, OK when this
  // worker was not registered).
  absl::Status Leave(const std::string& reason);

 private:
  // Ends both threads. Idempotent.
  void Stop();
  void Run();
  void SendResults();    // the result sender thread
  bool RegisterOnce();   // true when registered
  void HeartbeatOnce();  // may clear registered_
  // Sleeps up to `d`; false when asked to stop.
  bool SleepUnlessStopped(absl::Duration d);
  void LogFailure(const std::string& what, const grpc::Status& status);

  const CoordinatorLinkConfig config_;
  std::unique_ptr<ClusterService::Stub> stub_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  State state_ ABSL_GUARDED_BY(mu_);
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  int consecutive_failures_ = 0;  // only touched by the link thread
  std::thread thread_;
  std::thread results_thread_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_COORDINATOR_LINK_H_
