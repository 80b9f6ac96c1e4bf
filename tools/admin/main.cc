// deepinfer-admin: operator tool. `status` lists the coordinator's workers and their
// states; `drain` stops new work going to a worker; `plan` computes an expert placement
// (EPLB) offline from a file of expert loads.
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "coordinator/cli/flag_set.h"
#include "coordinator/cli/subcommands.h"
#include "coordinator/client/coordinator_client.h"
#include "coordinator/rpc/auth.h"
#include "tools/admin/cluster_status_format.h"
#include "tools/admin/plan_command.h"

namespace deepinfer {
namespace {

struct ConnectionFlags {
  std::string coordinator = "127.0.0.1:7070";
  std::string auth_token_file;
  int64_t timeout_ms = 10000;

  void AddTo(FlagSet& flags) {
    flags.AddString("coordinator", &coordinator, "Coordinator address, HOST:PORT.");
    flags.AddString("auth-token-file", &auth_token_file,
                    "File holding the cluster token, if the coordinator requires one.");
    flags.AddInt("timeout-ms", &timeout_ms, "Deadline of each call to the coordinator.");
  }

  absl::StatusOr<CoordinatorClientOptions> Options() const {
    CoordinatorClientOptions options;
    options.address = coordinator;
    options.timeout = absl::Milliseconds(timeout_ms);
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    options.client_id = std::string("deepinfer-admin@") + host;
    if (!auth_token_file.empty()) {
      absl::StatusOr<std::string> token = ReadAuthTokenFile(auth_token_file);
      if (!token.ok()) return token.status();
      options.auth_token = *token;
    }
    return options;
  }
};

// Parses `args` into `flags`; returns -1 to continue, else the exit code.
int ParseOrExit(FlagSet& flags, const std::vector<std::string>& args, const char* command) {
  absl::Status parsed = flags.Parse(args);
  if (flags.help_requested()) {
    std::cout << flags.Help();
    return 0;
  }
  if (!parsed.ok()) {
    std::cerr << "deepinfer-admin " << command << ": " << parsed.message() << "\n";
    return 2;
  }
  return -1;
}

int Status(const std::vector<std::string>& args) {
  ConnectionFlags connection;
  bool json = false;
  FlagSet flags("deepinfer-admin status [--coordinator HOST:PORT] [flags]",
                "Lists every worker the coordinator knows: state (REGISTERED, READY,\n"
                "DRAINING, LOST), node, address, devices, time since last heartbeat, and\n"
                "restarts. Exits 1 if the coordinator cannot be reached.");
  connection.AddTo(flags);
  flags.AddBool("json", &json, "Print JSON instead of a table.");
  if (int rc = ParseOrExit(flags, args, "status"); rc >= 0) return rc;
  auto options = connection.Options();
  if (!options.ok()) {
    std::cerr << "deepinfer-admin status: " << options.status().message() << "\n";
    return 2;
  }
  CoordinatorClient client(*options);
  auto status = client.ClusterStatus();
  if (!status.ok()) {
    std::cerr << "deepinfer-admin status: " << status.status().message() << "\n";
    return 1;
  }
  std::cout << (json ? FormatClusterStatusJson(*status) : FormatClusterStatusTable(*status));
  return 0;
}

int Drain(const std::vector<std::string>& args) {
  ConnectionFlags connection;
  std::string worker;
  FlagSet flags("deepinfer-admin drain --worker ID [--coordinator HOST:PORT] [flags]",
                "Moves a worker to DRAINING: it finishes its work and is given nothing new.");
  connection.AddTo(flags);
  flags.AddString("worker", &worker, "Worker id, as `deepinfer-admin status` shows it.");
  flags.Require("worker");
  if (int rc = ParseOrExit(flags, args, "drain"); rc >= 0) return rc;
  auto options = connection.Options();
  if (!options.ok()) {
    std::cerr << "deepinfer-admin drain: " << options.status().message() << "\n";
    return 2;
  }
  CoordinatorClient client(*options);
  auto drained = client.DrainWorker(worker);
  if (!drained.ok()) {
    std::cerr << "deepinfer-admin drain: " << drained.status().message() << "\n";
    return 1;
  }
  std::cout << worker << ": " << WorkerState_Name(drained->state()) << "\n";
  return 0;
}

int Plan(const std::vector<std::string>& args) {
  PlanCommandConfig config;
  // -1: not given (FlagSet has no optional ints).
  int64_t num_replicas = -1;
  int64_t num_redundant_experts = -1;
  FlagSet flags(
      "deepinfer-admin plan --load F.json --num-gpus M [--num-replicas R] [--num-groups G]\n"
      "    [--num-nodes N] [--policy auto|hierarchical|global] [--current P.json]",
      "Plans an expert placement (EPLB) from per-layer expert loads, offline: F.json is\n"
      "[[tokens of expert 0, tokens of expert 1, ...], ...], one array per MoE layer.\n"
      "Prints {\"phy2log\", \"log2phy\", \"logcnt\"} JSON on stdout and the max/mean tokens\n"
      "per GPU before and after, per layer and overall, on stderr. See docs/eplb.md.");
  flags.AddString("load", &config.load_file, "JSON file of per-layer logical expert loads.");
  flags.AddInt("num-replicas", &num_replicas,
               "Physical experts per layer (logical + redundant); a multiple of --num-gpus. "
               "Default (-1): logical + --num-redundant-experts.");
  flags.AddInt("num-redundant-experts", &num_redundant_experts,
               "Redundant experts per layer when --num-replicas is not given; "
               "DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS overrides it. Default (-1): 32.");
  flags.AddInt("num-groups", &config.num_groups,
               "Expert groups of the model (n_group in config.json; 8 for DeepSeek-V3).");
  flags.AddInt("num-nodes", &config.num_nodes, "Nodes; divides --num-gpus.");
  flags.AddInt("num-gpus", &config.num_gpus, "GPUs (ranks) in the expert-parallel group.");
  flags.AddString("policy", &config.policy,
                  "auto (hierarchical when the groups divide over the nodes, else global), "
                  "hierarchical or global.");
  flags.AddString("current", &config.current_placement_file,
                  "Placement JSON to report as \"before\" (default: experts in order, no "
                  "replicas).");
  flags.Require("load");
  flags.Require("num-gpus");
  if (int rc = ParseOrExit(flags, args, "plan"); rc >= 0) return rc;
  if (num_replicas != -1) config.num_replicas = num_replicas;
  if (num_redundant_experts != -1) config.num_redundant_experts = num_redundant_experts;
  return RunPlanCommand(config, std::cout, std::cerr);
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) {
  return deepinfer::RunSubcommands(
      "deepinfer-admin", "Operator tool for a deepinfer cluster.",
      {
          {"status", "list workers and their states", deepinfer::Status},
          {"drain", "stop giving new work to a worker", deepinfer::Drain},
          {"plan", "plan an expert placement (EPLB) from a file of expert loads", deepinfer::Plan},
      },
      argc, argv);
}
