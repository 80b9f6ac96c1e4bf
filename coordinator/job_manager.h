// JobManager: runs batch jobs on the cluster.
//
// Jobs come in through Submit (or are resumed from the BatchJobStore at start). Every
// input line is parsed and turned into prompt ids at once; a line that cannot run gets
// its error line right away, the others wait in a queue. One scheduler thread
//   * keeps an expert-parallel group of the READY workers (those whose ranks split the
//     routed experts, SelectExpertParallelMembers): when the set of workers changes (one
//     joins, one is LOST, leaves or restarts) or a member reports the group FAILED, it
//     forms a new generation (PrepareGroup on the worker holding rank 0, then
//     ConfigureGroup on every member) and puts the requests that were running in the old
//     generation back in the queue;
//   * once every member reports the current generation SERVING, hands queued requests
//     to ranks: where their prompt's prefix is cached unless that rank is too loaded, else
//     least loaded first (tokens in flight on the rank, as assigned here); a request that
//     shares a prefix with one still prefilling waits for it (PrefixRouter,
//     docs/kv-cache.md).
// Results arrive through OnResults (ClusterService.ReportResults) and are stored once:
// the store ignores a second result for the same line, and a request re-run after a
// failure is deterministic (it always carries a seed), so output is exactly once. Results
// and job states go to the store through a JobStoreWriter, which keeps what the store
// cannot take (a full disk) and retries it; meanwhile unfinished jobs show why they are
// stalled and no new requests are handed out.
// Workers' heartbeats report the tokens their running requests generated so far
// (OnProgress); GetJob adds those, and what keeps the cluster from running as asked (a
// worker left out of the group, no group serving), to the stored job.
#ifndef DEEPINFER_COORDINATOR_JOB_MANAGER_H_
#define DEEPINFER_COORDINATOR_JOB_MANAGER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/batch/batch_job_store.h"
#include "coordinator/batch/batch_line.h"
#include "coordinator/batch/job_store_writer.h"
#include "coordinator/batch/prompt_builder.h"
#include "coordinator/clock.h"
#include "coordinator/expert_balancer.h"
#include "coordinator/prefix_router.h"
#include "coordinator/worker_channel.h"
#include "coordinator/worker_registry.h"
#include "proto/cluster.pb.h"

namespace deepinfer {

struct JobManagerConfig {
  // No group is formed before this many workers are READY.
  int min_workers = 1;
  // A change of the READY set must hold this long before the group is re-formed, so
  // workers starting together end up in one group.
  absl::Duration settle = absl::Milliseconds(500);
  // Wait after a failed attempt to form a group.
  absl::Duration retry = absl::Seconds(1);
  // Wait after a member reports the group failed before forming the next one. A peer
  // that died is what usually breaks a group, and it must be LOST (heartbeat timeout)
  // before the next group leaves it out; otherwise the survivors would wait for it. No
  // wait when a member is LOST or LEFT (deregistered) already.
  absl::Duration regroup_delay = absl::Seconds(6);
  // Requests in flight per rank at most.
  int max_inflight_per_rank = 256;
  // Scheduler period.
  absl::Duration tick = absl::Milliseconds(20);
  // Shown as body.model when a request names none.
  std::string model_name;
  // Prefix-aware routing (PrefixRouter).
  PrefixRouterOptions prefix_routing;
  // Results and job states the store cannot take now (JobStoreWriter).
  JobStoreWriterConfig store_writes;
};

// The current group, for status reports.
struct GroupView {
  uint64_t generation = 0;
  int world_size = 0;
  bool serving = false;
  std::vector<std::string> members;
  std::string last_error;
  // Why the latest attempt to form a group failed ("" once one serves): a member reported it
  // failed while forming, ConfigureGroup or PrepareGroup was refused, or no set of READY
  // workers splits the experts. Not set by workers joining, leaving or being LOST.
  std::string formation_error;
};

class JobManager {
 public:
  // Every pointer must outlive the manager.
  JobManager(BatchJobStore* store, const PromptBuilder* prompts, WorkerRegistry* registry,
             WorkerChannel* workers, const Clock* clock, JobManagerConfig config);
  ~JobManager();  // Stops the scheduler thread.

  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Resumes the store's unfinished jobs and starts the scheduler thread. A job that cannot
  // be resumed (its input file is gone or changed, or a coordinator died while loading it
  // before) is marked FAILED with the reason, and the others run; a full disk fails none of
  // this. Errors: the store's, reading.
  absl::Status Start();

