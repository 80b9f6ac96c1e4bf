#include "tools/admin/plan_command.h"

#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/eplb/placement_json.h"
#include "coordinator/eplb/balance_report.h"
#include "coordinator/eplb/expert_loads.h"
#include "coordinator/eplb/placement_planner.h"
#include "coordinator/eplb/redundant_experts.h"

namespace deepinfer {
namespace {

constexpr char kPrefix[] = "deepinfer-admin plan: ";

bool FitsInt(int64_t value) {
  return value >= std::numeric_limits<int>::min() && value <= std::numeric_limits<int>::max();
}

}  // namespace

int RunPlanCommand(const PlanCommandConfig& config, std::ostream& out, std::ostream& err) {
  if (config.num_replicas.has_value() && config.num_redundant_experts.has_value()) {
    err << kPrefix << "give --num-replicas (all physical experts) or --num-redundant-experts, "
        << "not both\n";
    return 2;
  }
  for (int64_t value : {config.num_replicas.value_or(0), config.num_redundant_experts.value_or(0),
                        config.num_groups, config.num_nodes, config.num_gpus}) {
    if (!FitsInt(value)) {
      err << kPrefix << value << " is out of range\n";
      return 2;
    }
  }
  absl::StatusOr<PlacementPolicy> policy = ParsePlacementPolicy(config.policy);
  if (!policy.ok()) {
    err << kPrefix << policy.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<ExpertLoads> loads = ReadExpertLoadsFile(config.load_file);
  if (!loads.ok()) {
    err << kPrefix << loads.status().message() << "\n";
    return 1;
  }
  const int num_logical = static_cast<int>((*loads)[0].size());

  PlannerConfig planner;
  if (config.num_replicas.has_value()) {
    planner.num_physical = static_cast<int>(*config.num_replicas);
    if (std::getenv(kOverrideNumExtraExpertsEnv) != nullptr) {
      err << kPrefix << "note: " << kOverrideNumExtraExpertsEnv
          << " is ignored because --num-replicas gives the total\n";
    }
  } else {
    absl::StatusOr<int> redundant = ResolveNumRedundantExpertsFromEnv(config.num_redundant_experts);
    if (!redundant.ok()) {
      err << kPrefix << redundant.status().message() << "\n";
      return 2;
    }
    planner.num_physical = num_logical + *redundant;
  }
  planner.num_groups = static_cast<int>(config.num_groups);
  planner.num_nodes = static_cast<int>(config.num_nodes);
  planner.num_gpus = static_cast<int>(config.num_gpus);
  planner.policy = *policy;

  absl::StatusOr<ExpertPlacement> placement = PlanPlacement(*loads, planner);
  if (!placement.ok()) {
    err << kPrefix << placement.status().message() << "\n";
    return 2;
  }

  absl::StatusOr<BalanceReport> before;
  std::string before_name = "experts in order, no replicas";
  if (config.current_placement_file.empty()) {
    before = BalanceReport::ForContiguous(*loads, planner.num_gpus);
  } else {
    absl::StatusOr<ExpertPlacement> current = ReadPlacementFile(config.current_placement_file);
    if (!current.ok()) {
      err << kPrefix << current.status().message() << "\n";
      return 1;
    }
    before = BalanceReport::ForPlacement(*current, *loads, planner.num_gpus);
    if (!before.ok()) {
      err << kPrefix << config.current_placement_file << ": " << before.status().message() << "\n";
      return 2;
    }
    before_name = config.current_placement_file;
  }
  absl::StatusOr<BalanceReport> after =
      BalanceReport::ForPlacement(*placement, *loads, planner.num_gpus);
  // Both follow from inputs PlanPlacement has accepted.
  if (!before.ok() || !after.ok()) {
    err << kPrefix << (before.ok() ? after.status() : before.status()).message() << "\n";
    return 2;
  }

  out << PlacementToJson(*placement);
  const PlacementPolicy used = EffectivePolicy(planner);
  err << "policy " << PlacementPolicyName(used)
      << (planner.policy == PlacementPolicy::kAuto ? " (auto)" : "") << "; "
      << placement->num_layers() << " layers, " << num_logical << " logical experts in "
      << planner.num_groups << " groups, " << planner.num_physical << " physical ("
      << planner.num_physical - num_logical << " redundant), " << planner.num_nodes << " nodes, "
      << planner.num_gpus << " GPUs (" << planner.num_physical / planner.num_gpus
      << " experts per GPU)\n"
      << "tokens per GPU, before (" << before_name << ") and after:\n"
      << FormatBalanceComparison(*before, *after);
  return 0;
}

}  // namespace deepinfer
