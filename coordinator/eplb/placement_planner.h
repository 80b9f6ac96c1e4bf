// The EPLB planner: from per-layer expert loads, decides how many replicas each logical
// expert gets and which GPU hosts each replica, so that the busiest GPU of every MoE layer
// carries as little as possible above the mean. The algorithm, in our words, with its
// policies and their limits: docs/eplb.md.
#ifndef DEEPINFER_COORDINATOR_EPLB_PLACEMENT_PLANNER_H_
#define DEEPINFER_COORDINATOR_EPLB_PLACEMENT_PLANNER_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/eplb/expert_placement.h"
#include "coordinator/eplb/expert_loads.h"

namespace deepinfer {

enum class PlacementPolicy {
  // Hierarchical when the expert groups divide evenly over the nodes, global otherwise.
  kAuto,
  // Expert groups are packed onto nodes by group load, then replicated and packed onto GPUs
  // within each node: a group's replicas never leave its node, which keeps the group-limited
  // routing of DeepSeek-V3 on the fast intra-node links.
  kHierarchical,
  // The whole cluster as one node and one group: replicas may land anywhere.
  kGlobal,
};

// Accepts "auto", "hierarchical", "global".
absl::StatusOr<PlacementPolicy> ParsePlacementPolicy(absl::string_view name);
const char* PlacementPolicyName(PlacementPolicy policy);

struct PlannerConfig {
  // Physical expert slots per layer: logical experts plus redundant ones.
  int num_physical = 0;
  // Expert groups of the model (n_group in a DeepSeek-V3 config.json).
  int num_groups = 1;
  int num_nodes = 1;
  // GPUs (ranks) in the expert-parallel group, over all nodes.
  int num_gpus = 1;
  PlacementPolicy policy = PlacementPolicy::kAuto;
};

// INVALID_ARGUMENT, saying which numbers would work, unless: num_logical, num_groups,
// num_nodes and num_gpus are positive; num_groups divides num_logical; num_nodes divides
// num_gpus; num_physical >= num_logical and num_gpus divides num_physical; and, for the
// hierarchical policy, num_nodes divides num_groups.
absl::Status ValidatePlannerConfig(int num_logical, const PlannerConfig& config);

// The policy PlanPlacement uses: config.policy, with kAuto resolved.
PlacementPolicy EffectivePolicy(const PlannerConfig& config);

// Plans every layer of `loads` independently. Deterministic: equal inputs give equal
// placements (ties go to the lower expert, pack or GPU index).
absl::StatusOr<ExpertPlacement> PlanPlacement(const ExpertLoads& loads,
                                              const PlannerConfig& config);

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_EPLB_PLACEMENT_PLANNER_H_
