// deepinfer: the user's command-line tool. Subcommands are listed by `deepinfer help`.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "common/flags/flag_set.h"
#include "coordinator/cli/bench_command.h"
#include "coordinator/cli/job_commands.h"
#include "coordinator/cli/subcommands.h"
#include "tokenizer/tokenize_command.h"
#include "worker/device_discovery.h"

namespace deepinfer {
namespace {

// How `deepinfer run` and `deepinfer wait` show progress (coordinator/cli/progress.h).
constexpr char kProgressHelp[] =
    "Progress, on a terminal: while the coordinator validates the job's lines (the job is\n"
    "VALIDATING), lines validated of the total; then requests done/running/failed,\n"
    "tokens generated so far (finished requests plus the running ones' tokens, which\n"
    "workers report in their heartbeats, about once a second), tokens/s between the\n"
    "counts seen change over the last 20 s, and an ETA: the tokens still to come divided by\n"
    "that rate. Tokens still to come: the average generated per completed request\n"
    "times the requests left, less what the running ones generated, at most their\n"
    "max_tokens; before any request completed, that max_tokens bound itself, shown\n"
    "as \"ETA <= ...\". Whatever keeps the cluster from running the job as asked (a\n"
    "worker left out of the expert-parallel group, no group serving) is printed on\n"
    "a line of its own, terminal or not. docs/jobs.md has the details.";

int Devices(const std::vector<std::string>& args) {
  std::string selection_text = "auto";
  FlagSet flags("deepinfer devices [--devices auto|cpu|cuda]",
                "Lists the devices a worker on this machine would use, as\n"
                "`deepinfer-worker --devices` would pick them.");
  flags.AddString("devices", &selection_text,
                  "auto: every CUDA GPU, else the CPU; cpu: the CPU only;\n"
                  "cuda: CUDA GPUs, an error if there are none.");
  absl::Status parsed = flags.Parse(args);
  if (flags.help_requested()) {
    std::cout << flags.Help();
    return 0;
  }
  if (!parsed.ok()) {
    std::cerr << "deepinfer devices: " << parsed.message() << "\n";
    return 2;
  }
  absl::StatusOr<DeviceSelection> selection = ParseDeviceSelection(selection_text);
  if (!selection.ok()) {
    std::cerr << "deepinfer devices: --devices: " << selection.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<std::vector<Device>> devices = FindDevices(*selection);
  if (!devices.ok()) {
    std::cerr << "deepinfer devices: " << devices.status().message() << "\n";
    return 1;
  }
  for (const Device& d : *devices) {
    std::cout << Device::Kind_Name(d.kind()) << ":" << d.index() << "  " << d.name() << "  "
              << d.total_memory_bytes() / (1 << 20) << " MiB";
    if (!d.compute_capability().empty()) std::cout << "  sm " << d.compute_capability();
    std::cout << "\n";
  }
  return 0;
}

// Parses `args`; returns -1 to go on, else the exit code (help printed, or an error).
int Parse(FlagSet& flags, const std::vector<std::string>& args, const char* command,
          size_t positional_min, size_t positional_max) {
  absl::Status parsed = flags.Parse(args);
  if (flags.help_requested()) {
    std::cout << flags.Help();
    return 0;
  }
  if (!parsed.ok()) {
    std::cerr << "deepinfer " << command << ": " << parsed.message() << "\n";
    return 2;
  }
  const size_t n = flags.positional().size();
  if (n < positional_min || n > positional_max) {
    std::cerr << "deepinfer " << command << ": expected "
              << (positional_min == positional_max ? "" : "at most ") << positional_max
              << " argument(s), got " << n << " (see --help)\n";
    return 2;
  }
  return -1;
}

void AddConnectionFlags(FlagSet& flags, ConnectionOptions* c) {
  flags.AddString("coordinator", &c->coordinator, "Coordinator address, HOST:PORT.");
  flags.AddString("auth-token-file", &c->auth_token_file,
                  "File holding the cluster token, if the coordinator requires one.");
  flags.AddInt("timeout-ms", &c->timeout_ms,
               "Deadline of each call to the coordinator (an upload gets 1 s more per 16 MiB).");
}

int Submit(const std::vector<std::string>& args) {
  ConnectionOptions connection;
  std::string input, name, idempotency_key;
  int64_t attempts = 3;
  FlagSet flags(
      "deepinfer submit --input FILE [--coordinator HOST:PORT] [flags]",
      "Submits an OpenAI Batch input file (JSONL) as a job; prints the job id as the last\n"
      "line. The file streams to the coordinator in chunks, whatever its size, and the id\n"
      "comes as soon as the coordinator stored it; the coordinator then validates and\n"
      "tokenizes the lines in the background (`deepinfer status` or `wait` show the job\n"
      "VALIDATING with lines done / total). Submitting is idempotent: a submit with the\n"
      "idempotency key of an earlier one returns that job instead of making a second.");
  AddConnectionFlags(flags, &connection);
  flags.AddString("input", &input, "The job file: one request per line.");
  flags.Require("input");
  flags.AddString("name", &name, "A label shown by `deepinfer status`.");
  flags.AddString("idempotency-key", &idempotency_key,
                  "Up to 256 bytes naming this submission (default: \"auto:\" and a SHA-256\n"
                  "of the file's content and --name, so the same command run again returns\n"
                  "the job it made; give another key to run the same file again).");
  flags.AddInt("attempts", &attempts,
               "Tries when the coordinator cannot be reached or the deadline passes, each\n"
               "with the same idempotency key (so a job is never made twice).");
  if (int rc = Parse(flags, args, "submit", 0, 0); rc >= 0) return rc;
  return SubmitCommand(connection, input, name, idempotency_key, std::max<int64_t>(1, attempts));
}

int Status(const std::vector<std::string>& args) {
  ConnectionOptions connection;
  bool json = false;
  FlagSet flags("deepinfer status [JOB] [--coordinator HOST:PORT] [flags]",
                "Shows a job's state and counts (done, running, failed, tokens so far) and,\n"
                "while it runs, what keeps the cluster from running it as asked; without JOB,\n"
                "the 20 most recent jobs.");
  AddConnectionFlags(flags, &connection);
  flags.AddBool("json", &json, "Print JSON, one job per line.");
  if (int rc = Parse(flags, args, "status", 0, 1); rc >= 0) return rc;
  return StatusCommand(connection, flags.positional().empty() ? "" : flags.positional()[0], json);
}

int Wait(const std::vector<std::string>& args) {
  ConnectionOptions connection;
  FlagSet flags("deepinfer wait JOB [--coordinator HOST:PORT] [flags]",
                std::string("Waits until the job ends. Exit 0 if it COMPLETED, 1 otherwise.\n") +
                    kProgressHelp);
  AddConnectionFlags(flags, &connection);
  if (int rc = Parse(flags, args, "wait", 1, 1); rc >= 0) return rc;
  return WaitCommand(connection, flags.positional()[0]);
}

int Cancel(const std::vector<std::string>& args) {
  ConnectionOptions connection;
  FlagSet flags("deepinfer cancel JOB [--coordinator HOST:PORT] [flags]",
                "Cancels a job: queued requests are dropped, running ones stopped; results\n"
                "already written stay.");
  AddConnectionFlags(flags, &connection);
  if (int rc = Parse(flags, args, "cancel", 1, 1); rc >= 0) return rc;
  return CancelCommand(connection, flags.positional()[0]);
}

int Results(const std::vector<std::string>& args) {
  ConnectionOptions connection;
  std::string output = "-";
  FlagSet flags("deepinfer results JOB --output FILE [--coordinator HOST:PORT] [flags]",
                "Writes the job's output lines (OpenAI Batch output JSONL, in the order they\n"
                "finished) to FILE, or to stdout with --output -. FILE is replaced only once\n"
                "every line was read; on an error it is left as it was.");
  AddConnectionFlags(flags, &connection);
  flags.AddString("output", &output, "Output file, or - for stdout.");
  if (int rc = Parse(flags, args, "results", 1, 1); rc >= 0) return rc;
  return ResultsCommand(connection, flags.positional()[0], output);
}

int Run(const std::vector<std::string>& args) {
  RunOptions options;
  FlagSet flags(
      "deepinfer run --model DIR --input FILE --output FILE [flags]",
      "Runs one job file with no setup: starts a local coordinator and worker processes\n"
      "on loopback, runs every request, writes the output file, and stops them. Exit 0\n"
      "when the job completed; a request that could not run gets an error line. A layout\n"
      "whose ranks (--workers x --ranks-per-worker) do not split the model's routed\n"
      "experts evenly is refused at once, naming the rank counts that would.\n" +
          std::string(kProgressHelp));
  flags.AddString("model", &options.model,
                  "Model directory (config.json, safetensors, tokenizer files), or\n"
                  "dummy:CONFIG.json[@SEED] for random weights.");
  flags.Require("model");
  flags.AddString("input", &options.input, "OpenAI Batch input file (JSONL).");
  flags.Require("input");
  flags.AddString("output", &options.output,
                  "Where to write the output lines; replaced only once they were all read.");
  flags.Require("output");
  flags.AddString("backend", &options.backend, "cpu or cuda.");
  flags.AddString("dtype", &options.dtype,
                  "Weight storage on the workers: bfloat16, float32, or auto (the checkpoint's\n"
                  "precision: FP8 block-scaled matrices stay FP8 on cuda) (default: bfloat16 on\n"
                  "cuda, float32 on cpu).");
  flags.AddBool("cuda-graphs", &options.cuda_graphs,
                "With --backend cuda: decode steps replayed from CUDA graphs per batch-size\n"
                "bucket (passed to the workers; --cuda-graphs=false: eager).");
  flags.AddInt("cuda-graph-max-batch", &options.cuda_graph_max_batch,
               "Largest decode batch run from a CUDA graph (passed to the workers).");
  flags.AddString("kv-cache-dtype", &options.kv_cache_dtype,
                  "Latent KV cache elements on the workers: auto (default: the weights'\n"
                  "dtype), bfloat16 or float32.");
  flags.AddBool("async-scheduling", &options.async_scheduling,
                "Workers form each step while the one before runs (passed to the workers;\n"
                "outputs unchanged); --no-async-scheduling: every step runs to the end first.");
  flags.AddBool("batch-invariant", &options.batch_invariant,
                "With --backend cuda: the workers' batch-invariant mode (passed to them as\n"
                "--batch-invariant): a request's logprobs do not depend on the requests batched\n"
                "with it; slower decode (docs/engine.md, \"Batch invariance\"). The workers also\n"
                "turn it on under DEEPINFER_BATCH_INVARIANT=1, which they inherit.");
  flags.AddBool("prefix-caching", &options.prefix_caching,
                "Workers reuse the KV cache of prompt prefixes they computed before (requests\n"
                "sharing a system prompt skip its prefill; usage.prompt_tokens_details.\n"
                "cached_tokens says how many tokens); --no-prefix-caching: every prompt whole.");
  flags.AddString("kv-cache-dir", &options.kv_cache_dir,
                  "Passed to the workers: a local directory that keeps cached KV blocks across\n"
                  "runs (a later run with the same model and prefixes skips their prefill).");
  flags.AddDouble("kv-cache-dir-gb", &options.kv_cache_dir_gb,
                  "Passed to the workers: bound on --kv-cache-dir, GiB (default: theirs).");
  flags.AddDouble("kv-host-cache-gb", &options.kv_host_cache_gb,
                  "Passed to the workers: host memory for evicted cached KV blocks, GiB\n"
                  "(default: theirs).");
  flags.AddBool("prefix-routing", &options.prefix_routing,
                "The coordinator sends requests to the rank that caches their prompt's prefix\n"
                "and lets requests sharing a prefix wait for the first one's prefill;\n"
                "--prefix-routing=false: least loaded rank only.");
  flags.AddInt("workers", &options.workers, "Worker processes (as nodes would be).");
  flags.AddInt("ranks-per-worker", &options.ranks_per_worker,
               "Engine ranks per worker (GPUs per node); all ranks form one expert-\n"
               "parallel group, so --workers x --ranks-per-worker must divide the routed\n"
               "experts.");
  flags.AddString("state-dir", &options.state_dir,
                  "Keep the job database and logs here (default: a temporary directory,\n"
                  "removed after a successful run).");
  flags.AddBool("keep-state", &options.keep_state, "Keep the temporary state directory.");
  flags.AddString("worker-args", &options.worker_args,
                  "Extra flags for every worker, space-separated (see deepinfer-worker --help).");
  flags.AddString("bin-dir", &options.bin_dir,
                  "Directory of deepinfer-coordinator and deepinfer-worker (default: next to\n"
                  "this binary).");
  flags.AddInt("timeout-s", &options.timeout_s, "Give up after this many seconds (0: never).");
  flags.AddBool("split-gpus", &options.split_gpus,
                "Give each worker its own GPUs through CUDA_VISIBLE_DEVICES (worker i gets\n"
                "--ranks-per-worker of them from GPU i * ranks-per-worker), as separate\n"
                "nodes would have.");
  if (int rc = Parse(flags, args, "run", 0, 0); rc >= 0) return rc;
  return RunCommand(options);
}

int Tokenize(const std::vector<std::string>& args) {
  tokenizer::TokenizeOptions options;
  std::string input;
  FlagSet flags("deepinfer tokenize --model DIR --input FILE [--add-special-tokens=false]",
                "Tokenizes each input line, {\"text\": ...} or {\"messages\": [...]}, with the\n"
                "model's tokenizer and chat template; prints {\"ids\": [...]} (and \"prompt\" for\n"
                "messages) per line, in order. A bad line gets an error line; exit 1 if any.");
  flags.AddString("model", &options.model_dir, "Model directory with tokenizer.json.");
  flags.Require("model");
  flags.AddString("input", &input, "JSONL file, or - for stdin.");
  flags.Require("input");
  flags.AddBool("add-special-tokens", &options.add_special_tokens,
                "Add BOS/EOS to text lines as the tokenizer config says.");
  if (int rc = Parse(flags, args, "tokenize", 0, 0); rc >= 0) return rc;
  std::ifstream file;
  std::istream* in = &std::cin;
  if (input != "-") {
    file.open(input);
    if (!file) {
      std::cerr << "deepinfer tokenize: cannot read '" << input << "'\n";
      return 2;
    }
    in = &file;
  }
  absl::Status status = tokenizer::RunTokenizeCommand(options, *in, std::cout, std::cerr);
  if (!status.ok()) {
    std::cerr << "deepinfer tokenize: " << status.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) {
  return deepinfer::RunSubcommands(
      "deepinfer",
      "deepinfer: batch inference for DeepSeek-family MoE models.\n"
      "Cluster daemons: deepinfer-coordinator, deepinfer-worker; operator tool: deepinfer-admin.",
      {
          {"run", "run a job file on a local cluster, start to finish", deepinfer::Run},
          {"submit", "submit a job file to a coordinator", deepinfer::Submit},
          {"status", "show a job (or the recent jobs)", deepinfer::Status},
          {"wait", "wait for a job to end, with progress", deepinfer::Wait},
          {"results", "write a job's output lines", deepinfer::Results},
          {"cancel", "cancel a job", deepinfer::Cancel},
          {"tokenize", "tokenize text or chat messages with a model's tokenizer",
           deepinfer::Tokenize},
          {"devices", "list the devices a worker on this machine would use", deepinfer::Devices},
          {"bench", "measure prefill/decode throughput against the roofline (deepinfer-bench)",
           deepinfer::BenchCommand},
      },
      argc, argv);
}
