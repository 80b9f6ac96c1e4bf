// deepinfer-coordinator: the control plane daemon. Parses flags into a
// CoordinatorConfig, starts the CoordinatorServer, and runs until SIGTERM/SIGINT.
#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "common/eplb/placement_json.h"
#include "common/flags/flag_set.h"
#include "common/rpc/auth.h"
#include "common/rpc/daemon.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/eplb/placement_planner.h"
#include "coordinator/eplb/redundant_experts.h"
#include "glog/logging.h"

int main(int argc, char** argv) {
  deepinfer::BlockTerminationSignals();

  std::string listen = "127.0.0.1:7070";
  std::string model;
  std::string state_dir;
  int64_t min_workers = 1;
  int64_t group_settle_ms = 500;
  std::string port_file;
  std::string auth_token_file;
  int64_t heartbeat_interval_ms = 1000;
  int64_t heartbeat_timeout_ms = 5000;
  std::string log_dir;
  int64_t verbosity = 0;
  std::string expert_placement;
  int64_t num_redundant_experts = -1;
  int64_t eplb_window_steps = 1000;
  int64_t eplb_interval_steps = 0;
  double eplb_balance_threshold = 1.05;
  std::string eplb_policy = "auto";

  deepinfer::FlagSet flags(
      "deepinfer-coordinator [flags]",
      "The deepinfer control plane: tracks worker daemons (registration, heartbeats),\n"
      "forms the expert-parallel group, takes batch jobs and hands their requests to\n"
      "the workers' ranks, keeps results in --state-dir. Runs until SIGTERM or SIGINT;\n"
      "a restarted coordinator resumes the unfinished jobs of its state directory.");
  flags.AddString("listen", &listen,
                  "HOST:PORT to listen on. The default accepts local connections only; use\n"
                  "0.0.0.0:PORT for a multi-node cluster, together with --auth-token-file.\n"
                  "Port 0 picks a free one (see --port-file).");
  flags.AddString("model", &model,
                  "Model directory (config.json, tokenizer files) the workers serve, or\n"
                  "dummy:CONFIG.json[@SEED]. Used for prompts (tokenizer, chat template) and\n"
                  "limits. Without it the coordinator takes no jobs.");
  flags.AddString("state-dir", &state_dir,
                  "Directory for the job database and the jobs' input and output files\n"
                  "(created if missing). Required with --model.");
  flags.AddInt("group-settle-ms", &group_settle_ms,
               "How long a change of the ready workers must hold before the group is formed\n"
               "again, so that workers starting together end up in one group.");
  flags.AddInt("min-workers", &min_workers,
               "Workers to wait for before forming the first expert-parallel group.");
  flags.AddString("port-file", &port_file,
                  "If set, the bound port is written to this file once serving.");
  flags.AddString("auth-token-file", &auth_token_file,
                  "File holding the cluster token. When set, every RPC (workers, CLI, admin)\n"
                  "must carry it or is refused with UNAUTHENTICATED.");
  flags.AddInt("heartbeat-interval-ms", &heartbeat_interval_ms,
               "How often workers are told to heartbeat.");
  flags.AddInt("heartbeat-timeout-ms", &heartbeat_timeout_ms,
               "A worker silent for longer than this is marked LOST.");
  flags.AddString("expert-placement", &expert_placement,
                  "EPLB placement JSON (as `deepinfer-admin plan` prints it) that every\n"
                  "expert-parallel group starts with when its slots divide over the group's\n"
                  "ranks (docs/eplb.md). Default: experts split contiguously.");
  flags.AddInt("num-redundant-experts", &num_redundant_experts,
               "Redundant expert slots per MoE layer for the placements the coordinator\n"
               "plans (rebalance). Default (-1): $DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS,\n"
               "else 32. logical + redundant must divide over the group's ranks.");
  flags.AddInt("eplb-window-steps", &eplb_window_steps,
               "Steps of expert load statistics the coordinator keeps (sliding window) for\n"
               "rebalancing and `deepinfer-admin expert-load`.");
  flags.AddInt("eplb-interval-steps", &eplb_interval_steps,
               "Rebalance the experts automatically every this many steps (0: only on\n"
               "`deepinfer-admin rebalance`).");
  flags.AddDouble("eplb-balance-threshold", &eplb_balance_threshold,
                  "Automatic rebalance is skipped while max/mean tokens per GPU of the\n"
                  "current layout is at most this.");
  flags.AddString("eplb-policy", &eplb_policy,
                  "Placement policy of the automatic rebalance: auto, hierarchical or global.");
  bool prefix_routing = true;
  double prefix_routing_load_factor = 1.25;
  int64_t prefix_routing_slack_tokens = 2048;
  flags.AddBool("prefix-routing", &prefix_routing,
                "Send a request to the rank whose prefix cache holds its prompt's prefix (as\n"
                "the ranks' heartbeats report it), and let requests sharing a prefix wait for\n"
                "the first one's prefill (docs/kv-cache.md); false: least loaded rank only.");
  flags.AddDouble("prefix-routing-load-factor", &prefix_routing_load_factor,
                  "A rank holding the prefix takes the request while its tokens in flight are\n"
                  "at most this x the least loaded rank's + --prefix-routing-slack-tokens.");
  flags.AddInt("prefix-routing-slack-tokens", &prefix_routing_slack_tokens,
               "See --prefix-routing-load-factor.");
  flags.AddString("log-dir", &log_dir, "Write glog files here instead of to stderr.");
  flags.AddInt("v", &verbosity, "Verbose logging level (glog --v).");

  if (int rc = flags.ParseMain(argc, argv, "deepinfer-coordinator"); rc >= 0) return rc;
  deepinfer::InitDaemonLogging(argv[0], log_dir, static_cast<int>(verbosity));

  deepinfer::CoordinatorConfig config;
  if (size_t colon = listen.rfind(':');
      colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &config.port)) {
    std::cerr << "deepinfer-coordinator: --listen wants HOST:PORT, got '" << listen << "'\n";
    return 2;
  } else {
    config.host = listen.substr(0, colon);
  }
  const std::string& host = config.host;
  config.model = model;
  config.state_dir = state_dir;
  if (!model.empty() && state_dir.empty()) {
    std::cerr << "deepinfer-coordinator: --model needs --state-dir (where jobs are kept)\n";
    return 2;
  }
  config.jobs.min_workers = static_cast<int>(std::max<int64_t>(1, min_workers));
  if (group_settle_ms < 0) {
    std::cerr << "deepinfer-coordinator: --group-settle-ms must be >= 0\n";
    return 2;
  }
  config.jobs.settle = absl::Milliseconds(group_settle_ms);
  if (!(prefix_routing_load_factor >= 1.0) || prefix_routing_slack_tokens < 0) {
    std::cerr << "deepinfer-coordinator: --prefix-routing-load-factor must be >= 1 and\n"
                 "--prefix-routing-slack-tokens >= 0\n";
    return 2;
  }
  config.jobs.prefix_routing.enabled = prefix_routing;
  config.jobs.prefix_routing.load_factor = prefix_routing_load_factor;
  config.jobs.prefix_routing.slack_tokens = prefix_routing_slack_tokens;
  if (eplb_window_steps < 1 || eplb_interval_steps < 0 || !(eplb_balance_threshold >= 1.0)) {
    std::cerr << "deepinfer-coordinator: --eplb-window-steps must be >= 1, "
                 "--eplb-interval-steps >= 0 and --eplb-balance-threshold >= 1\n";
    return 2;
  }
  config.eplb.window_steps = eplb_window_steps;
  config.eplb.interval_steps = eplb_interval_steps;
  config.eplb.balance_threshold = eplb_balance_threshold;
  if (absl::StatusOr<deepinfer::PlacementPolicy> policy =
          deepinfer::ParsePlacementPolicy(eplb_policy);
      policy.ok()) {
    config.eplb.auto_policy = *policy;
  } else {
    std::cerr << "deepinfer-coordinator: --eplb-policy: " << policy.status().message() << "\n";
    return 2;
  }
  {
    absl::StatusOr<int> redundant = deepinfer::ResolveNumRedundantExpertsFromEnv(
        num_redundant_experts == -1 ? std::nullopt : std::optional<int64_t>(num_redundant_experts));
    if (!redundant.ok()) {
      std::cerr << "deepinfer-coordinator: " << redundant.status().message() << "\n";
      return 2;
    }
    config.eplb.num_redundant = *redundant;
  }
  if (!expert_placement.empty()) {
    absl::StatusOr<deepinfer::ExpertPlacement> placement =
        deepinfer::ReadPlacementFile(expert_placement);
    if (!placement.ok()) {
      std::cerr << "deepinfer-coordinator: --expert-placement: " << placement.status().message()
                << "\n";
      return 2;
    }
    config.eplb.initial = std::make_shared<const deepinfer::ExpertPlacement>(std::move(*placement));
  }
  config.heartbeat_interval = absl::Milliseconds(heartbeat_interval_ms);
  config.heartbeat_timeout = absl::Milliseconds(heartbeat_timeout_ms);
  if (!auth_token_file.empty()) {
    absl::StatusOr<std::string> token = deepinfer::ReadAuthTokenFile(auth_token_file);
    if (!token.ok()) {
      std::cerr << "deepinfer-coordinator: " << token.status().message() << "\n";
      return 2;
    }
    config.auth_token = *token;
  }
  if (config.auth_token.empty() && host != "127.0.0.1" && host != "localhost" && host != "::1") {
    LOG(WARNING) << "listening on " << host
                 << " without --auth-token-file: anyone who can reach this port can "
                    "register workers and submit jobs";
  }

  return deepinfer::ServeUntilSignal("deepinfer-coordinator",
                                     deepinfer::CoordinatorServer::Start(config), port_file);
}
