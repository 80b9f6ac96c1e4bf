#include "coordinator/cli/job_commands.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/eplb/expert_parallel_group.h"
#include "common/hash/sha256.h"
#include "common/rpc/auth.h"
#include "coordinator/batch/prompt_builder.h"
#include "coordinator/cli/atomic_output_file.h"
#include "coordinator/cli/child_process.h"
#include "coordinator/cli/progress.h"
#include "google/protobuf/util/json_util.h"
#include "worker/backend/backend_kind.h"

namespace deepinfer {
namespace {

bool IsFinal(Job::State s) {
  return s == Job::COMPLETED || s == Job::FAILED || s == Job::CANCELLED;
}

std::string Describe(const Job& job) {
  if (job.state() == Job::VALIDATING) {
    std::string out = absl::StrFormat("%s  %-9s  %d/%d lines validated, %d failed", job.job_id(),
                                      Job::State_Name(job.state()), job.validated_requests(),
                                      job.total_requests(), job.failed_requests());
    if (!job.name().empty()) absl::StrAppend(&out, "  '", job.name(), "'");
    return out;
  }
  std::string out = absl::StrFormat(
      "%s  %-9s  %d/%d done, %d running, %d failed, %d tokens generated", job.job_id(),
      Job::State_Name(job.state()), job.completed_requests() + job.failed_requests(),
      job.total_requests(), job.running_requests(), job.failed_requests(),
      job.generated_tokens() + job.running_generated_tokens());
  if (!job.name().empty()) absl::StrAppend(&out, "  '", job.name(), "'");
  if (job.prompt_tokens() > 0) {
    absl::StrAppendFormat(&out, "\n  prefix cache: %d of %d prompt tokens cached (%.1f%%)",
                          job.cached_prompt_tokens(), job.prompt_tokens(),
                          100.0 * job.cached_prompt_tokens() / job.prompt_tokens());
    int64_t sum = 0, max = 0;
    for (int64_t t : job.rank_tokens()) {
      sum += t;
      max = std::max(max, t);
    }
    if (job.rank_tokens_size() > 1 && sum > 0) {
      absl::StrAppendFormat(&out, "; tokens per rank max/mean %.2f (%s)",
                            static_cast<double>(max) * job.rank_tokens_size() / sum,
                            absl::StrJoin(job.rank_tokens(), " "));
    }
  }
  if (!job.error().empty()) absl::StrAppend(&out, "\n  error: ", job.error());
  if (!job.cluster_notice().empty()) absl::StrAppend(&out, "\n  cluster: ", job.cluster_notice());
  if (!job.stalled_reason().empty()) absl::StrAppend(&out, "\n  stalled: ", job.stalled_reason());
  return out;
}

// Reads the job's output lines into `file` and commits it, or to stdout when `file` is
// null; returns how many. On an error a file is left as it was.
absl::StatusOr<int64_t> WriteResults(CoordinatorClient& client, const ConnectionOptions& connection,
                                     const std::string& job_id, AtomicOutputFile* file) {
  int64_t lines = 0;
  absl::Status status = client.ReadResults(job_id, [&](const std::string& line) {
    if (file != nullptr) {
      file->Write(line);
      file->Write("\n");
    } else {
      std::cout << line << "\n";
    }
    ++lines;
  });
  if (!status.ok()) {
    return absl::Status(
        status.code(),
        absl::StrCat(
            "reading the results of job ", job_id, " from ", connection.coordinator, ": ",
            status.message(),
            file != nullptr ? absl::StrCat("; '", file->path(), "' was left as it was") : ""));
  }
  if (file != nullptr) {
    if (absl::Status s = file->Commit(); !s.ok()) return s;
  } else {
    std::cout.flush();
  }
  return lines;
}

int Fail(const char* command, const absl::Status& status, int code = 1) {
  std::cerr << "deepinfer " << command << ": " << status.message() << "\n";
  return code;
}

}  // namespace

absl::StatusOr<CoordinatorClientOptions> ClientOptions(const ConnectionOptions& connection) {
  CoordinatorClientOptions options;
  options.address = connection.coordinator;
  options.timeout = absl::Milliseconds(connection.timeout_ms);
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  options.client_id = absl::StrCat("deepinfer@", host);
  if (!connection.auth_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadAuthTokenFile(connection.auth_token_file);
    if (!token.ok()) return token.status();
    options.auth_token = *token;
  }
  return options;
}

std::string DefaultIdempotencyKey(const std::string& input_sha256,
                                  const std::vector<std::string>& options) {
  Sha256 h;
  h.Update(input_sha256);
  for (const std::string& option : options) {
    // Length-prefixed, so that ("ab", "c") and ("a", "bc") differ.
    h.Update(absl::StrCat(option.size(), ":"));
    h.Update(option);
  }
  return absl::StrCat("auto:", absl::BytesToHexString(h.Finish()));
}

int SubmitCommand(const ConnectionOptions& connection, const std::string& input_path,
                  const std::string& name, const std::string& idempotency_key, int64_t attempts) {
  auto options = ClientOptions(connection);
  if (!options.ok()) return Fail("submit", options.status(), 2);
  UploadOptions upload;
  absl::StatusOr<std::string> sha256 = Sha256::OfFile(input_path);
  if (!sha256.ok()) return Fail("submit", sha256.status(), 2);
  upload.input_sha256 = *sha256;
  upload.idempotency_key =
      idempotency_key.empty() ? DefaultIdempotencyKey(*sha256, {name}) : idempotency_key;
  CoordinatorClient client(*options);
  absl::StatusOr<SubmittedJob> job;
  for (int64_t attempt = 1;; ++attempt) {
    job = client.UploadJobFile(name, input_path, upload);
    const bool transient = job.status().code() == absl::StatusCode::kUnavailable ||
                           job.status().code() == absl::StatusCode::kDeadlineExceeded;
    if (job.ok() || !transient || attempt >= attempts) break;
    std::cerr << "deepinfer submit: " << job.status().message()
              << "; trying again with the same idempotency key (attempt " << attempt + 1 << " of "
              << attempts << ")\n";
    absl::SleepFor(absl::Seconds(attempt));
  }
  if (!job.ok()) return Fail("submit", job.status());
  if (job->existing) {
    std::cerr << "deepinfer submit: job " << job->job_id
              << " was made by an earlier submit with idempotency key '" << upload.idempotency_key
              << "'; no new job was made (pass another --idempotency-key to run the input "
                 "again)\n";
  }
  std::cout << job->job_id << std::endl;
  return 0;
}

int StatusCommand(const ConnectionOptions& connection, const std::string& job_id, bool json) {
  auto options = ClientOptions(connection);
  if (!options.ok()) return Fail("status", options.status(), 2);
  CoordinatorClient client(*options);
  std::vector<Job> jobs;
  if (job_id.empty()) {
    absl::StatusOr<ListJobsResponse> list = client.ListJobs(20, "");
    if (!list.ok()) return Fail("status", list.status());
    jobs.assign(list->jobs().begin(), list->jobs().end());
    if (jobs.empty() && !json) std::cout << "no jobs\n";
  } else {
    absl::StatusOr<Job> job = client.GetJob(job_id);
    if (!job.ok()) return Fail("status", job.status());
    jobs.push_back(*job);
  }
  for (const Job& job : jobs) {
    if (json) {
      std::string text;
      google::protobuf::util::JsonPrintOptions print;
      print.always_print_primitive_fields = true;
      print.preserve_proto_field_names = true;
      (void)google::protobuf::util::MessageToJsonString(job, &text, print);
      std::cout << text << "\n";
    } else {
      std::cout << Describe(job) << "\n";
    }
  }
  return 0;
}

int WaitCommand(const ConnectionOptions& connection, const std::string& job_id) {
  auto options = ClientOptions(connection);
  if (!options.ok()) return Fail("wait", options.status(), 2);
  CoordinatorClient client(*options);
  ProgressLine progress(stderr, ProgressLine::IsTerminal(stderr), "deepinfer wait");
  absl::StatusOr<Job> job =
      client.WatchJob(job_id, [&](const Job& update) { progress.Update(update); });
  progress.Finish();
  if (!job.ok()) return Fail("wait", job.status());
  std::cout << Describe(*job) << "\n";
  return job->state() == Job::COMPLETED ? 0 : 1;
}

int CancelCommand(const ConnectionOptions& connection, const std::string& job_id) {
  auto options = ClientOptions(connection);
  if (!options.ok()) return Fail("cancel", options.status(), 2);
  CoordinatorClient client(*options);
  absl::StatusOr<Job> job = client.CancelJob(job_id);
  if (!job.ok()) return Fail("cancel", job.status());
  std::cout << Describe(*job) << "\n";
  return 0;
}

int ResultsCommand(const ConnectionOptions& connection, const std::string& job_id,
                   const std::string& output_path) {
  auto options = ClientOptions(connection);
  if (!options.ok()) return Fail("results", options.status(), 2);
  std::unique_ptr<AtomicOutputFile> file;
  if (output_path != "-") {
    absl::StatusOr<std::unique_ptr<AtomicOutputFile>> created =
        AtomicOutputFile::Create(output_path);
    if (!created.ok()) return Fail("results", created.status(), 2);
    file = *std::move(created);
  }
  CoordinatorClient client(*options);
  absl::StatusOr<int64_t> lines = WriteResults(client, connection, job_id, file.get());
  if (!lines.ok()) return Fail("results", lines.status());
  if (output_path != "-") std::cerr << *lines << " line(s) written to " << output_path << "\n";
  return 0;
}

// ---------------------------------------------------------------------------------
// deepinfer run

absl::StatusOr<std::vector<std::string>> GpuSetsPerWorker(const char* visible, int64_t workers,
                                                          int64_t per_worker) {
  std::vector<std::string> gpus;
  if (visible != nullptr && *visible != '\0') {
    gpus = absl::StrSplit(visible, ',', absl::SkipWhitespace());
  } else {
    for (int64_t i = 0; i < workers * per_worker; ++i) gpus.push_back(absl::StrCat(i));
  }
  if (static_cast<int64_t>(gpus.size()) < workers * per_worker) {
    return absl::InvalidArgumentError(
        absl::StrCat("--split-gpus: ", workers, " worker(s) x ", per_worker, " GPU(s) need ",
                     workers * per_worker, " GPUs, CUDA_VISIBLE_DEVICES lists ", gpus.size(), " (",
                     visible, ")"));
  }
  std::vector<std::string> sets;
  for (int64_t w = 0; w < workers; ++w) {
    std::vector<std::string> mine(gpus.begin() + w * per_worker,
                                  gpus.begin() + (w + 1) * per_worker);
    sets.push_back(absl::StrJoin(mine, ","));
  }
  return sets;
}

namespace {

std::atomic<int> g_interrupted{0};

// The local coordinator's heartbeat period, and how often `deepinfer run` asks it whether the
// job is done (the process exits at most this long after the job ends).
constexpr int kLocalHeartbeatMs = 100;
constexpr int kJobPollMs = 20;
constexpr int kLocalGroupSettleMs = 100;

std::string UnixNow() { return absl::StrFormat("%.3f", absl::ToUnixMicros(absl::Now()) / 1e6); }

void OnInterrupt(int signal) { g_interrupted = signal; }

std::string SelfDir() {
  char path[4096] = {0};
  ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  std::string self = n > 0 ? std::string(path, n) : std::string(".");
  return self.substr(0, self.find_last_of('/'));
}

bool IsExecutable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

// bin/ holds all four binaries; in the Bazel tree the daemons live in sibling
// packages of coordinator/cli.
absl::StatusOr<std::pair<std::string, std::string>> FindDaemons(const std::string& bin_dir) {
  std::vector<std::string> dirs;
  if (!bin_dir.empty()) dirs.push_back(bin_dir);
  dirs.push_back(SelfDir());
  for (const std::string& dir : dirs) {
    for (const auto& [coordinator, worker] : std::vector<std::pair<std::string, std::string>>{
             {dir + "/deepinfer-coordinator", dir + "/deepinfer-worker"},
             {dir + "/../deepinfer-coordinator", dir + "/../../worker/deepinfer-worker"}}) {
      if (IsExecutable(coordinator) && IsExecutable(worker))
        return std::make_pair(coordinator, worker);
    }
  }
  return absl::NotFoundError(
      absl::StrCat("cannot find deepinfer-coordinator and deepinfer-worker next to this binary (",
                   SelfDir(), "); build them (tools/setup.sh) or pass --bin-dir"));
}

std::string TailOf(const std::string& text, size_t lines) {
  std::vector<std::string> all = absl::StrSplit(text, '\n');
  size_t start = all.size() > lines ? all.size() - lines : 0;
  std::string out;
  for (size_t i = start; i < all.size(); ++i) absl::StrAppend(&out, "    ", all[i], "\n");
  return out;
}

class LocalCluster {
 public:
  ~LocalCluster() { Stop(); }

