// `deepinfer-admin expert-load`: the coordinator's EPLB load window (GetExpertLoadResponse)
// as a terminal table of tokens per GPU per MoE layer, as the loads JSON `plan --load`
// reads, and as a heat-map PNG (rows: layers, columns: GPUs).
//
// Tokens per GPU follow the layout the group runs: the coordinator's placement once every
// member runs its epoch, experts in order before that (a token routed to an expert with k
// replicas counts 1/k on each replica's GPU, as BalanceReport models dispatch).
#ifndef DEEPINFER_TOOLS_ADMIN_EXPERT_LOAD_VIEW_H_
#define DEEPINFER_TOOLS_ADMIN_EXPERT_LOAD_VIEW_H_

#include <string>

#include "absl/status/statusor.h"
#include "coordinator/eplb/balance_report.h"
#include "coordinator/eplb/expert_loads.h"
#include "proto/admin.pb.h"

namespace deepinfer {

// FAILED_PRECONDITION when the window is empty; INVALID_ARGUMENT for a malformed response.
absl::StatusOr<ExpertLoads> LoadsFromResponse(const GetExpertLoadResponse& response);

// Per GPU load of the running layout; FAILED_PRECONDITION without a group (num_gpus 0).
absl::StatusOr<BalanceReport> GpuLoads(const GetExpertLoadResponse& response);

// The table (a header line with the window and the layout, one row per layer, an overall row).
absl::StatusOr<std::string> FormatExpertLoadTable(const GetExpertLoadResponse& response);

// The heat map as PNG bytes: one cell per (layer, GPU), black (no tokens) through red and
// yellow to white (the busiest cell), with a white line between layers.
absl::StatusOr<std::string> RenderExpertLoadPng(const GetExpertLoadResponse& response);

}  // namespace deepinfer

#endif  // DEEPINFER_TOOLS_ADMIN_EXPERT_LOAD_VIEW_H_
