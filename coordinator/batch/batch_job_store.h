// BatchJobStore: the coordinator's durable record of batch jobs.
//
// SQLite (state_dir/deepinfer.db) holds jobs, the state of every request line and, until a
// line has its result, the line as validation left it (a ValidatedRequest: prompt token ids
// and sampling parameters), so that queued requests live on disk rather than in memory. Each
// job's files live in state_dir/jobs/<job_id>/: input.jsonl as submitted and output.jsonl,
// one OpenAI Batch output line per finished request, appended as results arrive. A result is
// committed to the database first and appended to the file second; on Open() any output file
// shorter than the database says is rebuilt from the database, so a crash can neither lose
// nor duplicate a finished result. Recording a result for a request that already has one is
// a no-op.
//
// A full disk fails only the writes: the database is opened in exclusive locking mode (one
// coordinator per state directory), so its WAL index lives in memory and reading needs no
// space; a write that finds no room is RESOURCE_EXHAUSTED ("sqlite: database or disk is
// full") and leaves nothing half done. An output file that cannot be appended to (or
// repaired at Open) lags the database; its appends stop until CatchUpOutputFiles brings it
// level, and the results are read from the database meanwhile (ReadResults).
//
// A job is created VALIDATING from an input file already on disk (state_dir/uploads/, see
// JobInputUpload), under an optional idempotency key that no two jobs share. Validation
// commits the lines chunk by chunk, each chunk in one transaction with the position reached
// in the input, so a restarted coordinator continues where the last commit left off. Each
// job also counts the validation runs that started and made no progress (no chunk committed)
// before the coordinator stopped, so that a coordinator that dies on a job's input can tell at
// its next start, and give that job up rather than die on it again.
#ifndef DEEPINFER_COORDINATOR_BATCH_BATCH_JOB_STORE_H_
#define DEEPINFER_COORDINATOR_BATCH_BATCH_JOB_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/batch/job_input_upload.h"
#include "proto/job.pb.h"

struct sqlite3;

namespace deepinfer {

// Where validation of a job's input stands.
struct ValidationCursor {
  int64_t offset = 0;     // byte offset in input.jsonl of the next line to validate
  int64_t next_line = 1;  // its 1-based line number
  int64_t validated = 0;  // request lines validated before it
};

// One request line as validation left it: a request that can run, or its error line.
struct ValidatedLine {
  int64_t line_number = 0;
  // A serialized ValidatedRequest (proto/validated_request.proto); empty for an error.
  std::string request;
  // Tokens the request may generate over all its choices (max_tokens, or the context room
  // after the prompt, times n), for the job's unfinished_max_tokens.
  int64_t reserved_tokens = 0;
  // The error output line, when the line cannot run.
  std::string error_line;
};

// A validated request line without a result yet.
struct PendingRequest {
  int64_t line_number = 0;
  std::string request;  // serialized ValidatedRequest
};

class BatchJobStore {
 public:
  // Opens (creating if needed) the store in `state_dir`, and repairs output files.
  static absl::StatusOr<std::unique_ptr<BatchJobStore>> Open(const std::string& state_dir);
  ~BatchJobStore();

  BatchJobStore(const BatchJobStore&) = delete;
  BatchJobStore& operator=(const BatchJobStore&) = delete;

  // Where uploads are written before their job exists (cleared by Open()), and a fresh
  // file name in it.
  std::string StagingDir() const;
  std::string NewStagingPath() const;

  struct CreatedJob {
    std::string job_id;
    bool existing = false;  // the idempotency key named this job, stored before
  };
  // Stores a new VALIDATING job whose input is `staged` (moved into the job's directory; its
  // request_lines are the job's total_requests). With a non-empty `idempotency_key` that a
  // stored job has, returns that job instead (existing) and removes the staged file;
  // ALREADY_EXISTS when that job's input had another SHA-256. INVALID_ARGUMENT if the input
  // has no request line.
  absl::StatusOr<CreatedJob> CreateJob(const std::string& name, const std::string& idempotency_key,
                                       const StagedInput& staged, int64_t now_unix_ms);
  // The same from an input in memory, without a key (tests, small inputs).
  absl::StatusOr<std::string> CreateJob(const std::string& name, const std::string& input_jsonl,
                                        int64_t now_unix_ms);