  absl::Status Start(const RunOptions& options, const std::string& state_dir) {
    auto daemons = FindDaemons(options.bin_dir);
    if (!daemons.ok()) return daemons.status();
    const std::string logs = state_dir + "/logs";
    mkdir(logs.c_str(), 0755);
    token_file_ = state_dir + "/auth.token";
    {
      absl::BitGen gen;
      std::ofstream(token_file_) << absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen),
                                                    absl::Uniform<uint64_t>(gen))
                                 << "\n";
      chmod(token_file_.c_str(), 0600);
    }
    const std::string port_file = state_dir + "/coordinator.port";
    std::remove(port_file.c_str());
    auto coordinator = ChildProcess::Start(
        {daemons->first, "--listen=127.0.0.1:0", "--port-file=" + port_file,
         "--model=" + options.model, "--state-dir=" + state_dir + "/jobs",
         absl::StrCat("--min-workers=", options.workers), "--auth-token-file=" + token_file_,
         // The coordinator learns each step of forming (a worker READY, the group serving)
         // from a heartbeat: 1 s apart, that is seconds of start-up on every run, while on
         // loopback heartbeats cost nothing. The group waits for all the workers
         // (--min-workers) rather than for the ready set to settle.
         absl::StrCat("--heartbeat-interval-ms=", kLocalHeartbeatMs),
         absl::StrCat("--group-settle-ms=", kLocalGroupSettleMs),
         absl::StrCat("--prefix-routing=", options.prefix_routing ? "true" : "false")},
        logs + "/coordinator.log", /*one_log=*/true);
    if (!coordinator.ok()) return coordinator.status();
    coordinator_.emplace(std::move(*coordinator));
    int port = 0;
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (port == 0) {
      std::ifstream in(port_file);
      std::string text;
      if (std::getline(in, text) && absl::SimpleAtoi(text, &port) && port > 0) break;
      port = 0;
      if (!coordinator_->Running()) {
        return absl::FailedPreconditionError(absl::StrCat("the coordinator exited (code ",
                                                          coordinator_->exit_code(), "):\n",
                                                          TailOf(coordinator_->ReadStdout(), 8)));
      }
      if (absl::Now() > deadline) return absl::DeadlineExceededError("coordinator did not start");
      absl::SleepFor(absl::Milliseconds(20));
    }
    address_ = absl::StrCat("127.0.0.1:", port);
    std::vector<std::string> gpu_sets;
    if (options.split_gpus) {
      auto sets = GpuSetsPerWorker(std::getenv("CUDA_VISIBLE_DEVICES"), options.workers,
                                   options.ranks_per_worker);
      if (!sets.ok()) return sets.status();
      gpu_sets = *std::move(sets);
    }
    for (int64_t i = 0; i < options.workers; ++i) {
      std::vector<std::string> argv =
          LocalWorkerArgv(options, i, daemons->second, address_, token_file_,
                          options.split_gpus ? gpu_sets[i] : std::string());
      auto worker = ChildProcess::Start(argv, absl::StrCat(logs, "/worker-", i, ".log"), true);
      if (!worker.ok()) return worker.status();
      workers_.push_back(std::move(*worker));
    }
    return absl::OkStatus();
  }

