// Which ranks can form one expert-parallel group: every rank hosts the same share of the
// model's routed experts, so the group's rank count (world size) must divide the routed
// expert count. EPLB's redundant slots come on top of that share and do not relax it (a
// placement whose slots do not divide over the group is left out, see ExpertBalancer). The
// coordinator picks its group members with SelectExpertParallelMembers, a worker checks its
// group with CheckRoutedExpertsSplit, and `deepinfer run` refuses at once a layout whose
// workers could not all join.
#ifndef DEEPINFER_COMMON_EPLB_EXPERT_PARALLEL_GROUP_H_
#define DEEPINFER_COMMON_EPLB_EXPERT_PARALLEL_GROUP_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace deepinfer {

// OK when `world_size` ranks split `routed_experts` evenly, and for dense models
// (routed_experts <= 0). INVALID_ARGUMENT otherwise, naming the rank counts that would work:
// "8 routed experts cannot be split over 3 ranks; rank counts that divide 8: 1, 2, 4, 8".
absl::Status CheckRoutedExpertsSplit(int64_t routed_experts, int64_t world_size);

struct ExpertParallelSelection {
  // The first `members` workers form the group (0: no group can form).
  size_t members = 0;
  // Their ranks together.
  int64_t world_size = 0;
  // Why the other workers are left out: CheckRoutedExpertsSplit over all the ranks offered.
  // OK when every worker is in.
  absl::Status left_out_because;
};

// The workers of an expert-parallel group, given each candidate's rank count in the order
// the coordinator ranks them: all of them when their ranks split the routed experts, else
// the longest prefix whose ranks do (the last ones are left out, to wait as spares).
ExpertParallelSelection SelectExpertParallelMembers(int64_t routed_experts,
                                                    const std::vector<int64_t>& ranks_per_worker);

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_EPLB_EXPERT_PARALLEL_GROUP_H_
