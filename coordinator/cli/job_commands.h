// The job subcommands of the `deepinfer` CLI (submit, status, wait, cancel, results)
// and `deepinfer run`, the zero-setup path. main.cc parses flags into these option
// structs; each function returns the process exit code and prints readable errors.
#ifndef DEEPINFER_COORDINATOR_CLI_JOB_COMMANDS_H_
#define DEEPINFER_COORDINATOR_CLI_JOB_COMMANDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/client/coordinator_client.h"

namespace deepinfer {

struct ConnectionOptions {
  std::string coordinator = "127.0.0.1:7070";
  std::string auth_token_file;
  int64_t timeout_ms = 30000;
};

absl::StatusOr<CoordinatorClientOptions> ClientOptions(const ConnectionOptions& connection);

// The idempotency key `deepinfer submit` uses when given none: "auto:" and the SHA-256 (hex)
// of the input's SHA-256 (32 bytes) and `options` (e.g. the job name), so the same command run
// again names the same job.
std::string DefaultIdempotencyKey(const std::string& input_sha256,
                                  const std::vector<std::string>& options);

// Uploads the job file (streamed, in chunks) under `idempotency_key` (empty: the default, see
// DefaultIdempotencyKey over --name); tries again with the same key when the coordinator cannot
// be reached or the deadline passes (`attempts` in all). Prints the job id as the last line of
// stdout, and on stderr when the key named a job submitted before.
int SubmitCommand(const ConnectionOptions& connection, const std::string& input_path,
                  const std::string& name, const std::string& idempotency_key, int64_t attempts);
// One job's state; with an empty id, the most recent jobs.
int StatusCommand(const ConnectionOptions& connection, const std::string& job_id, bool json);
// Waits for the job to end (progress on a terminal). Exit 0 when COMPLETED.
int WaitCommand(const ConnectionOptions& connection, const std::string& job_id);
int CancelCommand(const ConnectionOptions& connection, const std::string& job_id);
// Writes the output lines to `output_path` ("-": stdout): to a temporary file beside it,
// renamed over it once every line was read, so that on an error it is left as it was.
int ResultsCommand(const ConnectionOptions& connection, const std::string& job_id,
                   const std::string& output_path);

struct RunOptions {
  std::string model;
  std::string input;
  std::string output;
  std::string backend = "cpu";
  // Passed to the workers as --dtype when set (empty: the backend's default).
  std::string dtype;
  // Passed to the workers as --cuda-graphs / --cuda-graph-max-batch.
  bool cuda_graphs = true;
  int64_t cuda_graph_max_batch = 256;
  // Passed to the workers as --kv-cache-dtype when set (empty: auto, the weights' dtype).
  std::string kv_cache_dtype;
  // false: the workers get --no-prefix-caching.
  bool prefix_caching = true;
  // false: the workers get --no-async-scheduling.
  bool async_scheduling = true;
  // true: the workers get --batch-invariant (the CUDA backend's batch-invariant mode).
  bool batch_invariant = false;
  // Passed to the workers when set: --kv-cache-dir, --kv-cache-dir-gb, --kv-host-cache-gb
  // (negative: the worker's default).
  std::string kv_cache_dir;
  double kv_cache_dir_gb = -1;
  double kv_host_cache_gb = -1;
  // false: the coordinator gets --prefix-routing=false (least loaded rank only).
  bool prefix_routing = true;
  int64_t workers = 1;
  int64_t ranks_per_worker = 1;
  // Where the local cluster keeps its database and logs; a fresh temporary
  // directory when empty (removed afterwards unless keep_state).
  std::string state_dir;
  bool keep_state = false;
  // Extra flags passed to every worker (e.g. "--kv-cache-tokens=4096").
  std::string worker_args;
  // Directory holding deepinfer-coordinator and deepinfer-worker; found next to this
  // binary (or in the Bazel tree) when empty.
  std::string bin_dir;
  int64_t timeout_s = 0;  // 0: no limit
  // Give each worker its own GPUs (CUDA_VISIBLE_DEVICES): worker i sees GPUs
  // i*ranks_per_worker .. (i+1)*ranks_per_worker-1 of the ones this process sees, as
  // separate nodes would.
  bool split_gpus = false;
};

// CUDA_VISIBLE_DEVICES of each worker for RunOptions::split_gpus: consecutive slices of
// `visible` (this process's CUDA_VISIBLE_DEVICES; null or empty: GPUs 0, 1, ...).
// INVALID_ARGUMENT when `visible` lists fewer GPUs than workers * per_worker.
absl::StatusOr<std::vector<std::string>> GpuSetsPerWorker(const char* visible, int64_t workers,
                                                          int64_t per_worker);

// The command line of local worker `index` of `deepinfer run`: `worker_binary` with the
// coordinator's address, the model, backend, ranks, worker id and token file, every engine
// option of `options` the worker takes (--dtype when set, --cuda-graphs,
// --cuda-graph-max-batch, --kv-cache-dtype when set, --no-prefix-caching when off, the KV cache
// tiers' flags when set), then options.worker_args split at spaces (so they can override). With a
// non-empty `gpu_set`, run through env(1) with CUDA_VISIBLE_DEVICES=gpu_set.
std::vector<std::string> LocalWorkerArgv(const RunOptions& options, int64_t index,
                                         const std::string& worker_binary,
                                         const std::string& coordinator_address,
                                         const std::string& token_file, const std::string& gpu_set);

// OK when the coordinator would put every local worker of `options` in its expert-parallel
// group (SelectExpertParallelMembers over the model's routed experts); else
// INVALID_ARGUMENT saying which rank counts would work. An error naming --model when its
// config.json cannot be read.
absl::Status CheckRunLayout(const RunOptions& options);

// Checks the layout (CheckRunLayout), starts a coordinator and `workers` worker processes
// on loopback, runs the input file as one job, writes the output (replacing the file only
// once the results were read), stops everything. Exit 0 when the job completed (lines
// that failed have error lines in the output).
int RunCommand(const RunOptions& options);

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_CLI_JOB_COMMANDS_H_
