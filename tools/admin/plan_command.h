// `deepinfer-admin plan`: offline expert placement. Reads per-layer expert loads, plans a
// placement (coordinator/eplb), prints it as JSON on stdout and the balance before and
// after on stderr. The flags live in tools/admin/main.cc; this is the logic behind them.
#ifndef DEEPINFER_TOOLS_ADMIN_PLAN_COMMAND_H_
#define DEEPINFER_TOOLS_ADMIN_PLAN_COMMAND_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

namespace deepinfer {

struct PlanCommandConfig {
  std::string load_file;
  // Physical expert slots per layer; nullopt: logical experts + the redundant-expert
  // count (num_redundant_experts, DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS, default 32).
  std::optional<int64_t> num_replicas;
  std::optional<int64_t> num_redundant_experts;
  int64_t num_groups = 1;
  int64_t num_nodes = 1;
  int64_t num_gpus = 0;
  std::string policy = "auto";
  // A placement to report as "before"; empty: experts in order without replicas.
  std::string current_placement_file;
};

// Returns the exit code: 0 on success, 1 when a file cannot be read or parsed, 2 for
// inconsistent numbers (with a message that says which would work).
int RunPlanCommand(const PlanCommandConfig& config, std::ostream& out, std::ostream& err);

}  // namespace deepinfer

#endif  // DEEPINFER_TOOLS_ADMIN_PLAN_COMMAND_H_
