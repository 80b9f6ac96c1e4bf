// BatchJobStore: the coordinator's durable record of batch jobs.
//
// SQLite (state_dir/deepinfer.db) holds jobs and the state of every request line;
// each job's files live in state_dir/jobs/<job_id>/: input.jsonl as submitted and
// output.jsonl, one OpenAI Batch output line per finished request, appended as
// results arrive. A result is committed to the database first and appended to the
// file second; on Open() any output file shorter than the database says is rebuilt
// from the database, so a crash can neither lose nor duplicate a finished result.
// Recording a result for a request that already has one is a no-op.
//
// A full disk fails only the writes: the database is opened in exclusive locking mode (one
// coordinator per state directory), so its WAL index lives in memory and reading needs no
// space; a write that finds no room is RESOURCE_EXHAUSTED ("sqlite: database or disk is
// full") and leaves nothing half done. An output file that cannot be appended to (or
// repaired at Open) lags the database; its appends stop until CatchUpOutputFiles brings it
// level, and the results are read from the database meanwhile (ReadResults).
//
// Each job also counts the loads (parsing its input and queueing its lines) that started
// and did not finish, so that a coordinator that dies while loading a job's input can tell
// at its next start, and give that job up rather than die on it again.
#ifndef DEEPINFER_COORDINATOR_BATCH_BATCH_JOB_STORE_H_
#define DEEPINFER_COORDINATOR_BATCH_BATCH_JOB_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/job.pb.h"

struct sqlite3;

namespace deepinfer {

// A request line not finished yet, as stored.
struct StoredRequest {
  int64_t line_number = 0;  // 1-based line in input.jsonl
  std::string line;         // the input line itself
};

class BatchJobStore {
 public:
  // Opens (creating if needed) the store in `state_dir`, and repairs output files.
  static absl::StatusOr<std::unique_ptr<BatchJobStore>> Open(const std::string& state_dir);
  ~BatchJobStore();

  BatchJobStore(const BatchJobStore&) = delete;
  BatchJobStore& operator=(const BatchJobStore&) = delete;

  // Stores a new QUEUED job whose requests are the non-blank lines of `input_jsonl`;
  // returns its id. INVALID_ARGUMENT if there is no non-blank line. The job counts as
  // being loaded (one StartLoading) until FinishedLoading.
  absl::StatusOr<std::string> CreateJob(const std::string& name, const std::string& input_jsonl,
                                        int64_t now_unix_ms);

  // Records the output line of one request; `failed` counts it as failed. Returns
  // true if recorded, false if that request already had a result (nothing changes).
  absl::StatusOr<bool> RecordResult(const std::string& job_id, int64_t line_number,
                                    const std::string& output_line, bool failed);

  struct Result {
    std::string job_id;
    int64_t line_number = 0;
    std::string output_line;
    bool failed = false;
    int64_t generated_tokens = 0;
  };
  // Records many results in one transaction (one disk sync). Returns, per result,
  // whether it was recorded (false: that request already had a result). A result
  // naming an unknown job or line fails the whole call and records nothing.
  absl::StatusOr<std::vector<bool>> RecordResults(const std::vector<Result>& results);

  // Counts a load of the job's input that starts now; returns the loads that started since
  // the last one that finished, this one included (more than 1: a coordinator died while
  // loading it). NOT_FOUND for an unknown job.
  absl::StatusOr<int64_t> StartLoading(const std::string& job_id);
  // The load of the job's input finished: resets the count.
  absl::Status FinishedLoading(const std::string& job_id);

  // Sets the job's state (and error, for FAILED); final states also stamp the
  // finish time. NOT_FOUND for an unknown job.
  absl::Status SetJobState(const std::string& job_id, Job::State state, const std::string& error,
                           int64_t now_unix_ms);

  absl::StatusOr<Job> GetJob(const std::string& job_id) const;
  // Newest first; `page_token` is the last job id of the previous page ("" = start).
  absl::StatusOr<std::vector<Job>> ListJobs(int page_size, const std::string& page_token) const;
  // Jobs in QUEUED or RUNNING state, oldest first (to resume after a restart).
  absl::StatusOr<std::vector<Job>> UnfinishedJobs() const;
  // The job's request lines that have no result yet, in line order.
  absl::StatusOr<std::vector<StoredRequest>> PendingRequests(const std::string& job_id) const;
  // Output lines in the order they were recorded, from `offset`, at most `max_lines`.
  absl::StatusOr<std::vector<std::string>> ReadResults(const std::string& job_id, int64_t offset,
                                                       int64_t max_lines) const;

  // Appends to the output files that lag the database what they lack (see the top); OK when
  // none lags any more, else the first error (they stay behind, for a later call).
  absl::Status CatchUpOutputFiles();
  bool OutputFilesBehind() const;

  std::string OutputPath(const std::string& job_id) const;
  std::string InputPath(const std::string& job_id) const;

 private:
  explicit BatchJobStore(std::string state_dir) : state_dir_(std::move(state_dir)) {}
  absl::Status Init();
  absl::Status RepairOutputFilesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Brings one job's output file level with its `results` recorded results: cuts a partial
  // last line, then appends the lines after the file's last complete one (the file holds a
  // prefix of them in recording order), or rewrites the file when it holds more lines.
  absl::Status CatchUpOutputFileLocked(const std::string& job_id, int64_t results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Job> GetJobLocked(const std::string& job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<Job>> QueryJobsLocked(const std::string& where_sql,
                                                   const std::vector<std::string>& args) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string state_dir_;
  mutable absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Jobs whose output file lags the database; appends to them wait for the catch-up.
  absl::flat_hash_set<std::string> lagging_outputs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_BATCH_BATCH_JOB_STORE_H_