  struct KeyedJob {
    std::string job_id;
    std::string input_sha256;  // 32 bytes
  };
  // The job stored under `idempotency_key`, if any.
  absl::StatusOr<std::optional<KeyedJob>> FindJobByIdempotencyKey(
      const std::string& idempotency_key) const;

  // Validation (see the top). Where it stands; NOT_FOUND for an unknown job.
  absl::StatusOr<ValidationCursor> GetValidationCursor(const std::string& job_id) const;
  // Claims custom ids for lines, in order: returns per entry the line that owns the id, which
  // is the entry's own line unless an earlier line claimed it. Claiming again for the same
  // line (validation repeated after a restart) gives that line again.
  absl::StatusOr<std::vector<int64_t>> ClaimCustomIds(
      const std::string& job_id, const std::vector<std::pair<int64_t, std::string>>& lines);
  // Stores validated lines (requests to run, and error lines recorded as results) and the
  // position reached, in one transaction; error lines are then appended to the output file. A
  // line that has a result already (validated again after a restart) is left as it is.
  absl::Status CommitValidated(const std::string& job_id, const std::vector<ValidatedLine>& lines,
                               const ValidationCursor& reached);
  // Validation reached the end of the input: the job becomes QUEUED.
  absl::Status FinishValidation(const std::string& job_id);

  // Validated request lines without a result after line `after_line`, in line order, at most
  // `max_lines`.
  absl::StatusOr<std::vector<PendingRequest>> ReadPendingRequests(const std::string& job_id,
                                                                  int64_t after_line,
                                                                  int64_t max_lines) const;
  // One of them; nullopt if the line has a result or no validated request.
  absl::StatusOr<std::optional<std::string>> ReadPendingRequest(const std::string& job_id,
                                                                int64_t line_number) const;
  // The reserved_tokens of the job's validated lines without a result.
  absl::StatusOr<int64_t> ReservedTokensLeft(const std::string& job_id) const;

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

  // Counts a validation run of the job's input that starts now; returns the runs that
  // started since the job's last validation progress, this one included (more than 1: a
  // coordinator died while validating it). CommitValidated sets the count to 1 (this run made
  // progress), FinishValidation to 0. NOT_FOUND for an unknown job.
  absl::StatusOr<int64_t> StartLoading(const std::string& job_id);

  // Sets the job's state (and error, for FAILED); final states also stamp the
  // finish time. NOT_FOUND for an unknown job.
  absl::Status SetJobState(const std::string& job_id, Job::State state, const std::string& error,
                           int64_t now_unix_ms);

  absl::StatusOr<Job> GetJob(const std::string& job_id) const;
  // Newest first; `page_token` is the last job id of the previous page ("" = start).
  absl::StatusOr<std::vector<Job>> ListJobs(int page_size, const std::string& page_token) const;
  // Jobs in VALIDATING, QUEUED or RUNNING state, oldest first (to resume after a restart).
  absl::StatusOr<std::vector<Job>> UnfinishedJobs() const;
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
  absl::Status MigrateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RepairOutputFilesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records results inside a transaction the caller opened; `recorded[i]` says whether
  // results[i] was new. A result naming an unknown job or line is NOT_FOUND.
  absl::Status RecordResultsLocked(const std::vector<Result>& results, std::vector<bool>* recorded)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends the recorded results' lines to their output files (after the commit); a file that
  // cannot take them lags (see the top).
  void AppendOutputsLocked(const std::vector<Result>& results, const std::vector<bool>& recorded)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
