// ExpertBalancer: the coordinator's EPLB state (docs/eplb.md). It keeps the sliding window of
// the load statistics workers send in heartbeats, the placement handed out last and its epoch,
// and which epoch each worker reports running; it plans new placements from the window for a
// group of a given size. It makes no RPCs: the JobManager's scheduler thread hands placements
// to workers (ConfigureGroup for a new group, SetExpertPlacement for a live change).
//
// Epochs: 0 means "no placement" (experts contiguous); every placement handed out gets the
// next epoch (a --expert-placement given at start is epoch 1).
#ifndef DEEPINFER_COORDINATOR_EXPERT_BALANCER_H_
#define DEEPINFER_COORDINATOR_EXPERT_BALANCER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/eplb/expert_placement.h"
#include "coordinator/eplb/expert_load_window.h"
#include "coordinator/eplb/placement_planner.h"
#include "proto/admin.pb.h"
#include "proto/cluster.pb.h"

namespace deepinfer {

struct ExpertBalancerConfig {
  int num_logical = 0;  // routed experts per MoE layer
  int num_groups = 1;   // the model's expert groups (n_group)
  int num_redundant = 32;
  int64_t window_steps = 1000;
  // Automatic rebalance every this many steps (0: off), skipped while the current layout's
  // max/mean tokens per GPU is at most balance_threshold.
  int64_t interval_steps = 0;
  double balance_threshold = 1.05;
  PlacementPolicy auto_policy = PlacementPolicy::kAuto;
  // --expert-placement: handed to every group it fits, as epoch 1.
  std::shared_ptr<const ExpertPlacement> initial;
};

class ExpertBalancer {
 public:
  explicit ExpertBalancer(ExpertBalancerConfig config);

  // Takes a heartbeat's expert load reports (malformed ones are logged and dropped) and the
  // worker's running placement epoch.
  void OnHeartbeat(const std::string& worker_id, const HeartbeatRequest& heartbeat);

  // The placement a new group of `world_size` ranks starts with: the current one if its slots
  // divide over the ranks, else none (logged).
  ExpertPlacementSpec SpecForGroup(int world_size) const;

  struct Plan {
    std::shared_ptr<const ExpertPlacement> placement;
    std::string report;  // FormatBalanceComparison of before (current layout) and after
    double imbalance_before = 1;
    double imbalance_after = 1;
  };
  // Plans from the window for `world_size` ranks on `num_nodes` nodes. FAILED_PRECONDITION
  // without statistics; INVALID_ARGUMENT for sizes the planner refuses.
  absl::StatusOr<Plan> PlanFor(PlacementPolicy policy, int world_size, int num_nodes) const;

  // Records `placement` as handed out; returns its epoch.
  uint64_t Commit(std::shared_ptr<const ExpertPlacement> placement);
  // Whether an automatic rebalance is due (interval_steps passed since the last one or the
  // last check); MarkChecked restarts the interval without a new placement.
  bool AutoRebalanceDue() const;
  void MarkChecked();

  // Fills everything of GetExpertLoad but num_gpus; active_epoch over `members`.
  void FillStatus(const std::vector<std::string>& members, GetExpertLoadResponse* out) const;

  const ExpertBalancerConfig& config() const { return config_; }

 private:
  const ExpertBalancerConfig config_;
  ExpertLoadWindow window_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const ExpertPlacement> current_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // Steps rank 0 reported in all (the group's step count), and at the last (auto) rebalance.
  int64_t total_steps_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t checked_at_steps_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, uint64_t> worker_epoch_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_EXPERT_BALANCER_H_
