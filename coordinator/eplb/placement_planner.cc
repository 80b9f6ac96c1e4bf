#include "coordinator/eplb/placement_planner.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/eplb/redundant_experts.h"
#include "glog/logging.h"

namespace deepinfer {
namespace {

std::string Divisors(int n) {
  std::vector<int> divisors;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    divisors.push_back(static_cast<int>(d));
    if (d * d != n) divisors.push_back(static_cast<int>(n / d));
  }
  std::sort(divisors.begin(), divisors.end());
  return absl::StrJoin(divisors, ", ");
}

// Balanced packing: assigns each item to one of `num_packs` packs, every pack getting
// exactly items.size() / num_packs items. Heaviest item first, each into the lightest pack
// that still has room. Returns the pack of each item.
std::vector<int> PackBalanced(const std::vector<double>& weights, int num_packs) {
  const int num_items = static_cast<int>(weights.size());
  CHECK(num_packs > 0 && num_items % num_packs == 0) << num_items << " / " << num_packs;
  const int per_pack = num_items / num_packs;
  std::vector<int> order(num_items);
  std::iota(order.begin(), order.end(), 0);
  // Stable: equal weights keep index order, so the result does not depend on the sort.
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return weights[a] > weights[b]; });
  std::vector<double> pack_weight(num_packs, 0.0);
  std::vector<int> pack_items(num_packs, 0);
  std::vector<int> pack_of(num_items, -1);
  for (int item : order) {
    int best = -1;
    for (int pack = 0; pack < num_packs; ++pack) {
      if (pack_items[pack] == per_pack) continue;
      if (best < 0 || pack_weight[pack] < pack_weight[best]) best = pack;
    }
    CHECK_GE(best, 0);
    pack_of[item] = best;
    pack_weight[best] += weights[item];
    ++pack_items[best];
  }
  return pack_of;
}

// Replication: starting from one replica each, gives the extra slots one at a time, each
// to the expert whose load per replica is highest, which minimises the largest load per
// replica. The last `filler` extra slots instead go to the expert whose load per replica is
// lowest: when a GPU has few slots, splitting a cold expert into small "filler" replicas
// can keep two heavy replicas off the same GPU, which the first rule alone cannot see
// (4 experts 10000/3536/1925/1250 tokens, 6 slots on 3 GPUs: the first rule gives max
// 6666 per GPU, one filler 5625). Returns replica counts.
std::vector<int> Replicate(const std::vector<double>& loads, int num_slots, int filler) {
  const int num_experts = static_cast<int>(loads.size());
  CHECK_GE(num_slots, num_experts);
  CHECK_LE(filler, num_slots - num_experts);
  std::vector<int> count(num_experts, 1);
  for (int extra = num_experts; extra < num_slots; ++extra) {
    const bool hottest = extra < num_slots - filler;
    int best = 0;
    for (int e = 1; e < num_experts; ++e) {
      // Compares a/ca with b/cb without dividing: the counts are positive.
      const double candidate = loads[e] * count[best];
      const double current = loads[best] * count[e];
      if (hottest ? candidate > current : candidate < current) best = e;
    }
    ++count[best];
  }
  return count;
}

// Improves a packing by swapping single items between the busiest pack and another pack
// while that lowers the larger of the two; packs keep their item counts. Greedy packing
// misses such swaps when early heavy items fix a pack's fate. Returns the packs' weights.
std::vector<double> RefineBySwaps(const std::vector<double>& weights, int num_packs,
                                  std::vector<int>& pack_of) {
  std::vector<double> pack_weight(num_packs, 0.0);
  for (size_t i = 0; i < weights.size(); ++i) pack_weight[pack_of[i]] += weights[i];
  // Each accepted swap strictly lowers the busiest pack or the number of packs at that
  // weight; the cap only guards against float noise cycling.
  for (size_t round = 0; round < 4 * weights.size() + 16; ++round) {
    const int top = static_cast<int>(std::max_element(pack_weight.begin(), pack_weight.end()) -
                                     pack_weight.begin());
    const double top_weight = pack_weight[top];
    double best_pair_max = top_weight * (1 - 1e-12);
    int best_i = -1, best_j = -1;
    std::vector<int> in_top;
    for (size_t i = 0; i < weights.size(); ++i) {
      if (pack_of[i] == top) in_top.push_back(static_cast<int>(i));
    }
    for (int i : in_top) {
      for (size_t j = 0; j < weights.size(); ++j) {
        if (pack_of[j] == top || weights[j] >= weights[i]) continue;
        const double delta = weights[i] - weights[j];
        const double pair_max = std::max(top_weight - delta, pack_weight[pack_of[j]] + delta);
        if (pair_max < best_pair_max) {
          best_pair_max = pair_max;
          best_i = i;
          best_j = static_cast<int>(j);
        }
      }
    }
    if (best_i < 0) break;
    const double delta = weights[best_i] - weights[best_j];
    pack_weight[top] -= delta;
    pack_weight[pack_of[best_j]] += delta;
    std::swap(pack_of[best_i], pack_of[best_j]);
  }
  return pack_weight;
}