  // An error when the cluster cannot finish the job any more.
  absl::Status Check(CoordinatorClient& client) {
    if (!coordinator_->Running()) {
      return absl::AbortedError(absl::StrCat("the coordinator exited (code ",
                                             coordinator_->exit_code(), "):\n",
                                             TailOf(coordinator_->ReadStdout(), 8)));
    }
    bool any = false;
    std::string last;
    for (ChildProcess& w : workers_) {
      if (w.Running()) {
        any = true;
      } else {
        last = TailOf(w.ReadStdout(), 8);
      }
    }
    if (!any)
      return absl::AbortedError(absl::StrCat("every worker exited; the last said:\n", last));
    // These workers are all there is: a group they could not form fails the same way again.
    absl::StatusOr<ClusterStatusResponse> status = client.ClusterStatus();
    if (status.ok() && !status->group_formation_error().empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the workers could not start the model: ", status->group_formation_error()));
    }
    return absl::OkStatus();
  }

  // Stops the workers, then the coordinator (SIGTERM; SIGKILL after 15 s); `timeline`, when
  // set, gets a line when each has exited.
  void Stop(std::ostream* timeline = nullptr) {
    if (timeline != nullptr && (!workers_.empty() || coordinator_.has_value())) {
      *timeline << "stopping at unix " << UnixNow() << "\n";
    }
    for (ChildProcess& w : workers_) w.Signal(SIGTERM);
    for (ChildProcess& w : workers_) {
      if (!w.Wait(absl::Seconds(15)).ok()) w.Signal(SIGKILL);
    }
    if (timeline != nullptr && !workers_.empty()) {
      *timeline << "workers stopped at unix " << UnixNow() << "\n";
    }
    workers_.clear();
    if (coordinator_.has_value()) {
      coordinator_->Signal(SIGTERM);
      if (!coordinator_->Wait(absl::Seconds(15)).ok()) coordinator_->Signal(SIGKILL);
      coordinator_.reset();
      if (timeline != nullptr) *timeline << "coordinator stopped at unix " << UnixNow() << "\n";
    }
  }

