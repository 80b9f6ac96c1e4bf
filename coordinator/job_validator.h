// JobValidator: validates the input files of VALIDATING jobs in the background, one job at a
// time in the order they were handed over, on every core.
//
// A job's input is read in chunks (JobValidatorConfig: lines and bytes); the chunk's request
// lines are parsed and tokenized in parallel (LineValidator), their custom ids claimed in line
// order (the first line with an id keeps it), and the chunk is committed to the store in one
// transaction with the position reached (BatchJobStore::CommitValidated): requests to run,
// and error lines as results. A restarted coordinator hands the job over again and it goes on
// from the last commit. A validation run that starts counts itself (StartLoading); a job whose
// validation stopped the coordinator twice without committing anything is given up. Memory
// stays at a chunk's worth whatever the input's size. A write the store refuses for want of
// room (RESOURCE_EXHAUSTED: a full disk) is tried again, first after 200 ms, then at doubling
// intervals up to 5 s, the job shown stalled meanwhile; it goes on by itself once there is room.
#ifndef DEEPINFER_COORDINATOR_JOB_VALIDATOR_H_
#define DEEPINFER_COORDINATOR_JOB_VALIDATOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/batch/batch_job_store.h"
#include "coordinator/batch/prompt_builder.h"

namespace deepinfer {

struct JobValidatorConfig {
  // Threads that parse and tokenize; 0: one per core.
  int threads = 0;
  // A chunk ends after this many request lines or bytes, whichever comes first (a line longer
  // than chunk_bytes is a chunk of its own).
  int64_t chunk_lines = 4096;
  int64_t chunk_bytes = int64_t{8} << 20;
  // For tests: called on the validation thread before each chunk is read; returning false
  // leaves the job there, VALIDATING, as a coordinator that stopped would (for tests of
  // resuming).
  std::function<bool(const std::string& job_id)> before_chunk;
};

class JobValidator {
 public:
  struct Callbacks {
    // A chunk of the job was committed (its counts in the store changed).
    std::function<void(const std::string& job_id)> on_progress;
    // The store refuses the job's writes (`reason` says why), or takes them again ("").
    std::function<void(const std::string& job_id, const std::string& reason)> on_stalled;
    // The job's validation ended: OK once the job is QUEUED in the store; otherwise why it
    // cannot be validated (the input file is gone or shorter than what was validated,
    // validation stopped the coordinator before, a store error), and the caller fails the job.
    // Not called for a job cancelled meanwhile, nor when the validator stops first.
    std::function<void(const std::string& job_id, const absl::Status& status)> on_done;
    // Whether the job was cancelled: its validation stops.
    std::function<bool(const std::string& job_id)> cancelled;
  };

  // The pointers must outlive the validator.
  JobValidator(BatchJobStore* store, const PromptBuilder* prompts, JobValidatorConfig config,
               Callbacks callbacks);
  // Stops after the chunk in progress; jobs not finished stay VALIDATING in the store.
  ~JobValidator();

  JobValidator(const JobValidator&) = delete;
  JobValidator& operator=(const JobValidator&) = delete;

  void Enqueue(const std::string& job_id);

 private:
  void Run();
  // Validates the job to its end; OK, or why it cannot be validated. Returns OK early when
  // stopping or the job was cancelled (`*ended` false then).
  absl::Status Validate(const std::string& job_id, bool* ended);
  bool Stopping() const;
  // Runs a store write until the store has room for it: its status, or CANCELLED when the
  // validator stops or the job is cancelled while it waits.
  absl::Status UntilThereIsRoom(const std::string& job_id,
                                const std::function<absl::Status()>& write);
  // Runs fn(i) for i in [0, n) on the pool and this thread.
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);
  void PoolThread();

  BatchJobStore* const store_;
  const PromptBuilder* const prompts_;
  const JobValidatorConfig config_;
  const Callbacks callbacks_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);

  // The pool: a batch of work is fn over [0, n), handed out in blocks.
  absl::Mutex pool_mu_;
  uint64_t batch_ ABSL_GUARDED_BY(pool_mu_) = 0;
  const std::function<void(size_t)>* work_ ABSL_GUARDED_BY(pool_mu_) = nullptr;
  size_t work_size_ ABSL_GUARDED_BY(pool_mu_) = 0;
  size_t next_ ABSL_GUARDED_BY(pool_mu_) = 0;
  int busy_ ABSL_GUARDED_BY(pool_mu_) = 0;
  bool pool_stop_ ABSL_GUARDED_BY(pool_mu_) = false;
  std::vector<std::thread> pool_;

  std::thread thread_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_JOB_VALIDATOR_H_
