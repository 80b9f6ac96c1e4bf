// JobStoreWriter: the JobManager's writes of results and job states into the BatchJobStore,
// kept when the store cannot take them (its disk is full) and retried until it can.
//
// A write the store refuses is held in memory, and so is every write after it, in order,
// so that a job's state never lands before its results. Retry (from the scheduler thread)
// tries the held writes again, first after `first_retry`, then at doubling intervals up to
// `max_retry` while they keep failing, and brings lagging output files level
// (BatchJobStore::CatchUpOutputFiles). While anything is held the JobManager hands out no new
// requests (their results could not be stored either), and once the held results' output
// lines reach `max_held_bytes` it refuses more results: workers keep those and send them
// again. Held results are lost if the coordinator stops; their requests have no result in
// the store, so they run again after a restart (a request always carries a seed), and the
// output is still exactly once.
//
// Not thread-safe: the JobManager calls it under its lock.
#ifndef DEEPINFER_COORDINATOR_BATCH_JOB_STORE_WRITER_H_
#define DEEPINFER_COORDINATOR_BATCH_JOB_STORE_WRITER_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/batch/batch_job_store.h"
#include "proto/job.pb.h"

namespace deepinfer {

struct JobStoreWriterConfig {
  // Output-line bytes of held results past which new results are refused.
  int64_t max_held_bytes = int64_t{256} << 20;
  // The wait before the first retry of a refused write, and the longest between retries.
  absl::Duration first_retry = absl::Milliseconds(200);
  absl::Duration max_retry = absl::Seconds(5);
};

class JobStoreWriter {
 public:
  // Results, and the requests of the JobManager they finish.
  struct Batch {
    std::vector<BatchJobStore::Result> results;
    std::vector<std::string> request_ids;
  };
  // A batch the store took; recorded[i] is false where results[i]'s line had a result already.
  struct Written {
    Batch batch;
    std::vector<bool> recorded;
  };

  // `store` must outlive the writer.
  JobStoreWriter(BatchJobStore* store, JobStoreWriterConfig config);
  ~JobStoreWriter();  // logs the results it still holds (lost)

  JobStoreWriter(const JobStoreWriter&) = delete;
  JobStoreWriter& operator=(const JobStoreWriter&) = delete;

  // Stores `batch` now, unless writes are held (it then waits behind them); nullopt when it
  // is held.
  std::optional<Written> WriteResults(Batch batch, absl::Time now);
  // Sets a job's state (BatchJobStore::SetJobState, a final one stamped `now`), or holds it
  // as above.
  void SetJobState(const std::string& job_id, Job::State state, const std::string& error,
                   absl::Time now);
  // Once the retry is due: the held writes, oldest first, until one fails; then the lagging
  // output files. Returns the result batches it stored.
  std::vector<Written> Retry(absl::Time now);
  // Forgets the held results and states of a job that was cancelled.
  void DropJob(const std::string& job_id);

  // Whether writes are held; whether a result of the request is.
  bool holding() const { return !held_.empty(); }
  bool holds(const std::string& request_id) const { return held_requests_.contains(request_id); }
  // RESOURCE_EXHAUSTED, saying why, once the held results reach max_held_bytes: refuse more.
  absl::Status RoomForResults() const;
  // Why an unfinished job is stalled ("" when no write is held), in words that stay the same
  // while the store fails the same way.
  std::string stalled_reason() const;
  // What the state directory does not take now, with counts, for the cluster status: held
  // writes and lagging output files. "" when nothing.
  std::string storage_error() const;
  // Shows a held state of `job` (read from the store) as if it were stored.
  void ApplyHeldState(Job* job) const;
  // The results held now.
  int64_t held_results() const;

 private:
  struct StateChange {
    std::string job_id;
    Job::State state = Job::STATE_UNSPECIFIED;
    std::string error;
    int64_t now_unix_ms = 0;
  };
  // One held write: a result batch, or a job state when `state` is set.
  struct Held {
    Batch batch;
    std::optional<StateChange> state;
  };

  // Holds `write` and schedules the next retry, after `error` (OK when it waits behind
  // others).
  void Hold(Held write, const absl::Status& error, absl::Time now);
  // Counts `write` in (`sign` 1) or out (-1) of held_bytes_ and held_requests_.
  void Count(const Held& write, int sign);

  BatchJobStore* const store_;
  const JobStoreWriterConfig config_;
  std::deque<Held> held_;
  int64_t held_bytes_ = 0;
  absl::flat_hash_set<std::string> held_requests_;
  absl::Status last_error_;  // the store's latest refusal while writes are held
  absl::Status file_error_;  // why output files lag, while they do
  absl::Time next_retry_ = absl::InfinitePast();
  absl::Duration retry_delay_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_BATCH_JOB_STORE_WRITER_H_