  const std::string& address() const { return address_; }
  const std::string& token_file() const { return token_file_; }

 private:
  std::optional<ChildProcess> coordinator_;
  std::vector<ChildProcess> workers_;
  std::string address_;
  std::string token_file_;
};

}  // namespace

std::vector<std::string> LocalWorkerArgv(const RunOptions& options, int64_t index,
                                         const std::string& worker_binary,
                                         const std::string& coordinator_address,
                                         const std::string& token_file,
                                         const std::string& gpu_set) {
  std::vector<std::string> argv;
  if (!gpu_set.empty()) {
    // Through env(1), so that only the child's environment changes.
    argv = {"/usr/bin/env", "CUDA_VISIBLE_DEVICES=" + gpu_set};
  }
  for (std::string& a : std::vector<std::string>{
           worker_binary, "--coordinator=" + coordinator_address, "--model=" + options.model,
           "--backend=" + options.backend, absl::StrCat("--ranks=", options.ranks_per_worker),
           absl::StrCat("--worker-id=worker-", index), "--auth-token-file=" + token_file}) {
    argv.push_back(std::move(a));
  }
  if (!options.dtype.empty()) argv.push_back("--dtype=" + options.dtype);
  argv.push_back(absl::StrCat("--cuda-graphs=", options.cuda_graphs ? "true" : "false"));
  argv.push_back(absl::StrCat("--cuda-graph-max-batch=", options.cuda_graph_max_batch));
  if (!options.kv_cache_dtype.empty()) argv.push_back("--kv-cache-dtype=" + options.kv_cache_dtype);
  if (!options.prefix_caching) argv.push_back("--no-prefix-caching");
  if (!options.async_scheduling) argv.push_back("--no-async-scheduling");
  if (options.batch_invariant) argv.push_back("--batch-invariant");
  if (!options.kv_cache_dir.empty()) argv.push_back("--kv-cache-dir=" + options.kv_cache_dir);
  if (options.kv_cache_dir_gb >= 0) {
    argv.push_back(absl::StrCat("--kv-cache-dir-gb=", options.kv_cache_dir_gb));
  }
  if (options.kv_host_cache_gb >= 0) {
    argv.push_back(absl::StrCat("--kv-host-cache-gb=", options.kv_host_cache_gb));
  }
  for (absl::string_view extra : absl::StrSplit(options.worker_args, ' ', absl::SkipEmpty())) {
    argv.emplace_back(extra);
  }
  return argv;
}