  absl::StatusOr<std::string> Submit(const std::string& name, const std::string& input_jsonl);
  absl::StatusOr<Job> GetJob(const std::string& job_id) const;
  absl::StatusOr<std::vector<Job>> ListJobs(int page_size, const std::string& page_token) const;
  absl::StatusOr<Job> Cancel(const std::string& job_id);
  absl::StatusOr<std::vector<std::string>> Results(const std::string& job_id, int64_t offset,
                                                   int64_t max_lines) const {
    return store_->ReadResults(job_id, offset, max_lines);
  }

  // Stores results; unknown or already finished requests are ignored. RESOURCE_EXHAUSTED,
  // taking none of them, while the store cannot take results and as many as may wait in
  // memory do (JobStoreWriter): the worker keeps them and sends them again.
  absl::Status OnResults(const std::vector<RequestResult>& results);

  // Takes a heartbeat's tokens generated so far per running request. Entries for requests
  // not running on `worker_id` in group `generation` are ignored.
  void OnProgress(const std::string& worker_id, uint64_t generation,
                  const google::protobuf::RepeatedPtrField<RequestProgress>& progress);

  // Waits until anything changed after `*version` (0: return at once) or `timeout`
  // passed; updates `*version`. For WatchJob.
  void WaitForChange(uint64_t* version, absl::Duration timeout) const;

  GroupView group() const;
  // What the state directory does not take now (JobStoreWriter::storage_error); "" if none.
  std::string storage_error() const {
    absl::MutexLock lock(&mu_);
    return writer_.storage_error();
  }

  // EPLB (docs/eplb.md); optional, set before Start(). New groups start with the balancer's
  // placement, and its automatic rebalance runs on the scheduler thread.
  void set_expert_balancer(ExpertBalancer* balancer) { balancer_ = balancer; }
  // Hands `placement` (as the next epoch) to every member of group `generation`, from the
  // scheduler thread, then calls `done` there with the epoch; FAILED_PRECONDITION if that
  // group is not the serving one, UNAVAILABLE if a member did not take it.
  void ApplyPlacement(std::shared_ptr<const ExpertPlacement> placement, uint64_t generation,
                      std::function<void(absl::StatusOr<uint64_t>)> done);

 private:
  struct PlacementChange {
    std::shared_ptr<const ExpertPlacement> placement;
    uint64_t generation = 0;
    std::function<void(absl::StatusOr<uint64_t>)> done;
  };
  // Sends queued and automatic placement changes (no lock held: it makes RPCs).
  void ChangePlacements();
  absl::StatusOr<uint64_t> SendPlacement(std::shared_ptr<const ExpertPlacement> placement,
                                         uint64_t generation);
  struct QueuedRequest {
    std::string job_id;
    int64_t line_number = 0;
    BatchLine line;
    std::vector<int32_t> prompt;
    int64_t cost = 0;  // tokens it may occupy: prompt + max_tokens (or the context limit)
    // The line's request id ("<job id>:<line>"); a line with n > 1 runs one request per
    // choice, "<line request id>/<choice>".
    std::string line_request_id;
    int32_t choice = 0;
    // PrefixRouter::Probes of the prompt, made under the root `probes_root`.
    std::vector<PrefixProbe> probes;
    uint64_t probes_root = 0;
  };
  // Prefix caching as this coordinator saw a job's results (Job.prompt_tokens ...).
  struct JobPrefixStats {
    int64_t prompt_tokens = 0;
    int64_t cached_prompt_tokens = 0;
    std::vector<int64_t> rank_tokens;
  };
  // The choices of a line with n > 1 that finished, until all are in.
  struct ChoiceResults {
    std::vector<std::optional<RequestResult>> results;
  };
  struct Assignment {
    std::string worker_id;
    int rank = 0;
    uint64_t generation = 0;
    int64_t generated = 0;  // tokens so far, from the worker's latest heartbeat
    // The rank's tokens in flight it counts for: its cost less the prompt tokens the rank was
    // known to hold for it when it was sent (a hit is not computed again).
    int64_t load = 0;
  };
  struct JobRuntime {
    int64_t remaining = 0;  // requests without a result
    // max_tokens (or the context room) of the queued and running requests.
    int64_t max_tokens_left = 0;
    bool cancelled = false;
    bool started = false;  // moved to RUNNING
  };
  struct Member {
    std::string worker_id;
    uint64_t incarnation = 0;
    std::string address;
    int first_rank = 0;
    int num_ranks = 0;
  };
  struct Group {
    uint64_t generation = 0;
    std::vector<Member> members;
    int world_size = 0;
    bool serving = false;
  };

