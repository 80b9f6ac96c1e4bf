#include "coordinator/expert_balancer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/eplb/placement_proto.h"
#include "coordinator/eplb/balance_report.h"
#include "glog/logging.h"

namespace deepinfer {

ExpertBalancer::ExpertBalancer(ExpertBalancerConfig config)
    : config_(std::move(config)), window_(config_.window_steps) {
  if (config_.initial != nullptr) {
    current_ = config_.initial;
    epoch_ = 1;
  }
}

void ExpertBalancer::OnHeartbeat(const std::string& worker_id, const HeartbeatRequest& hb) {
  int64_t rank0_steps = 0;
  for (const ExpertLoadReport& r : hb.expert_loads()) {
    std::vector<int64_t> counts(r.counts().begin(), r.counts().end());
    absl::Status st = window_.Add(r.rank(), r.group_generation(), r.num_steps(), r.num_layers(),
                                  r.num_experts(), counts);
    if (!st.ok()) {
      LOG_EVERY_N(WARNING, 100) << "worker " << worker_id << ": " << st;
      continue;
    }
    if (r.rank() == 0) rank0_steps += r.num_steps();
  }
  absl::MutexLock lock(&mu_);
  total_steps_ += rank0_steps;
  worker_epoch_[worker_id] = hb.placement_epoch();
}

ExpertPlacementSpec ExpertBalancer::SpecForGroup(int world_size) const {
  absl::MutexLock lock(&mu_);
  if (current_ == nullptr || world_size <= 1) return ExpertPlacementSpec();
  if (absl::Status st = current_->CheckGpuCount(world_size); !st.ok()) {
    LOG(WARNING) << "expert placement epoch " << epoch_ << " left out of a group of " << world_size
                 << " ranks: " << st.message();
    return ExpertPlacementSpec();
  }
  return PlacementToProto(*current_, epoch_);
}

absl::StatusOr<ExpertBalancer::Plan> ExpertBalancer::PlanFor(PlacementPolicy policy, int world_size,
                                                             int num_nodes) const {
  ExpertLoadWindow::Snapshot s = window_.Get();
  if (s.num_steps == 0 || s.loads.empty()) {
    return absl::FailedPreconditionError(
        "no expert load statistics yet: the group has not stepped since it formed");
  }
  if (absl::Status st = ValidateExpertLoads(s.loads); !st.ok()) return st;
  PlannerConfig pc;
  pc.num_physical = config_.num_logical + config_.num_redundant;
  pc.num_groups = config_.num_groups;
  pc.num_nodes = num_nodes;
  pc.num_gpus = world_size;
  pc.policy = policy;
  // Hierarchical needs the groups to divide over the nodes; auto falls back to global, and
  // nodes that do not divide the ranks are planned as one node.
  if (pc.num_nodes < 1 || world_size % pc.num_nodes != 0) pc.num_nodes = 1;
  if (absl::Status st = ValidatePlannerConfig(config_.num_logical, pc); !st.ok()) return st;
  absl::StatusOr<ExpertPlacement> placement = PlanPlacement(s.loads, pc);
  if (!placement.ok()) return placement.status();
  std::shared_ptr<const ExpertPlacement> current;
  {
    absl::MutexLock lock(&mu_);
    current = current_;
  }
  absl::StatusOr<BalanceReport> before =
      current != nullptr && current->CheckGpuCount(world_size).ok() &&
              current->num_layers() == static_cast<int>(s.loads.size())
          ? BalanceReport::ForPlacement(*current, s.loads, world_size)
          : BalanceReport::ForContiguous(s.loads, world_size);
  if (!before.ok()) return before.status();
  absl::StatusOr<BalanceReport> after =
      BalanceReport::ForPlacement(*placement, s.loads, world_size);
  if (!after.ok()) return after.status();
  Plan plan;
  plan.report = absl::StrCat(
      "policy ", PlacementPolicyName(EffectivePolicy(pc)), "; window of ", s.num_steps, " steps; ",
      s.loads.size(), " MoE layers, ", config_.num_logical, " logical experts, ", pc.num_physical,
      " physical, ", world_size, " GPUs on ", pc.num_nodes, " node(s)\n",
      "tokens per GPU, before (", current != nullptr ? "current placement" : "experts in order",
      ") and after:\n", FormatBalanceComparison(*before, *after));
  plan.imbalance_before = before->imbalance();
  plan.imbalance_after = after->imbalance();
  plan.placement = std::make_shared<const ExpertPlacement>(std::move(*placement));
  return plan;
}

uint64_t ExpertBalancer::Commit(std::shared_ptr<const ExpertPlacement> placement) {
  absl::MutexLock lock(&mu_);
  current_ = std::move(placement);
  checked_at_steps_ = total_steps_;
  return ++epoch_;
}

bool ExpertBalancer::AutoRebalanceDue() const {
  if (config_.interval_steps <= 0) return false;
  absl::MutexLock lock(&mu_);
  return total_steps_ - checked_at_steps_ >= config_.interval_steps;
}

void ExpertBalancer::MarkChecked() {
  absl::MutexLock lock(&mu_);
  checked_at_steps_ = total_steps_;
}

void ExpertBalancer::FillStatus(const std::vector<std::string>& members,
                                GetExpertLoadResponse* out) const {
  ExpertLoadWindow::Snapshot s = window_.Get();
  out->set_window_steps(window_.window_steps());
  out->set_num_steps(s.num_steps);
  out->set_num_layers(s.num_layers);
  out->set_num_experts(s.num_experts);
  for (const std::vector<double>& layer : s.loads) {
    for (double v : layer) out->add_loads(v);
  }
  absl::MutexLock lock(&mu_);
  if (current_ != nullptr) *out->mutable_placement() = PlacementToProto(*current_, epoch_);
  uint64_t active = members.empty() ? 0 : UINT64_MAX;
  for (const std::string& m : members) {
    auto it = worker_epoch_.find(m);
    active = std::min<uint64_t>(active, it == worker_epoch_.end() ? 0 : it->second);
  }
  out->set_active_epoch(active);
}

}  // namespace deepinfer
