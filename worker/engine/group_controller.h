// GroupController: the worker's side of group forming, behind the WorkerService handlers.
// It owns the worker's current RankGroup, the rendezvous socket PrepareGroup bound, and one
// control thread that tears old groups down and starts new ones, so that no RPC handler ever
// waits for weights to load or threads to join.
//
// Per worker:  (no group) --ConfigureGroup(g)--> group g FORMING --> SERVING | FAILED
//              any --ConfigureGroup(g' > g)--> old group stopped (its requests dropped),
//                                             group g' FORMING ...
#ifndef DEEPINFER_WORKER_ENGINE_GROUP_CONTROLLER_H_
#define DEEPINFER_WORKER_ENGINE_GROUP_CONTROLLER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/cluster.pb.h"
#include "proto/worker.pb.h"
#include "worker/comm/tcp_communicator.h"
#include "worker/engine/rank_group.h"

namespace deepinfer {

struct GroupControllerOptions {
  RankGroupOptions group;
  int num_ranks = 1;
  // Where PrepareGroup binds the rendezvous socket, and the host it reports in the address
  // (empty: bind_host; needed when bind_host is a wildcard).
  std::string bind_host = "127.0.0.1";
  std::string advertise_host;
  // EPLB placement (--expert-placement) for groups whose ConfigureGroup carries none.
  std::shared_ptr<const ExpertPlacement> placement;
};

class GroupController {
 public:
  GroupController(GroupControllerOptions options, ResultSink sink);
  ~GroupController();  // stops every group

  GroupController(const GroupController&) = delete;
  GroupController& operator=(const GroupController&) = delete;

  // Binds rank 0's rendezvous socket on a free port for group `generation` and returns its
  // "host:port"; it is kept for the ConfigureGroup of that generation (a later Prepare
  // replaces it).
  absl::StatusOr<std::string> Prepare(uint64_t generation);

  // Replaces the group. OK at once (forming shows in heartbeats); OK and nothing changes for
  // the generation already configured (a retried call); FAILED_PRECONDITION for an older
  // generation; INVALID_ARGUMENT for a layout this worker cannot run.
  absl::Status Configure(const ConfigureGroupRequest& request);

  // FAILED_PRECONDITION unless `generation` is the current group's and it has not failed
  // (requests are accepted while it forms); INVALID_ARGUMENT for a rank not on this worker.
  absl::Status Submit(uint64_t generation, std::vector<WorkItem> items);
  void Cancel(const std::vector<std::string>& request_ids);

  // Live EPLB placement change of the current group (RankGroup::SetPlacement).
  // FAILED_PRECONDITION unless `generation` is the current group's and it has not failed;
  // INVALID_ARGUMENT for a placement that is malformed or does not fit.
  absl::Status SetPlacement(const SetExpertPlacementRequest& request);

  // group_generation, group_status, group_error, rank_loads, request_progress,
  // placement_epoch, and the expert load statistics gathered since the previous call (taken:
  // each is sent once).
  void FillHeartbeat(HeartbeatRequest* request) const;

 private:
  void ControlLoop();

  const GroupControllerOptions options_;
  const ResultSink sink_;

  mutable absl::Mutex mu_;
  std::unique_ptr<RankGroup> current_ ABSL_GUARDED_BY(mu_);
  // Replaced groups the control thread still has to stop and free.
  std::vector<std::unique_ptr<RankGroup>> retired_ ABSL_GUARDED_BY(mu_);
  bool start_pending_ ABSL_GUARDED_BY(mu_) = false;  // current_ not started yet
  uint64_t prepared_generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<comm::TcpCommunicator::RootListener> prepared_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread control_thread_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_ENGINE_GROUP_CONTROLLER_H_
