#include "common/eplb/expert_parallel_group.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace deepinfer {

absl::Status CheckRoutedExpertsSplit(int64_t routed_experts, int64_t world_size) {
  if (routed_experts <= 0) return absl::OkStatus();
  if (world_size > 0 && routed_experts % world_size == 0) return absl::OkStatus();
  std::vector<int64_t> divisors;
  for (int64_t d = 1; d <= routed_experts; ++d) {
    if (routed_experts % d == 0) divisors.push_back(d);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      routed_experts, " routed experts cannot be split over ", world_size,
      " ranks; rank counts that divide ", routed_experts, ": ", absl::StrJoin(divisors, ", ")));
}

ExpertParallelSelection SelectExpertParallelMembers(int64_t routed_experts,
                                                    const std::vector<int64_t>& ranks_per_worker) {
  ExpertParallelSelection selection;
  selection.members = ranks_per_worker.size();
  for (int64_t ranks : ranks_per_worker) selection.world_size += ranks;
  selection.left_out_because = CheckRoutedExpertsSplit(routed_experts, selection.world_size);
  if (selection.left_out_because.ok()) return selection;
  while (selection.members > 0 &&
         !CheckRoutedExpertsSplit(routed_experts, selection.world_size).ok()) {
    --selection.members;
    selection.world_size -= ranks_per_worker[selection.members];
  }
  return selection;
}

}  // namespace deepinfer
