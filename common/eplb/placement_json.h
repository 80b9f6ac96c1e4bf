// The JSON form of an ExpertPlacement, as EPLB writes it:
//   {"phy2log": [[...]], "log2phy": [[[...]]], "logcnt": [[...]]}
// one entry per layer; log2phy rows are padded with -1 to the largest replica count of the
// placement, so the array is rectangular. `deepinfer-admin plan` prints it; workers and the
// coordinator will read it for a static placement (--expert-placement).
#ifndef DEEPINFER_COMMON_EPLB_PLACEMENT_JSON_H_
#define DEEPINFER_COMMON_EPLB_PLACEMENT_JSON_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/eplb/expert_placement.h"

namespace deepinfer {

// One layer per line.
std::string PlacementToJson(const ExpertPlacement& placement);

// INVALID_ARGUMENT saying which key, layer or entry is wrong, including tables that
// disagree with each other (see ExpertPlacement::FromTables).
absl::StatusOr<ExpertPlacement> ParsePlacementJson(absl::string_view text);

// As above, on a file; errors start with the path.
absl::StatusOr<ExpertPlacement> ReadPlacementFile(const std::string& path);
absl::Status WritePlacementFile(const std::string& path, const ExpertPlacement& placement);

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_EPLB_PLACEMENT_JSON_H_