absl::Status CheckRunLayout(const RunOptions& options) {
  absl::StatusOr<ModelLimits> limits = ReadModelLimits(options.model);
  if (!limits.ok()) {
    return absl::Status(limits.status().code(),
                        absl::StrCat("--model=", options.model, ": ", limits.status().message()));
  }
  const ExpertParallelSelection selection = SelectExpertParallelMembers(
      limits->routed_experts, std::vector<int64_t>(options.workers, options.ranks_per_worker));
  if (selection.left_out_because.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--workers=", options.workers, " x --ranks-per-worker=", options.ranks_per_worker,
      " cannot form one expert-parallel group: ", selection.left_out_because.message(),
      selection.members > 0
          ? absl::StrCat(" (the coordinator would leave ",
                         options.workers - static_cast<int64_t>(selection.members),
                         " of the workers idle)")
          : ""));
}

int RunCommand(const RunOptions& options) {
  if (absl::Status built = CheckBackendBuilt(options.backend); !built.ok()) {
    return Fail("run", built, 2);
  }
  if (options.workers < 1 || options.ranks_per_worker < 1 || options.workers > 1024 ||
      options.ranks_per_worker > 1024) {
    return Fail("run",
                absl::InvalidArgumentError("--workers and --ranks-per-worker must be in [1, 1024]"),
                2);
  }
  if (absl::Status layout = CheckRunLayout(options); !layout.ok()) return Fail("run", layout, 2);
  // Read once now, so that an unreadable input fails before anything starts.
  absl::StatusOr<std::string> input_sha256 = Sha256::OfFile(options.input);
  if (!input_sha256.ok()) return Fail("run", input_sha256.status(), 2);
  // Created now, so that an unwritable output fails before anything starts; the output
  // replaces the file only once every result was read.
  absl::StatusOr<std::unique_ptr<AtomicOutputFile>> output =
      AtomicOutputFile::Create(options.output);
  if (!output.ok()) return Fail("run", output.status(), 2);
  std::string state_dir = options.state_dir;
  const bool temporary = state_dir.empty();
  if (temporary) {
    char templ[] = "/tmp/deepinfer-run-XXXXXX";
    if (mkdtemp(templ) == nullptr) return Fail("run", absl::InternalError("mkdtemp failed"));
    state_dir = templ;
  } else {
    mkdir(state_dir.c_str(), 0755);
  }
  struct sigaction action = {};
  action.sa_handler = OnInterrupt;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  const bool tty = ProgressLine::IsTerminal(stderr);
  if (tty) {
    std::cerr << "starting a coordinator and " << options.workers << " worker(s) ("
              << options.ranks_per_worker << " rank(s) each, " << options.backend << "); logs in "
              << state_dir << "/logs\n";
  }
  int code = 1;
  {
    // When the job finished, its results were written and the processes stopped, in unix
    // seconds (lined up with the daemons' logs by tools/bench/e2e_job.py).
    mkdir((state_dir + "/logs").c_str(), 0755);
    std::ofstream timeline(state_dir + "/logs/run.log");
    LocalCluster cluster;
    absl::Status started = cluster.Start(options, state_dir);
    if (!started.ok()) {
      Fail("run", started);
    } else {
      ConnectionOptions connection;
      connection.coordinator = cluster.address();
      connection.auth_token_file = cluster.token_file();
      CoordinatorClient client(*ClientOptions(connection));
      UploadOptions upload;
      upload.input_sha256 = *input_sha256;
      // With a --state-dir kept from an earlier run of the same file and model, that run's job
      // is picked up where it stopped rather than run a second time.
      upload.idempotency_key = DefaultIdempotencyKey(*input_sha256, {options.input, options.model});
      absl::StatusOr<SubmittedJob> submitted =
          client.UploadJobFile(options.input, options.input, upload);
      absl::StatusOr<std::string> job_id =
          submitted.ok() ? absl::StatusOr<std::string>(submitted->job_id) : submitted.status();
      if (!job_id.ok()) {
        Fail("run", job_id.status());
      } else {
        ProgressLine progress(stderr, tty, "deepinfer run");
        const absl::Time deadline = options.timeout_s > 0
                                        ? absl::Now() + absl::Seconds(options.timeout_s)
                                        : absl::InfiniteFuture();
        absl::StatusOr<Job> job;
        for (;;) {
          job = client.GetJob(*job_id);
          if (!job.ok() || IsFinal(job->state())) break;
          progress.Update(*job);
          if (g_interrupted != 0) {
            job = absl::CancelledError("interrupted");
            break;
          }
          if (absl::Status alive = cluster.Check(client); !alive.ok()) {
            job = alive;
            break;
          }
          if (absl::Now() > deadline) {
            job = absl::DeadlineExceededError(
                absl::StrCat("the job did not finish within --timeout-s=", options.timeout_s));
            break;
          }
          absl::SleepFor(absl::Milliseconds(kJobPollMs));
        }
        if (job.ok()) {
          progress.Update(*job);
          timeline << "job " << Job::State_Name(job->state()) << " seen at unix " << UnixNow()
                   << "\n";
        }
        progress.Finish();
        // Whatever happened, write the results that exist.
        absl::StatusOr<int64_t> lines = WriteResults(client, connection, *job_id, output->get());
        if (lines.ok()) timeline << "results written at unix " << UnixNow() << "\n";
        if (!job.ok()) {
          Fail("run", job.status());
        } else if (!lines.ok()) {
          Fail("run", lines.status());
        } else {
          std::cerr << Describe(*job) << "\n"
                    << *lines << " output line(s) written to " << options.output << "\n";
          code = job->state() == Job::COMPLETED ? 0 : 1;
        }
      }
    }
    cluster.Stop(&timeline);
  }
  if (temporary && !options.keep_state && code == 0) {
    (void)!std::system(absl::StrCat("rm -rf '", state_dir, "'").c_str());
  } else if (code != 0) {
    std::cerr << "logs and state kept in " << state_dir << "\n";
  }
  return code;
}

}  // namespace deepinfer
