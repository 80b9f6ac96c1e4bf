// deepinfer-admin: operator tool. `status` lists the coordinator's workers and their
// states; `drain` stops new work going to a worker; `plan` computes an expert placement
// (EPLB) offline from a file of expert loads; `expert-load` shows the coordinator's expert
// load window; `rebalance` plans a placement from it and applies it live; `memory-plan` says
// what each GPU would hold for a model, from its config alone.
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "common/flags/flag_set.h"
#include "common/rpc/auth.h"
#include "coordinator/cli/subcommands.h"
#include "coordinator/client/coordinator_client.h"
#include "coordinator/eplb/expert_loads.h"
#include "tools/admin/cluster_status_format.h"
#include "tools/admin/expert_load_view.h"
#include "tools/admin/memory_plan_command.h"
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
                "DRAINING, LOST, LEFT), node, address, devices, time since last heartbeat,\n"
                "and restarts. Exits 1 if the coordinator cannot be reached.");
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

int MemoryPlan(const std::vector<std::string>& args) {
  MemoryPlanCommandConfig config;
  FlagSet flags(
      "deepinfer-admin memory-plan --model dummy:CONFIG.json --num-gpus G [--precision fp8]\n"
      "    [--gpu-memory-mib M] [--gpu-memory-utilization U] [flags]",
      "What each GPU of a G-GPU expert-parallel group would hold for the model, without\n"
      "loading anything: weights and block scales counted from the config's parameter\n"
      "shapes in --precision (routed experts split over the GPUs, everything else on each),\n"
      "the activation reserve, dequantisation scratch and decode-graph memory as a worker\n"
      "sizes them, and the KV cache tokens that --gpu-memory-utilization leaves. Exits 3\n"
      "when the model does not fit; says when the engine refuses the configuration (mxfp4\n"
      "on more than one GPU). docs/memory-plan.md.");
  flags.AddString("model", &config.model,
                  "dummy:CONFIG.json, a config.json, or a checkpoint directory (its "
                  "config.json is read; nothing else).");
  flags.AddInt("num-gpus", &config.num_gpus, "GPUs (ranks) of the expert-parallel group.");
  flags.AddInt("gpu-memory-mib", &config.gpu_memory_mib,
               "Memory of one GPU in MiB, as nvidia-smi reports it (H200: 143771).");
  flags.AddDouble("gpu-memory-utilization", &config.gpu_memory_utilization,
                  "Fraction of each GPU's memory a rank may use, in (0, 1].");
  flags.AddString("precision", &config.precision,
                  "Weights: bf16, fp8 (F8_E4M3 projections with 128x128 block scales; the\n"
                  "embedding, head, routers and vectors bf16), or mxfp4 (fp8, with routed\n"
                  "experts MXFP4: E2M1 values and an E8M0 scale per 32).");
  flags.AddString("fp8-scale", &config.fp8_scale,
                  "FP8 block scales: f32 (DeepSeek-V3) or ue8m0 (one byte each).");
  flags.AddString("kv-cache-dtype", &config.kv_cache_dtype, "bfloat16, float32 or fp8.");
  flags.AddInt("block-size", &config.block_size, "KV cache block size in tokens.");
  flags.AddInt("max-batch-tokens", &config.max_batch_tokens,
               "New tokens per engine step (sizes the activation reserve).");
  flags.AddInt("max-running", &config.max_running,
               "Sequences per engine step (each holds fixed cache state in V4 models).");
  flags.AddInt("cuda-graph-max-batch", &config.cuda_graph_max_batch,
               "Largest decode batch recorded as a CUDA graph; 0 for none.");
  flags.AddBool("mtp", &config.mtp, "Count the MTP layers' weights (num_nextn_predict_layers).");
  flags.Require("model");
  flags.Require("num-gpus");
  if (int rc = ParseOrExit(flags, args, "memory-plan"); rc >= 0) return rc;
  return RunMemoryPlanCommand(config, std::cout, std::cerr);
}