// Replicas of a node's experts assigned to its GPUs.
struct GpuAssignment {
  std::vector<int> count;           // replicas per expert (index into the node's experts)
  std::vector<int> replica_expert;  // logical id of each replica
  std::vector<int> gpu_of_replica;
  double max_gpu_load = 0;
};

// Packs `count[i]` replicas of each of `experts` onto `num_gpus` GPUs, equal slots each.
GpuAssignment PackReplicas(const std::vector<int>& experts, const std::vector<double>& loads,
                           std::vector<int> count, int num_gpus) {
  GpuAssignment plan;
  std::vector<double> replica_load;
  for (size_t i = 0; i < experts.size(); ++i) {
    for (int r = 0; r < count[i]; ++r) {
      plan.replica_expert.push_back(experts[i]);
      // A replica carries an equal share of its expert's tokens.
      replica_load.push_back(loads[i] / count[i]);
    }
  }
  plan.gpu_of_replica = PackBalanced(replica_load, num_gpus);
  const std::vector<double> gpu_load = RefineBySwaps(replica_load, num_gpus, plan.gpu_of_replica);
  plan.max_gpu_load = *std::max_element(gpu_load.begin(), gpu_load.end());
  plan.count = std::move(count);
  return plan;
}

bool Better(const GpuAssignment& a, const GpuAssignment& b) {
  // Relative margin: float noise must not make plans flip-flop.
  return a.max_gpu_load < b.max_gpu_load * (1 - 1e-12);
}

// A plan this close to the lower bound (relative) is not worth searching further.
constexpr double kCloseEnough = 1e-3;

// Moves single replicas from an expert with several to one of the experts with the most
// load per replica, or the least, while that lowers the busiest GPU. The targets are
// limited to those few experts, and the search to `budget` packings, so that planning
// 256 experts x 60 layers stays fast. Returns the best plan found; `budget` is consumed.
GpuAssignment MoveReplicas(const std::vector<int>& experts, const std::vector<double>& loads,
                           int num_gpus, GpuAssignment best, double lower_bound, int& budget) {
  const int num_experts = static_cast<int>(experts.size());
  constexpr int kHotTargets = 8;
  constexpr int kColdTargets = 2;
  bool improved = true;
  while (improved && budget > 0 && best.max_gpu_load > lower_bound * (1 + kCloseEnough)) {
    improved = false;
    std::vector<int> by_share(num_experts);
    std::iota(by_share.begin(), by_share.end(), 0);
    std::stable_sort(by_share.begin(), by_share.end(), [&](int a, int b) {
      return loads[a] * best.count[b] > loads[b] * best.count[a];
    });
    std::vector<int> targets;
    for (int i = 0; i < num_experts; ++i) {
      if (i < kHotTargets || i >= num_experts - kColdTargets) targets.push_back(by_share[i]);
    }
    for (int from = 0; from < num_experts && !improved && budget > 0; ++from) {
      if (best.count[from] < 2) continue;
      for (int to : targets) {
        if (to == from || budget <= 0) continue;
        std::vector<int> count = best.count;
        --count[from];
        ++count[to];
        --budget;
        GpuAssignment candidate = PackReplicas(experts, loads, std::move(count), num_gpus);
        if (Better(candidate, best)) {
          best = std::move(candidate);
          improved = true;
          break;
        }
      }
    }
  }
  return best;
}

