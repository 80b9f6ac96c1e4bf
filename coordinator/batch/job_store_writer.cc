#include "coordinator/batch/job_store_writer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace deepinfer {
namespace {

bool IsFinal(Job::State s) {
  return s == Job::COMPLETED || s == Job::FAILED || s == Job::CANCELLED;
}

}  // namespace

JobStoreWriter::JobStoreWriter(BatchJobStore* store, JobStoreWriterConfig config)
    : store_(store), config_(std::move(config)), retry_delay_(config_.first_retry) {}

JobStoreWriter::~JobStoreWriter() {
  if (const int64_t held = held_results(); held > 0) {
    LOG(WARNING) << held << " result(s) were never stored; their requests run again at the "
                 << "next start";
  }
}

absl::Status JobStoreWriter::RoomForResults() const {
  if (held_bytes_ < config_.max_held_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the coordinator cannot store results now and holds as many as it may in memory (",
      last_error_.message(), "); send them again later"));
}

std::optional<JobStoreWriter::Written> JobStoreWriter::WriteResults(Batch batch, absl::Time now) {
  if (holding()) {
    Hold({std::move(batch), std::nullopt}, absl::OkStatus(), now);
    return std::nullopt;
  }
  absl::StatusOr<std::vector<bool>> recorded = store_->RecordResults(batch.results);
  if (!recorded.ok()) {
    Hold({std::move(batch), std::nullopt}, recorded.status(), now);
    return std::nullopt;
  }
  return Written{std::move(batch), std::move(*recorded)};
}

void JobStoreWriter::SetJobState(const std::string& job_id, Job::State state,
                                 const std::string& error, absl::Time now) {
  StateChange change{job_id, state, error, absl::ToUnixMillis(now)};
  if (holding()) {
    Hold({{}, std::move(change)}, absl::OkStatus(), now);
    return;
  }
  absl::Status s = store_->SetJobState(job_id, state, error, change.now_unix_ms);
  if (absl::IsNotFound(s)) {
    LOG(ERROR) << "job " << job_id << ": " << s;  // nothing to retry
  } else if (!s.ok()) {
    Hold({{}, std::move(change)}, s, now);
  }
}

void JobStoreWriter::Hold(Held write, const absl::Status& error, absl::Time now) {
  if (!error.ok()) {
    LOG(ERROR) << "cannot store "
               << (write.state.has_value() ? absl::StrCat("the state of job ", write.state->job_id)
                                           : absl::StrCat(write.batch.results.size(), " result(s)"))
               << ": " << error.message() << "; keeping them in memory and retrying";
    last_error_ = error;
    retry_delay_ = config_.first_retry;
    next_retry_ = now + retry_delay_;
  }
  Count(write, 1);
  held_.push_back(std::move(write));
}

void JobStoreWriter::Count(const Held& write, int sign) {
  for (const BatchJobStore::Result& r : write.batch.results) {
    held_bytes_ += sign * static_cast<int64_t>(r.output_line.size());
  }
  for (const std::string& id : write.batch.request_ids) {
    if (sign > 0) {
      held_requests_.insert(id);
    } else {
      held_requests_.erase(id);
    }
  }
}

std::vector<JobStoreWriter::Written> JobStoreWriter::Retry(absl::Time now) {
  std::vector<Written> written;
  if (now < next_retry_) return written;
  const bool was_holding = holding();
  if (!was_holding && !store_->OutputFilesBehind()) return written;
  absl::Status failed;
  int64_t stored = 0;
  while (!held_.empty() && failed.ok()) {
    Held& write = held_.front();
    Count(write, -1);
    if (write.state.has_value()) {
      const StateChange& c = *write.state;
      failed = store_->SetJobState(c.job_id, c.state, c.error, c.now_unix_ms);
      if (absl::IsNotFound(failed)) {
        LOG(ERROR) << "job " << c.job_id << ": " << failed;
        failed = absl::OkStatus();
      }
    } else {
      absl::StatusOr<std::vector<bool>> recorded = store_->RecordResults(write.batch.results);
      failed = recorded.status();
      if (recorded.ok()) {
        stored += static_cast<int64_t>(write.batch.results.size());
        written.push_back({std::move(write.batch), std::move(*recorded)});
      }
    }
    if (!failed.ok()) {
      Count(write, 1);
      break;
    }
    held_.pop_front();
  }
  if (failed.ok() && was_holding) {
    LOG(INFO) << "stored " << stored << " held result(s): the state directory takes writes again";
    last_error_ = absl::OkStatus();
  }
  if (failed.ok() && store_->OutputFilesBehind())
    failed = file_error_ = store_->CatchUpOutputFiles();
  if (failed.ok()) {
    file_error_ = absl::OkStatus();
    retry_delay_ = config_.first_retry;
    next_retry_ = absl::InfinitePast();
    return written;
  }
  if (holding()) {
    if (failed.message() != last_error_.message()) LOG(ERROR) << "store: " << failed.message();
    last_error_ = failed;
  }
  retry_delay_ = std::min(retry_delay_ * 2, config_.max_retry);
  next_retry_ = now + retry_delay_;
  return written;
}

void JobStoreWriter::DropJob(const std::string& job_id) {
  // Request ids are "<job id>:<line>[/<choice>]".
  const std::string prefix = absl::StrCat(job_id, ":");
  for (auto it = held_.begin(); it != held_.end();) {
    Count(*it, -1);
    if (it->state.has_value() && it->state->job_id == job_id) it->state.reset();
    std::vector<BatchJobStore::Result>& results = it->batch.results;
    results.erase(
        std::remove_if(results.begin(), results.end(),
                       [&](const BatchJobStore::Result& r) { return r.job_id == job_id; }),
        results.end());
    std::vector<std::string>& ids = it->batch.request_ids;
    ids.erase(std::remove_if(ids.begin(), ids.end(),
                             [&](const std::string& id) { return absl::StartsWith(id, prefix); }),
              ids.end());
    Count(*it, 1);
    it = it->state.has_value() || !results.empty() ? std::next(it) : held_.erase(it);
  }
  if (!holding()) last_error_ = absl::OkStatus();
}

std::string JobStoreWriter::stalled_reason() const {
  if (!holding()) return "";
  return absl::StrCat("writes to the state directory fail (", last_error_.message(),
                      "); results are kept in memory and retried, and the job goes on by itself "
                      "once there is room");
}

std::string JobStoreWriter::storage_error() const {
  std::vector<std::string> parts;
  if (holding()) {
    parts.push_back(absl::StrCat(held_results(), " result(s) held in memory (", held_bytes_ >> 10,
                                 " KiB",
                                 held_bytes_ >= config_.max_held_bytes ? ", at the limit" : "",
                                 "): ", last_error_.message()));
  }
  if (!file_error_.ok()) {
    parts.push_back(absl::StrCat("output files lag the database: ", file_error_.message()));
  }
  return absl::StrJoin(parts, "; ");
}

void JobStoreWriter::ApplyHeldState(Job* job) const {
  for (const Held& write : held_) {
    if (!write.state.has_value() || write.state->job_id != job->job_id()) continue;
    job->set_state(write.state->state);
    job->set_error(write.state->error);
    job->set_finished_unix_ms(IsFinal(write.state->state) ? write.state->now_unix_ms : 0);
  }
}

int64_t JobStoreWriter::held_results() const {
  int64_t n = 0;
  for (const Held& write : held_) n += static_cast<int64_t>(write.batch.results.size());
  return n;
}

}  // namespace deepinfer
