// ExpertLoads: tokens routed to each logical expert of each MoE layer over some window
// (loads[layer][logical_expert]), the planner's input; and its JSON file form
// `[[...], ...]`, one array per layer, as `deepinfer-admin plan --load` reads it.
#ifndef DEEPINFER_COORDINATOR_EPLB_EXPERT_LOADS_H_
#define DEEPINFER_COORDINATOR_EPLB_EXPERT_LOADS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deepinfer {

// Doubles, not counts: a window may be an average or decayed sum of counts.
using ExpertLoads = std::vector<std::vector<double>>;

// INVALID_ARGUMENT unless there is at least one layer and one expert, every layer has the
// same number of experts, and every load is finite and not negative.
absl::Status ValidateExpertLoads(const ExpertLoads& loads);

// Parses and validates `[[...], ...]`. Errors say what is wrong and where (layer, expert).
absl::StatusOr<ExpertLoads> ParseExpertLoadsJson(absl::string_view text);
std::string ExpertLoadsToJson(const ExpertLoads& loads);

// As above, on a file; errors start with the path.
absl::StatusOr<ExpertLoads> ReadExpertLoadsFile(const std::string& path);
absl::Status WriteExpertLoadsFile(const std::string& path, const ExpertLoads& loads);

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_EPLB_EXPERT_LOADS_H_