// Replicates and packs one node's experts onto its GPUs, minimising the busiest GPU.
// Candidates: every split of the extra slots between the "hottest" and "filler" rules of
// Replicate, each improved by MoveReplicas; the best wins (ties keep fewer fillers, i.e.
// plain EPLB's replica counts). Stops early once a plan reaches a lower bound on the
// busiest GPU: the mean GPU load, and the largest load per replica that replication
// cannot avoid (one GPU hosts that replica).
GpuAssignment ReplicateAndPack(const std::vector<int>& experts, const std::vector<double>& loads,
                               int num_gpus, int slots_per_gpu) {
  const int num_slots = num_gpus * slots_per_gpu;
  const int num_extra = num_slots - static_cast<int>(experts.size());
  const std::vector<int> eplb_count = Replicate(loads, num_slots, 0);
  double lower_bound = std::accumulate(loads.begin(), loads.end(), 0.0) / num_gpus;
  for (size_t i = 0; i < loads.size(); ++i) {
    lower_bound = std::max(lower_bound, loads[i] / eplb_count[i]);
  }
  // A packing costs about slots x (GPUs + slots per GPU x swaps); the budget keeps a layer
  // of a DeepSeek-V3-sized deployment (288 slots) to about 60 packings (61 layers plan in
  // well under a second) and leaves small cases, where the search matters most, thousands.
  int budget = std::max(32, static_cast<int>(5e6 / (static_cast<double>(num_slots) * num_slots)));
  GpuAssignment best = PackReplicas(experts, loads, eplb_count, num_gpus);
  for (int filler = 0; filler <= num_extra; ++filler) {
    if (best.max_gpu_load <= lower_bound * (1 + kCloseEnough) || budget <= 0) break;
    GpuAssignment start =
        filler == 0 ? best
                    : PackReplicas(experts, loads, Replicate(loads, num_slots, filler), num_gpus);
    --budget;
    GpuAssignment candidate =
        MoveReplicas(experts, loads, num_gpus, std::move(start), lower_bound, budget);
    if (Better(candidate, best)) best = std::move(candidate);
  }
  return best;
}

// One layer: phy2log for `loads` under the hierarchical scheme with the given groups and
// nodes (the global policy is this with one group and one node).
std::vector<int> PlanLayer(const std::vector<double>& loads, int num_physical, int num_groups,
                           int num_nodes, int num_gpus) {
  const int num_logical = static_cast<int>(loads.size());
  const int group_size = num_logical / num_groups;
  const int gpus_per_node = num_gpus / num_nodes;
  const int physical_per_gpu = num_physical / num_gpus;

  // Step 1: groups onto nodes, by the total load of each group.
  std::vector<double> group_load(num_groups, 0.0);
  for (int e = 0; e < num_logical; ++e) group_load[e / group_size] += loads[e];
  const std::vector<int> node_of_group = PackBalanced(group_load, num_nodes);

  std::vector<int> phy2log(num_physical, -1);
  for (int node = 0; node < num_nodes; ++node) {
    // Steps 2 and 3: replicas of this node's experts, packed onto this node's GPUs.
    std::vector<int> experts;  // logical ids, ascending
    std::vector<double> node_loads;
    for (int e = 0; e < num_logical; ++e) {
      if (node_of_group[e / group_size] != node) continue;
      experts.push_back(e);
      node_loads.push_back(loads[e]);
    }
    const GpuAssignment assignment =
        ReplicateAndPack(experts, node_loads, gpus_per_node, physical_per_gpu);
    for (int gpu = 0; gpu < gpus_per_node; ++gpu) {
      // Within a GPU, slots in logical order: readable, and the order does not change load.
      std::vector<int> hosted;
      for (size_t r = 0; r < assignment.replica_expert.size(); ++r) {
        if (assignment.gpu_of_replica[r] == gpu) hosted.push_back(assignment.replica_expert[r]);
      }
      std::sort(hosted.begin(), hosted.end());
      CHECK_EQ(static_cast<int>(hosted.size()), physical_per_gpu);
      const int first_slot = (node * gpus_per_node + gpu) * physical_per_gpu;
      std::copy(hosted.begin(), hosted.end(), phy2log.begin() + first_slot);
    }
  }
  return phy2log;
}

}  // namespace

