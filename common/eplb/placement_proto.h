// ExpertPlacement <-> ExpertPlacementSpec (proto/common.proto), how the coordinator hands a
// placement to workers. The replica order of log2phy travels with it.
#ifndef DEEPINFER_COMMON_EPLB_PLACEMENT_PROTO_H_
#define DEEPINFER_COMMON_EPLB_PLACEMENT_PROTO_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/eplb/expert_placement.h"
#include "proto/common.pb.h"

namespace deepinfer {

ExpertPlacementSpec PlacementToProto(const ExpertPlacement& placement, uint64_t epoch);

// INVALID_ARGUMENT (saying which layer / table) for a spec without layers, a log2phy table
// that is not [num_logical][replica_width], or tables that disagree (ExpertPlacement::FromTables).
absl::StatusOr<ExpertPlacement> PlacementFromProto(const ExpertPlacementSpec& spec);

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_EPLB_PLACEMENT_PROTO_H_