int ExpertLoad(const std::vector<std::string>& args) {
  ConnectionFlags connection;
  std::string save, plot;
  FlagSet flags(
      "deepinfer-admin expert-load [--coordinator HOST:PORT] [--save F.json] "
      "[--plot F.png] [flags]",
      "Shows the coordinator's window of expert load statistics (the last\n"
      "--eplb-window-steps steps of the group): tokens per GPU per MoE layer under\n"
      "the layout the group runs, max, mean and max/mean. Exits 1 if the coordinator\n"
      "cannot be reached or has no statistics yet.");
  connection.AddTo(flags);
  flags.AddString("save", &save,
                  "Also write the per-layer logical expert loads as JSON (what `plan --load` "
                  "reads).");
  flags.AddString("plot", &plot, "Also write a heat map (layers x GPUs) as PNG.");
  if (int rc = ParseOrExit(flags, args, "expert-load"); rc >= 0) return rc;
  auto options = connection.Options();
  if (!options.ok()) {
    std::cerr << "deepinfer-admin expert-load: " << options.status().message() << "\n";
    return 2;
  }
  CoordinatorClient client(*options);
  auto response = client.GetExpertLoad();
  if (!response.ok()) {
    std::cerr << "deepinfer-admin expert-load: " << response.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<ExpertLoads> loads = LoadsFromResponse(*response);
  if (!loads.ok()) {
    std::cerr << "deepinfer-admin expert-load: " << loads.status().message() << "\n";
    return 1;
  }
  if (!save.empty()) {
    if (absl::Status st = WriteExpertLoadsFile(save, *loads); !st.ok()) {
      std::cerr << "deepinfer-admin expert-load: " << st.message() << "\n";
      return 1;
    }
  }
  absl::StatusOr<std::string> table = FormatExpertLoadTable(*response);
  if (!table.ok()) {
    std::cerr << "deepinfer-admin expert-load: " << table.status().message() << "\n";
    return 1;
  }
  std::cout << *table;
  if (!plot.empty()) {
    absl::StatusOr<std::string> png = RenderExpertLoadPng(*response);
    if (!png.ok()) {
      std::cerr << "deepinfer-admin expert-load: " << png.status().message() << "\n";
      return 1;
    }
    std::ofstream out(plot, std::ios::binary);
    out << *png;
    if (!out.good()) {
      std::cerr << "deepinfer-admin expert-load: cannot write " << plot << "\n";
      return 1;
    }
  }
  return 0;
}

int Rebalance(const std::vector<std::string>& args) {
  ConnectionFlags connection;
  std::string policy = "auto";
  bool dry_run = false;
  std::string save;
  FlagSet flags(
      "deepinfer-admin rebalance [--coordinator HOST:PORT] "
      "[--policy auto|hierarchical|global] [--dry-run] [flags]",
      "Plans an expert placement (EPLB) from the coordinator's load window for the\n"
      "serving group, prints max/mean tokens per GPU before (the layout running now)\n"
      "and after, per layer and overall, and -- unless --dry-run -- applies it: the\n"
      "ranks load the expert weights they now need and switch together between two\n"
      "steps; no request is dropped. Exits 1 when the coordinator refuses (no group,\n"
      "no statistics, sizes that do not work: the message says which).");
  connection.AddTo(flags);
  flags.AddString("policy", &policy, "auto, hierarchical or global.");
  flags.AddBool("dry-run", &dry_run, "Plan and print, change nothing.");
  flags.AddString("save", &save, "Also write the new placement JSON to this file.");
  if (int rc = ParseOrExit(flags, args, "rebalance"); rc >= 0) return rc;
  auto options = connection.Options();
  if (!options.ok()) {
    std::cerr << "deepinfer-admin rebalance: " << options.status().message() << "\n";
    return 2;
  }
  CoordinatorClient client(*options);
  auto response = client.Rebalance(policy, dry_run);
  if (!response.ok()) {
    std::cerr << "deepinfer-admin rebalance: " << response.status().message() << "\n";
    return 1;
  }
  std::cout << response->report();
  if (!save.empty()) {
    std::ofstream out(save);
    out << response->placement_json();
    if (!out.good()) {
      std::cerr << "deepinfer-admin rebalance: cannot write " << save << "\n";
      return 1;
    }
  }
  if (response->applied()) {
    std::cout << "applied: expert placement epoch " << response->epoch()
              << " handed to the group; its ranks switch between two steps\n";
  } else {
    std::cout << "dry run: nothing changed\n";
  }
  return 0;
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
          {"memory-plan", "per-GPU memory plan of a model (weights, reserves, KV cache tokens)",
           deepinfer::MemoryPlan},
          {"expert-load", "show the expert load window (EPLB) per layer and GPU",
           deepinfer::ExpertLoad},
          {"rebalance", "re-plan the expert placement from the load window and apply it live",
           deepinfer::Rebalance},
      },
      argc, argv);
}