absl::StatusOr<PlacementPolicy> ParsePlacementPolicy(absl::string_view name) {
  if (name == "auto") return PlacementPolicy::kAuto;
  if (name == "hierarchical") return PlacementPolicy::kHierarchical;
  if (name == "global") return PlacementPolicy::kGlobal;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown placement policy \"", name, "\"; use auto, hierarchical or global"));
}

const char* PlacementPolicyName(PlacementPolicy policy) {
  switch (policy) {
    case PlacementPolicy::kAuto:
      return "auto";
    case PlacementPolicy::kHierarchical:
      return "hierarchical";
    case PlacementPolicy::kGlobal:
      return "global";
  }
  return "?";
}

PlacementPolicy EffectivePolicy(const PlannerConfig& config) {
  if (config.policy != PlacementPolicy::kAuto) return config.policy;
  return config.num_nodes > 0 && config.num_groups % config.num_nodes == 0
             ? PlacementPolicy::kHierarchical
             : PlacementPolicy::kGlobal;
}

absl::Status ValidatePlannerConfig(int num_logical, const PlannerConfig& c) {
  if (num_logical <= 0 || c.num_groups <= 0 || c.num_nodes <= 0 || c.num_gpus <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("logical experts, groups, nodes and GPUs must all be at least 1; got ",
                     num_logical, " logical experts, ", c.num_groups, " groups, ", c.num_nodes,
                     " nodes, ", c.num_gpus, " GPUs"));
  }
  if (num_logical % c.num_groups != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(num_logical, " logical experts do not split into ", c.num_groups,
                     " equal expert groups; group counts that work: ", Divisors(num_logical)));
  }
  if (c.num_gpus % c.num_nodes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(c.num_gpus, " GPUs do not split evenly over ", c.num_nodes,
                     " nodes; node counts that work: ", Divisors(c.num_gpus)));
  }
  if (c.num_physical < num_logical) {
    const int64_t fewest =
        (int64_t{num_logical} + c.num_gpus - 1) / c.num_gpus * int64_t{c.num_gpus};
    return absl::InvalidArgumentError(
        absl::StrCat(c.num_physical, " physical expert slots are fewer than the ", num_logical,
                     " logical experts (every expert needs a slot); the fewest that work on ",
                     c.num_gpus, " GPUs: ", fewest, " (", fewest - num_logical, " redundant)"));
  }
  if (c.num_physical - num_logical > kMaxRedundantExperts) {
    return absl::InvalidArgumentError(absl::StrCat(c.num_physical, " physical expert slots for ",
                                                   num_logical, " logical experts is more than ",
                                                   kMaxRedundantExperts, " redundant ones"));
  }
  if (absl::Status s =
          CheckExpertsDivideOverRanks(num_logical, c.num_physical - num_logical, c.num_gpus);
      !s.ok()) {
    return s;
  }
  if (EffectivePolicy(c) == PlacementPolicy::kHierarchical && c.num_groups % c.num_nodes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the hierarchical policy needs the ", c.num_groups,
                     " expert groups to divide evenly over the nodes, and ", c.num_nodes,
                     " nodes do not; node counts that work: ", Divisors(c.num_groups),
                     " (or use the global policy)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ExpertPlacement> PlanPlacement(const ExpertLoads& loads,
                                              const PlannerConfig& config) {
  if (absl::Status s = ValidateExpertLoads(loads); !s.ok()) return s;
  const int num_logical = static_cast<int>(loads[0].size());
  if (absl::Status s = ValidatePlannerConfig(num_logical, config); !s.ok()) return s;
  const bool hierarchical = EffectivePolicy(config) == PlacementPolicy::kHierarchical;
  const int groups = hierarchical ? config.num_groups : 1;
  const int nodes = hierarchical ? config.num_nodes : 1;
  std::vector<std::vector<int>> phy2log;
  phy2log.reserve(loads.size());
  for (const std::vector<double>& layer : loads) {
    phy2log.push_back(PlanLayer(layer, config.num_physical, groups, nodes, config.num_gpus));
  }
  absl::StatusOr<ExpertPlacement> placement =
      ExpertPlacement::FromPhy2Log(std::move(phy2log), num_logical);
  // The planner gives every expert a slot by construction; a failure here is a bug.
  CHECK(placement.ok()) << placement.status();
  return placement;
}

}  // namespace deepinfer