  // Loads an unfinished job from the store (Start).
  absl::Status ResumeJob(const Job& job);
  // Parses the job's lines and queues those in `pending` (all lines when null);
  // records error lines for the ones that cannot run.
  absl::Status LoadJob(const std::string& job_id, const std::string& input,
                       const std::vector<int64_t>* pending);
  void Run();
  void Tick();
  // Forms a new group from `members` (no lock held: it makes RPCs).
  void FormGroup(std::vector<Member> members);
  void Dispatch();
  void RequeueInflightLocked(const char* why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishRequestsLocked(std::vector<BatchJobStore::Result> results,
                            const std::vector<std::string>& request_ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts results the store took and completes the jobs they finish.
  void ApplyWrittenLocked(const JobStoreWriter::Written& written)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets a request (queued, running or finished as one choice of several) and the
  // max_tokens it held.
  void DropRequestLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetGroupErrorLocked(std::string error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds what only the scheduler knows to an unfinished job read from the store: running
  // requests, their tokens so far, the max_tokens left, the cluster notice.
  void AddLiveStateLocked(Job* job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds a finished request's prompt, cached and rank tokens to its job's JobPrefixStats.
  void CountPrefixStatsLocked(const QueuedRequest& q, const RequestResult& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t NowMs() const;

  BatchJobStore* const store_;
  const PromptBuilder* const prompts_;
  WorkerRegistry* const registry_;
  WorkerChannel* const workers_;
  const Clock* const clock_;
  const JobManagerConfig config_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<std::string, QueuedRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  JobStoreWriter writer_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Assignment> inflight_ ABSL_GUARDED_BY(mu_);
  // By line request id.
  absl::flat_hash_map<std::string, ChoiceResults> choice_results_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, JobRuntime> jobs_ ABSL_GUARDED_BY(mu_);
  Group group_ ABSL_GUARDED_BY(mu_);
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  std::string last_group_error_ ABSL_GUARDED_BY(mu_);
  // Whether last_group_error_ came after the newest group started forming.
  bool group_error_current_ ABSL_GUARDED_BY(mu_) = false;
  // Which READY workers the group leaves out and why; empty when none is.
  std::string left_out_notice_ ABSL_GUARDED_BY(mu_);
  // Why the latest attempt to form a group failed; cleared once a group serves.
  std::string formation_error_ ABSL_GUARDED_BY(mu_);
  absl::Time retry_after_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The READY set seen last, and since when, for the settle delay.
  std::string seen_members_key_ ABSL_GUARDED_BY(mu_);
  absl::Time seen_since_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  PrefixRouter router_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, JobPrefixStats> prefix_stats_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> prefix_stats_order_ ABSL_GUARDED_BY(mu_);  // oldest job first

  ExpertBalancer* balancer_ = nullptr;
  std::vector<PlacementChange> placement_changes_ ABSL_GUARDED_BY(mu_);

  std::thread thread_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_JOB_MANAGER_H_
