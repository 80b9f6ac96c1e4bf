// JobManager: jobs' way from validation into the queue (lines, choices), dispatch, results,
// group formation and EPLB placement changes. Over 800 lines because these share the scheduler
// state behind one mutex (requests, assignments, the group); group formation is the part to move
// out first.
#include "coordinator/job_manager.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/eplb/expert_parallel_group.h"
#include "common/eplb/placement_proto.h"
#include "coordinator/batch/batch_output.h"
#include "glog/logging.h"

namespace deepinfer {
namespace {

// Items per SubmitRequests call and prompt tokens per call, to stay far below gRPC's
// default 4 MB message limit.
constexpr size_t kMaxItemsPerCall = 128;
constexpr int64_t kMaxTokensPerCall = 200000;

std::string MembersKey(const std::vector<std::string>& parts) { return absl::StrJoin(parts, ","); }

// The wall clock in unix seconds, for log lines that tools line up across processes
// (tools/bench/e2e_job.py).
std::string UnixNow() { return absl::StrFormat("%.3f", absl::ToUnixMicros(absl::Now()) / 1e6); }

}  // namespace

JobManager::JobManager(BatchJobStore* store, const PromptBuilder* prompts, WorkerRegistry* registry,
                       WorkerChannel* workers, const Clock* clock, JobManagerConfig config)
    : store_(store),
      prompts_(prompts),
      registry_(registry),
      workers_(workers),
      clock_(clock),
      config_(std::move(config)),
      writer_(store, config_.store_writes),
      router_(config_.prefix_routing) {
  JobValidator::Callbacks callbacks;
  callbacks.on_progress = [this](const std::string&) {
    absl::MutexLock lock(&mu_);
    BumpLocked();
  };
  callbacks.on_stalled = [this](const std::string& job_id, const std::string& reason) {
    absl::MutexLock lock(&mu_);
    validation_stalled_ = reason;
    BumpLocked();
  };
  callbacks.on_done = [this](const std::string& job_id, const absl::Status& status) {
    OnValidationDone(job_id, status);
  };
  callbacks.cancelled = [this](const std::string& job_id) { return ValidationCancelled(job_id); };
  validator_ = std::make_unique<JobValidator>(store_, prompts_, config_.validation, callbacks);
}

JobManager::~JobManager() {
  validator_.reset();  // its callbacks use the rest
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  std::vector<PlacementChange> changes;
  {
    absl::MutexLock lock(&mu_);
    changes.swap(placement_changes_);
  }
  for (PlacementChange& c : changes) c.done(absl::CancelledError("the coordinator is stopping"));
}

int64_t JobManager::NowMs() const { return absl::ToUnixMillis(clock_->Now()); }

void JobManager::BumpLocked() { ++version_; }

void JobManager::SetGroupErrorLocked(std::string error) {
  if (group_error_current_ && error == last_group_error_) return;
  last_group_error_ = std::move(error);
  group_error_current_ = true;
  BumpLocked();
}

absl::Status JobManager::Start() {
  absl::StatusOr<std::vector<Job>> unfinished = store_->UnfinishedJobs();
  if (!unfinished.ok()) return unfinished.status();
  for (const Job& job : *unfinished) {
    if (job.state() == Job::VALIDATING) {
      StartValidating(job.job_id());
      continue;
    }
    absl::Status resumed = ActivateJob(job.job_id());
    if (resumed.ok()) continue;
    // This job is given up; the others still run.
    const std::string reason =
        absl::StrCat("cannot resume the job after a coordinator restart: ", resumed.message());
    LOG(ERROR) << "job " << job.job_id() << ": " << reason;
    absl::MutexLock lock(&mu_);
    writer_.SetJobState(job.job_id(), Job::FAILED, reason, clock_->Now());
  }
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void JobManager::StartValidating(const std::string& job_id) {
  {
    absl::MutexLock lock(&mu_);
    JobRuntime& job = jobs_[job_id];
    job.validating = true;
    job_order_.push_back(job_id);
    BumpLocked();
  }
  validator_->Enqueue(job_id);
}

absl::StatusOr<BatchJobStore::CreatedJob> JobManager::SubmitStaged(
    const std::string& name, const std::string& idempotency_key, const StagedInput& staged) {
  absl::StatusOr<BatchJobStore::CreatedJob> created =
      store_->CreateJob(name, idempotency_key, staged, NowMs());
  if (!created.ok()) return created.status();
  if (created->existing) {
    LOG(INFO) << "job " << created->job_id << " submitted again (idempotency key)";
    return created;
  }
  LOG(INFO) << "job " << created->job_id << " submitted"
            << (name.empty() ? "" : " as '" + name + "'") << ": " << staged.request_lines
            << " request lines, " << staged.bytes << " bytes";
  StartValidating(created->job_id);
  return created;
}

absl::StatusOr<std::string> JobManager::Submit(const std::string& name,
                                               const std::string& input_jsonl) {
  absl::StatusOr<std::string> job_id = store_->CreateJob(name, input_jsonl, NowMs());
  if (!job_id.ok()) return job_id.status();
  LOG(INFO) << "job " << *job_id << " submitted" << (name.empty() ? "" : " as '" + name + "'");
  StartValidating(*job_id);
  return job_id;
}

bool JobManager::ValidationCancelled(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  return job == jobs_.end() || job->second.cancelled;
}

void JobManager::OnValidationDone(const std::string& job_id, const absl::Status& status) {
  absl::Status activated = status;
  if (status.ok()) activated = ActivateJob(job_id);
  if (activated.ok()) return;
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end() || job->second.cancelled) return;
  jobs_.erase(job);
  const std::string reason = absl::StrCat("cannot validate the job's input: ", activated.message());
  LOG(ERROR) << "job " << job_id << ": " << reason;
  writer_.SetJobState(job_id, Job::FAILED, reason, clock_->Now());
  BumpLocked();
}

absl::Status JobManager::ActivateJob(const std::string& job_id) {
  absl::StatusOr<Job> stored = store_->GetJob(job_id);
  if (!stored.ok()) return stored.status();
  absl::StatusOr<int64_t> reserved = store_->ReservedTokensLeft(job_id);
  if (!reserved.ok()) return reserved.status();
  absl::MutexLock lock(&mu_);
  auto [it, fresh] = jobs_.try_emplace(job_id);
  if (fresh) {
    job_order_.push_back(job_id);
  } else if (it->second.cancelled) {
    return absl::OkStatus();
  }
  JobRuntime& job = it->second;
  job.validating = false;
  job.remaining =
      stored->total_requests() - stored->completed_requests() - stored->failed_requests();
  job.max_tokens_left = *reserved;
  job.started = stored->state() == Job::RUNNING;
  BumpLocked();
  if (job.remaining > 0) {
    LOG(INFO) << "job " << job_id << ": " << job.remaining << " of " << stored->total_requests()
              << " requests queued";
    return absl::OkStatus();
  }
  // Every line has its result (error lines, or a resumed job that was about to finish).
  jobs_.erase(it);
  writer_.SetJobState(job_id, Job::COMPLETED, "", clock_->Now());
  LOG(INFO) << "job " << job_id << " completed at unix " << UnixNow();
  return absl::OkStatus();
}

absl::Status JobManager::AddRequestsLocked(const std::string& job_id, int64_t line_number,
                                           const std::string& stored, bool queue,
                                           int32_t only_choice) {
  ValidatedRequest request;
  if (!request.ParseFromString(stored) || request.n() < 1) {
    return absl::InternalError(
        absl::StrCat("the stored request of line ", line_number, " cannot be read"));
  }
  QueuedRequest q;
  q.job_id = job_id;
  q.line_number = line_number;
  q.line_request_id = absl::StrCat(job_id, ":", line_number);
  q.prompt.assign(request.prompt_token_ids().begin(), request.prompt_token_ids().end());
  q.line.custom_id = request.custom_id();
  q.line.endpoint = request.chat() ? BatchEndpoint::kChatCompletions : BatchEndpoint::kCompletions;
  q.line.model = request.model();
  q.line.n = request.n();
  q.line.sampling = std::move(*request.mutable_sampling());
  const int64_t max_tokens =
      q.line.sampling.max_tokens() > 0
          ? q.line.sampling.max_tokens()
          : prompts_->limits().max_context - static_cast<int64_t>(q.prompt.size());
  q.cost = static_cast<int64_t>(q.prompt.size()) + max_tokens;
  if (q.line.n == 1) {
    if (requests_.contains(q.line_request_id)) return absl::OkStatus();
    if (queue) queue_.push_back(q.line_request_id);
    requests_.emplace(q.line_request_id, std::move(q));
    return absl::OkStatus();
  }
  // n choices: one request each ("<job>:<line>/<choice>"), with its own seed; the line's
  // result is written once all of them are in (OnResults).
  auto finished = choice_results_.find(q.line_request_id);
  for (int32_t c = 0; c < q.line.n; ++c) {
    if (only_choice >= 0 && c != only_choice) continue;
    const std::string id = absl::StrCat(q.line_request_id, "/", c);
    if (requests_.contains(id)) continue;
    if (finished != choice_results_.end() &&
        static_cast<size_t>(c) < finished->second.results.size() &&
        finished->second.results[c].has_value()) {
      continue;
    }
    QueuedRequest choice = q;
    choice.choice = c;
    choice.line.sampling.set_seed(ChoiceSeed(q.line.sampling.seed(), c));
    if (queue) queue_.push_back(id);
    requests_.emplace(id, std::move(choice));
  }
  return absl::OkStatus();
}

bool JobManager::Refill() {
  std::string job_id;
  int64_t after_line = 0;
  int64_t want = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!group_.serving) return false;
    const int64_t target = std::max<int64_t>(
        config_.queued_in_memory, int64_t{group_.world_size} * config_.max_inflight_per_rank);
    const int64_t queued = static_cast<int64_t>(queue_.size());
    if (queued >= target / 2) return false;
    want = target - queued;
    while (!job_order_.empty() && !jobs_.contains(job_order_.front())) job_order_.pop_front();
    for (const std::string& id : job_order_) {
      auto job = jobs_.find(id);
      if (job == jobs_.end() || job->second.validating || job->second.cancelled ||
          job->second.all_read) {
        continue;
      }
      job_id = id;
      after_line = job->second.read_through_line;
      break;
    }
    if (job_id.empty()) return false;
  }
  absl::StatusOr<std::vector<PendingRequest>> pending =
      store_->ReadPendingRequests(job_id, after_line, want);
  if (!pending.ok()) {
    LOG_EVERY_N(ERROR, 100) << "job " << job_id
                            << ": cannot read queued requests: " << pending.status();
    return false;
  }
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end() || job->second.cancelled || job->second.read_through_line != after_line) {
    return false;
  }
  std::vector<BatchJobStore::Result> unreadable;
  for (const PendingRequest& p : *pending) {
    absl::Status added = AddRequestsLocked(job_id, p.line_number, p.request, /*queue=*/true, -1);
    if (!added.ok()) {
      unreadable.push_back({job_id, p.line_number,
                            FormatErrorLine("", absl::StrCat(job_id, ":", p.line_number),
                                            kInternalError, std::string(added.message())),
                            /*failed=*/true});
    }
  }
  job->second.read_through_line = pending->empty() ? after_line : pending->back().line_number;
  if (static_cast<int64_t>(pending->size()) < want) job->second.all_read = true;
  if (!unreadable.empty()) FinishRequestsLocked(std::move(unreadable), {});
  return !pending->empty();
}

bool JobManager::LoadRequestForResultLocked(const std::string& request_id) {
  // "<job id>:<line>" or "<job id>:<line>/<choice>".
  const size_t colon = request_id.rfind(':');
  if (colon == std::string::npos) return false;
  const std::string job_id = request_id.substr(0, colon);
  absl::string_view rest = absl::string_view(request_id).substr(colon + 1);
  int32_t choice = -1;
  if (size_t slash = rest.find('/'); slash != absl::string_view::npos) {
    if (!absl::SimpleAtoi(rest.substr(slash + 1), &choice) || choice < 0) return false;
    rest = rest.substr(0, slash);
  }
  int64_t line_number = 0;
  if (!absl::SimpleAtoi(rest, &line_number)) return false;
  auto job = jobs_.find(job_id);
  // A line read before and not in memory any more has its result.
  if (job == jobs_.end() || job->second.validating || job->second.cancelled ||
      job->second.all_read || line_number <= job->second.read_through_line) {
    return false;
  }
  absl::StatusOr<std::optional<std::string>> stored =
      store_->ReadPendingRequest(job_id, line_number);
  if (!stored.ok() || !stored->has_value()) return false;
  if (!AddRequestsLocked(job_id, line_number, **stored, /*queue=*/false, std::max(choice, 0))
           .ok()) {
    return false;
  }
  return requests_.contains(request_id);
}

size_t JobManager::requests_in_memory() const {
  absl::MutexLock lock(&mu_);
  return requests_.size();
}

void JobManager::FinishRequestsLocked(std::vector<BatchJobStore::Result> results,
                                      const std::vector<std::string>& request_ids) {
  if (auto written = writer_.WriteResults({std::move(results), request_ids}, clock_->Now())) {
    return ApplyWrittenLocked(*written);
  }
  for (const std::string& id : request_ids) inflight_.erase(id);  // held: done, not finished
  BumpLocked();
}

void JobManager::ApplyWrittenLocked(const JobStoreWriter::Written& written) {
  for (const std::string& id : written.batch.request_ids) DropRequestLocked(id);
  absl::flat_hash_set<std::string> touched;
  for (size_t i = 0; i < written.recorded.size(); ++i) {
    auto job = jobs_.find(written.batch.results[i].job_id);
    if (!written.recorded[i] || job == jobs_.end() || job->second.validating) continue;
    --job->second.remaining;
    touched.insert(job->first);
  }
  for (const std::string& job_id : touched) {
    auto job = jobs_.find(job_id);
    if (job->second.remaining > 0 || job->second.cancelled || job->second.validating) continue;
    jobs_.erase(job);
    writer_.SetJobState(job_id, Job::COMPLETED, "", clock_->Now());
    LOG(INFO) << "job " << job_id << " completed at unix " << UnixNow();
  }
  BumpLocked();
}

absl::StatusOr<Job> JobManager::GetJob(const std::string& job_id) const {
  // Under the lock, so that a request is counted either finished or running, never both.
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Job> job = store_->GetJob(job_id);
  if (job.ok()) AddLiveStateLocked(&*job);
  return job;
}

absl::StatusOr<std::vector<Job>> JobManager::ListJobs(int page_size,
                                                      const std::string& page_token) const {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::vector<Job>> jobs = store_->ListJobs(page_size, page_token);
  if (jobs.ok()) {
    for (Job& job : *jobs) AddLiveStateLocked(&job);
  }
  return jobs;
}

void JobManager::CountPrefixStatsLocked(const QueuedRequest& q, const RequestResult& r) {
  auto [it, fresh] = prefix_stats_.try_emplace(q.job_id);
  if (fresh) {
    prefix_stats_order_.push_back(q.job_id);
    constexpr size_t kJobsKept = 4096;
    if (prefix_stats_order_.size() > kJobsKept) {
      prefix_stats_.erase(prefix_stats_order_.front());
      prefix_stats_order_.pop_front();
    }
  }
  JobPrefixStats& s = it->second;
  s.prompt_tokens += r.prompt_tokens();
  s.cached_prompt_tokens += r.cached_prompt_tokens();
  auto a = inflight_.find(r.request_id());
  if (a == inflight_.end()) return;
  const int rank = a->second.rank;
  const size_t ranks = std::max<size_t>(rank + 1, group_.world_size);
  if (s.rank_tokens.size() < ranks) s.rank_tokens.resize(ranks, 0);
  s.rank_tokens[rank] += r.prompt_tokens() + r.token_ids_size();
}

void JobManager::AddLiveStateLocked(Job* job) const {
  writer_.ApplyHeldState(job);
  if (auto s = prefix_stats_.find(job->job_id()); s != prefix_stats_.end()) {
    job->set_prompt_tokens(s->second.prompt_tokens);
    job->set_cached_prompt_tokens(s->second.cached_prompt_tokens);
    job->mutable_rank_tokens()->Assign(s->second.rank_tokens.begin(), s->second.rank_tokens.end());
  }
  auto runtime = jobs_.find(job->job_id());
  if (runtime == jobs_.end()) return;  // final (or not loaded)
  int64_t running = 0;
  int64_t tokens = 0;
  for (const auto& [id, a] : inflight_) {
    auto request = requests_.find(id);
    if (request == requests_.end() || request->second.job_id != job->job_id()) continue;
    ++running;
    tokens += a.generated;
  }
  job->set_running_requests(running);
  job->set_running_generated_tokens(tokens);
  job->set_unfinished_max_tokens(runtime->second.max_tokens_left);
  std::string stalled = writer_.stalled_reason();
  if (stalled.empty() && runtime->second.validating) stalled = validation_stalled_;
  job->set_stalled_reason(stalled);
  std::vector<std::string> notices;
  if (!left_out_notice_.empty()) notices.push_back(left_out_notice_);
  if (group_error_current_ && !group_.serving) {
    notices.push_back(absl::StrCat("no expert-parallel group serving: ", last_group_error_));
  }
  job->set_cluster_notice(absl::StrJoin(notices, "; "));
}

absl::StatusOr<Job> JobManager::Cancel(const std::string& job_id) {
  absl::StatusOr<Job> job = store_->GetJob(job_id);
  if (!job.ok()) return job.status();
  absl::flat_hash_map<std::string, CancelRequestsRequest> cancels;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return job;  // already final
    // First, so that nothing changes when there is no room for it.
    absl::Status recorded = store_->SetJobState(job_id, Job::CANCELLED, "", NowMs());
    if (!recorded.ok()) return recorded;
    writer_.DropJob(job_id);
    it->second.cancelled = true;
    std::vector<std::string> ids;
    for (const auto& [id, q] : requests_) {
      if (q.job_id == job_id) ids.push_back(id);
    }
    absl::flat_hash_map<std::string, std::string> address_of;
    for (const Member& m : group_.members) address_of[m.worker_id] = m.address;
    for (const std::string& id : ids) {
      if (auto a = inflight_.find(id); a != inflight_.end()) {
        if (auto addr = address_of.find(a->second.worker_id); addr != address_of.end()) {
          cancels[addr->second].add_request_ids(id);
        }
        inflight_.erase(a);
      }
      requests_.erase(id);
    }
    for (auto c = choice_results_.begin(); c != choice_results_.end();) {
      // Keys are "<job id>:<line>".
      auto next = std::next(c);
      if (absl::StartsWith(c->first, absl::StrCat(job_id, ":"))) choice_results_.erase(c);
      c = next;
    }
    jobs_.erase(it);
    BumpLocked();
  }
  for (auto& [address, request] : cancels) {
    request.set_coordinator_incarnation(registry_->coordinator_incarnation());
    if (absl::Status s = workers_->CancelRequests(address, request); !s.ok()) {
      LOG(WARNING) << "cancel of job " << job_id << ": " << s;
    }
  }
  LOG(INFO) << "job " << job_id << " cancelled";
  return store_->GetJob(job_id);
}

absl::Status JobManager::OnResults(const std::vector<RequestResult>& results) {
  absl::MutexLock lock(&mu_);
  if (absl::Status room = writer_.RoomForResults(); !room.ok()) return room;
  std::vector<BatchJobStore::Result> records;
  std::vector<std::string> ids;
  const int64_t now_s = absl::ToUnixSeconds(clock_->Now());
  auto context_for = [&](const std::string& request_id) {
    OutputContext context;
    context.request_id = request_id;
    context.model = config_.model_name;
    context.created_unix_s = now_s;
    context.token_text = [this](int32_t id) { return prompts_->TokenText(id); };
    return context;
  };
  for (const RequestResult& r : results) {
    auto it = requests_.find(r.request_id());
    // Its result waits for room in the store already.
    if (writer_.holds(r.request_id())) continue;
    if (it == requests_.end()) {
      // Finished already, its job was cancelled, or (after a coordinator restart) not read
      // from the store yet.
      if (!LoadRequestForResultLocked(r.request_id())) continue;
      it = requests_.find(r.request_id());
    }
    const QueuedRequest& q = it->second;
    const bool failed = !r.error_code().empty();
    if (!failed) CountPrefixStatsLocked(q, r);
    if (q.line.n == 1) {
      std::string line = failed ? FormatErrorLine(q.line.custom_id, r.request_id(), r.error_code(),
                                                  r.error_message())
                                : FormatResultLine(q.line, r, context_for(r.request_id()));
      records.push_back({q.job_id, q.line_number, std::move(line), failed, r.token_ids_size()});
      ids.push_back(r.request_id());
      continue;
    }
    // One choice of several: kept until every choice is in; a failed choice fails the line
    // (the other choices' requests are dropped, and their results ignored).
    ChoiceResults& line_results = choice_results_[q.line_request_id];
    line_results.results.resize(q.line.n);
    line_results.results[q.choice] = r;
    int32_t in = 0;
    for (const auto& c : line_results.results) in += c.has_value();
    if (!failed && in < q.line.n) {
      DropRequestLocked(r.request_id());
      continue;
    }
    std::string line;
    int64_t tokens = 0;
    if (failed) {
      line = FormatErrorLine(q.line.custom_id, q.line_request_id, r.error_code(),
                             absl::StrCat("choice ", q.choice, ": ", r.error_message()));
    } else {
      std::vector<const RequestResult*> choices;
      for (const auto& c : line_results.results) {
        choices.push_back(&*c);
        tokens += c->token_ids_size();
      }
      line = FormatResultLine(q.line, choices, context_for(q.line_request_id));
    }
    records.push_back({q.job_id, q.line_number, std::move(line), failed, tokens});
    const std::string line_request_id = q.line_request_id;
    const int32_t n = q.line.n;
    ids.push_back(r.request_id());
    choice_results_.erase(line_request_id);
    // The other choices now, so that a result of theirs later in `results` is ignored.
    for (int32_t c = 0; c < n; ++c) {
      const std::string id = absl::StrCat(line_request_id, "/", c);
      if (id != r.request_id()) DropRequestLocked(id);
    }
  }
  if (!records.empty()) FinishRequestsLocked(std::move(records), ids);
  return absl::OkStatus();
}

void JobManager::DropRequestLocked(const std::string& id) {
  inflight_.erase(id);
  auto request = requests_.find(id);
  if (request == requests_.end()) return;
  auto job = jobs_.find(request->second.job_id);
  if (job != jobs_.end()) {
    job->second.max_tokens_left -=
        request->second.cost - static_cast<int64_t>(request->second.prompt.size());
  }
  requests_.erase(request);
}

void JobManager::OnProgress(const std::string& worker_id, uint64_t generation,
                            const google::protobuf::RepeatedPtrField<RequestProgress>& progress) {
  absl::MutexLock lock(&mu_);
  bool changed = false;
  for (const RequestProgress& p : progress) {
    auto a = inflight_.find(p.request_id());
    if (a == inflight_.end() || a->second.worker_id != worker_id ||
        a->second.generation != generation || a->second.generated == p.generated_tokens()) {
      continue;
    }
    a->second.generated = p.generated_tokens();
    changed = true;
  }
  if (changed) BumpLocked();
}

void JobManager::WaitForChange(uint64_t* version, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  if (*version != 0) {
    auto changed = [this, version]()
                       ABSL_SHARED_LOCKS_REQUIRED(mu_) { return version_ != *version || stop_; };
    mu_.AwaitWithTimeout(absl::Condition(&changed), timeout);
  }
  *version = version_;
}

GroupView JobManager::group() const {
  absl::MutexLock lock(&mu_);
  GroupView view;
  view.generation = group_.generation;
  view.world_size = group_.world_size;
  view.serving = group_.serving;
  for (const Member& m : group_.members) view.members.push_back(m.worker_id);
  view.last_error = last_group_error_;
  view.formation_error = formation_error_;
  return view;
}

void JobManager::RequeueInflightLocked(const char* why) {
  if (inflight_.empty()) return;
  // Back to the front of the queue, in their original order.
  std::vector<std::string> ids;
  for (const auto& [id, a] : inflight_) ids.push_back(id);
  std::sort(ids.begin(), ids.end(), [this](const std::string& a, const std::string& b) {
    const QueuedRequest& qa = requests_.at(a);
    const QueuedRequest& qb = requests_.at(b);
    return std::tie(qa.job_id, qa.line_number) < std::tie(qb.job_id, qb.line_number);
  });
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) queue_.push_front(*it);
  LOG(INFO) << "re-queued " << ids.size() << " request(s) in flight: " << why;
  inflight_.clear();
}

void JobManager::Run() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), config_.tick);
      if (stop_) return;
    }
    Tick();
  }
}

void JobManager::Tick() {
  const std::vector<WorkerSnapshot> snapshot = registry_->Snapshot();
  const absl::Time now = clock_->Now();
  std::vector<Member> eligible;
  std::vector<std::string> eligible_key;
  for (const WorkerSnapshot& w : snapshot) {
    if (w.state != READY) continue;
    eligible.push_back({w.registration.worker_id, w.registration.worker_incarnation,
                        w.registration.listen_address, 0, w.registration.num_ranks});
    eligible_key.push_back(absl::StrCat(w.registration.worker_id, "/",
                                        w.registration.worker_incarnation, "/",
                                        w.registration.num_ranks));
  }
  const size_t ready = eligible.size();
  // Workers whose ranks would not split the routed experts stay READY as spares and join
  // when the membership changes again.
  std::vector<int64_t> ranks;
  int64_t all_ranks = 0;
  for (const Member& m : eligible) {
    ranks.push_back(m.num_ranks);
    all_ranks += m.num_ranks;
  }
  const ExpertParallelSelection selection =
      SelectExpertParallelMembers(prompts_->limits().routed_experts, ranks);
  std::vector<std::string> left_out;
  for (size_t i = selection.members; i < eligible.size(); ++i) {
    left_out.push_back(eligible[i].worker_id);
  }
  eligible.resize(selection.members);
  eligible_key.clear();
  for (const Member& m : eligible) {
    eligible_key.push_back(absl::StrCat(m.worker_id, "/", m.incarnation, "/", m.num_ranks));
  }
  bool form = false;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    for (const JobStoreWriter::Written& w : writer_.Retry(now)) ApplyWrittenLocked(w);
    // What the current group's ranks cache, for routing.
    for (const WorkerSnapshot& w : snapshot) {
      if (group_.generation == 0 || w.report.group_generation != group_.generation) continue;
      for (const RankLoad& load : w.report.rank_loads) router_.UpdateRank(load);
    }
    std::string left_out_notice;
    if (ready > 0 && eligible.empty()) {
      SetGroupErrorLocked(absl::StrCat("the ", ready, " READY worker(s) cannot form one: ",
                                       selection.left_out_because.message()));
      formation_error_ = last_group_error_;
    } else if (!left_out.empty()) {
      left_out_notice = absl::StrCat("worker(s) ", absl::StrJoin(left_out, ", "),
                                     " left out of the expert-parallel group, which uses ",
                                     selection.world_size, " of the ", all_ranks,
                                     " READY ranks: ", selection.left_out_because.message());
    }
    if (left_out_notice != left_out_notice_) {
      if (!left_out_notice.empty()) LOG(WARNING) << left_out_notice;
      left_out_notice_ = std::move(left_out_notice);
      BumpLocked();
    }
    // Is the current group still whole?
    if (group_.generation != 0) {
      // A member that is gone explains the break by itself, and the next group leaves it
      // out at once; only a failure report with every member still there waits for the
      // regroup delay (a dead peer that is not LOST yet).
      std::string gone, failed;
      bool all_serving = true;
      for (const Member& m : group_.members) {
        auto w = std::find_if(snapshot.begin(), snapshot.end(), [&](const WorkerSnapshot& s) {
          return s.registration.worker_id == m.worker_id;
        });
        if (w == snapshot.end() || w->registration.worker_incarnation != m.incarnation) {
          gone = absl::StrCat("worker ", m.worker_id, " restarted or left");
        } else if (w->state == LOST || w->state == LEFT) {
          gone = absl::StrCat("worker ", m.worker_id, " is ", WorkerStateName(w->state));
        } else if (w->report.group_generation == group_.generation &&
                   w->report.group_status == GROUP_FAILED) {
          if (failed.empty()) {
            failed = absl::StrCat("worker ", m.worker_id,
                                  " reports the group failed: ", w->report.group_error);
          }
        } else {
          all_serving = all_serving && w->report.group_generation == group_.generation &&
                        w->report.group_status == GROUP_SERVING;
        }
        if (!gone.empty()) break;
      }
      const std::string broken = !gone.empty() ? gone : failed;
      if (!broken.empty()) {
        LOG(WARNING) << "group generation " << group_.generation << " broken: " << broken;
        SetGroupErrorLocked(broken);
        // A member's failure report while the group forms is why forming failed.
        if (gone.empty() && !group_.serving) formation_error_ = broken;
        RequeueInflightLocked("the group broke");
        group_ = Group();
        if (gone.empty()) retry_after_ = std::max(retry_after_, now + config_.regroup_delay);
        BumpLocked();
      } else if (!group_.serving && all_serving) {
        group_.serving = true;
        group_error_current_ = false;
        formation_error_.clear();
        LOG(INFO) << "group generation " << group_.generation << " serving: " << group_.world_size
                  << " rank(s) on " << group_.members.size() << " worker(s)";
        BumpLocked();
      }
    }
    // Should the group change?
    const std::string key = MembersKey(eligible_key);
    if (key != seen_members_key_) {
      seen_members_key_ = key;
      seen_since_ = now;
    }
    std::vector<std::string> current_key;
    for (const Member& m : group_.members) {
      current_key.push_back(absl::StrCat(m.worker_id, "/", m.incarnation, "/", m.num_ranks));
    }
    const bool enough = static_cast<int>(ready) >= config_.min_workers ||
                        (next_generation_ > 1 && !eligible.empty());
    form = enough && key != MembersKey(current_key) && now - seen_since_ >= config_.settle &&
           now >= retry_after_;
  }
  if (form) FormGroup(std::move(eligible));
  ChangePlacements();
  for (int i = 0; i < 8 && Refill(); ++i) {
  }
  Dispatch();
}

void JobManager::ApplyPlacement(std::shared_ptr<const ExpertPlacement> placement,
                                uint64_t generation,
                                std::function<void(absl::StatusOr<uint64_t>)> done) {
  absl::MutexLock lock(&mu_);
  placement_changes_.push_back({std::move(placement), generation, std::move(done)});
}

absl::StatusOr<uint64_t> JobManager::SendPlacement(std::shared_ptr<const ExpertPlacement> placement,
                                                   uint64_t generation) {
  std::vector<Member> members;
  {
    absl::MutexLock lock(&mu_);
    if (group_.generation != generation || !group_.serving) {
      return absl::FailedPreconditionError(
          absl::StrCat("group generation ", generation, " is not serving any more (now generation ",
                       group_.generation, group_.serving ? ", serving)" : ", not serving)"));
    }
    members = group_.members;
  }
  const uint64_t epoch = balancer_->Commit(placement);
  SetExpertPlacementRequest request;
  request.set_coordinator_incarnation(registry_->coordinator_incarnation());
  request.set_generation(generation);
  *request.mutable_placement() = PlacementToProto(*placement, epoch);
  for (const Member& m : members) {
    if (absl::Status st = workers_->SetExpertPlacement(m.address, request); !st.ok()) {
      return absl::UnavailableError(absl::StrCat("worker ", m.worker_id,
                                                 " did not take expert placement epoch ", epoch,
                                                 ": ", st.message()));
    }
  }
  LOG(INFO) << "expert placement epoch " << epoch << " sent to the " << members.size()
            << " worker(s) of group generation " << generation;
  return epoch;
}

void JobManager::ChangePlacements() {
  if (balancer_ == nullptr) return;
  std::vector<PlacementChange> changes;
  uint64_t generation = 0;
  int world_size = 0;
  int num_nodes = 0;
  {
    absl::MutexLock lock(&mu_);
    changes.swap(placement_changes_);
    if (group_.serving) {
      generation = group_.generation;
      world_size = group_.world_size;
      num_nodes = static_cast<int>(group_.members.size());
    }
  }
  for (PlacementChange& c : changes) c.done(SendPlacement(c.placement, c.generation));
  if (generation == 0 || world_size <= 1 || !balancer_->AutoRebalanceDue()) return;
  absl::StatusOr<ExpertBalancer::Plan> plan =
      balancer_->PlanFor(balancer_->config().auto_policy, world_size, num_nodes);
  if (!plan.ok()) {
    LOG_EVERY_N(WARNING, 20) << "automatic rebalance: " << plan.status();
    balancer_->MarkChecked();
    return;
  }
  if (plan->imbalance_before <= balancer_->config().balance_threshold) {
    VLOG(1) << "automatic rebalance skipped: max/mean " << plan->imbalance_before
            << " is within the threshold " << balancer_->config().balance_threshold;
    balancer_->MarkChecked();
    return;
  }
  LOG(INFO) << "automatic rebalance: max/mean tokens per GPU " << plan->imbalance_before << " -> "
            << plan->imbalance_after << "\n"
            << plan->report;
  absl::StatusOr<uint64_t> epoch = SendPlacement(plan->placement, generation);
  if (!epoch.ok()) LOG(WARNING) << "automatic rebalance: " << epoch.status();
}

void JobManager::FormGroup(std::vector<Member> members) {
  PrepareGroupRequest prepare;
  ConfigureGroupRequest configure;
  {
    absl::MutexLock lock(&mu_);
    int rank = 0;
    for (Member& m : members) {
      m.first_rank = rank;
      rank += m.num_ranks;
    }
    RequeueInflightLocked("a new group is forming");
    // Whatever kept the old group from serving is history now; forming can fail anew.
    group_error_current_ = false;
    group_ = Group();
    group_.generation = next_generation_++;
    group_.members = members;
    group_.world_size = rank;
    router_.Reset(rank);
    prepare.set_coordinator_incarnation(registry_->coordinator_incarnation());
    prepare.set_generation(group_.generation);
    configure.set_coordinator_incarnation(registry_->coordinator_incarnation());
    configure.set_generation(group_.generation);
    configure.set_group_incarnation(absl::Uniform<uint64_t>(absl::BitGen()) | 1);
    configure.set_world_size(rank);
    if (balancer_ != nullptr) *configure.mutable_placement() = balancer_->SpecForGroup(rank);
    BumpLocked();
  }
  LOG(INFO) << "forming group generation " << prepare.generation() << ": " << configure.world_size()
            << " rank(s) on " << members.size() << " worker(s)";
  absl::Status status;
  absl::StatusOr<std::string> root = workers_->PrepareGroup(members[0].address, prepare);
  if (!root.ok()) {
    status = root.status();
  } else {
    configure.set_root_address(*root);
    for (const Member& m : members) {
      configure.set_first_rank(m.first_rank);
      status = workers_->ConfigureGroup(m.address, configure);
      if (!status.ok()) break;
    }
  }
  if (!status.ok()) {
    LOG(WARNING) << "forming group generation " << prepare.generation() << " failed: " << status;
    absl::MutexLock lock(&mu_);
    if (group_.generation == prepare.generation()) {
      SetGroupErrorLocked(std::string(status.message()));
      formation_error_ = last_group_error_;
      group_ = Group();
      retry_after_ = clock_->Now() + config_.retry;
      BumpLocked();
    }
  }
}

void JobManager::Dispatch() {
  struct Call {
    std::string address;
    SubmitRequestsRequest request;
  };
  std::vector<Call> calls;
  uint64_t generation = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!group_.serving || queue_.empty() || writer_.holding()) return;
    generation = group_.generation;
    const int world = group_.world_size;
    std::vector<int64_t> tokens(world, 0);
    std::vector<int> count(world, 0);
    for (const auto& [id, a] : inflight_) {
      if (a.rank < world) {
        tokens[a.rank] += a.load;
        ++count[a.rank];
      }
    }
    std::vector<const Member*> owner(world);
    for (const Member& m : group_.members) {
      for (int r = 0; r < m.num_ranks; ++r) owner[m.first_rank + r] = &m;
    }
    absl::flat_hash_map<const Member*, size_t> open_call;  // member -> index in calls
    std::vector<int64_t> call_tokens;
    // Leaders whose prefill is done (a token generated, or no longer running) lead no more.
    for (const std::string& leader : router_.leaders()) {
      auto a = inflight_.find(leader);
      if (a == inflight_.end() || a->second.generated > 0) router_.EndLead(leader);
    }
    std::deque<std::string> waiting_for_leader;  // back to the front of the queue afterwards
    std::vector<bool> open(world);
    while (!queue_.empty()) {
      const std::string id = queue_.front();
      auto it = requests_.find(id);
      if (it == requests_.end() || inflight_.contains(id)) {
        queue_.pop_front();
        continue;
      }
      for (int r = 0; r < world; ++r) open[r] = count[r] < config_.max_inflight_per_rank;
      if (std::find(open.begin(), open.end(), true) == open.end()) break;  // every rank is full
      QueuedRequest& q = it->second;
      if (q.probes_root != router_.root()) {
        q.probes = router_.Probes(q.prompt);
        q.probes_root = router_.root();
      }
      queue_.pop_front();
      if (router_.LeaderOf(q.probes) != nullptr) {
        waiting_for_leader.push_back(id);
        continue;
      }
      const int best = router_.Pick(q.probes, tokens, open);
      const int32_t held = router_.MatchedBlocks(best, q.probes);
      // What the rank must compute of the prefix, others sharing it wait for.
      router_.Lead(id, q.probes, held);
      router_.Record(best, q.probes);
      const int64_t load =
          q.cost - std::min<int64_t>(int64_t{held} * config_.prefix_routing.block_size,
                                     static_cast<int64_t>(q.prompt.size()));
      tokens[best] += load;
      ++count[best];
      const Member* m = owner[best];
      inflight_[id] = {m->worker_id, best, generation, 0, load};
      auto open = open_call.find(m);
      if (open == open_call.end() ||
          calls[open->second].request.items_size() >= static_cast<int>(kMaxItemsPerCall) ||
          call_tokens[open->second] >= kMaxTokensPerCall) {
        calls.push_back({m->address, {}});
        calls.back().request.set_coordinator_incarnation(registry_->coordinator_incarnation());
        calls.back().request.set_generation(generation);
        call_tokens.push_back(0);
        open = open_call.insert_or_assign(m, calls.size() - 1).first;
      }
      WorkItem* item = calls[open->second].request.add_items();
      item->set_request_id(id);
      item->set_rank(best);
      item->mutable_prompt_token_ids()->Add(q.prompt.begin(), q.prompt.end());
      *item->mutable_params() = q.line.sampling;
      call_tokens[open->second] += static_cast<int64_t>(q.prompt.size());
      JobRuntime& job = jobs_[q.job_id];
      if (!job.started) {
        job.started = true;
        writer_.SetJobState(q.job_id, Job::RUNNING, "", clock_->Now());
      }
    }
    queue_.insert(queue_.begin(), waiting_for_leader.begin(), waiting_for_leader.end());
    if (!calls.empty()) BumpLocked();
  }
  for (const Call& call : calls) {
    absl::Status status = workers_->SubmitRequests(call.address, call.request);
    if (status.ok()) continue;
    LOG(WARNING) << status << "; re-queueing " << call.request.items_size() << " request(s)";
    absl::MutexLock lock(&mu_);
    for (auto it = call.request.items().rbegin(); it != call.request.items().rend(); ++it) {
      auto a = inflight_.find(it->request_id());
      if (a != inflight_.end() && a->second.generation == generation) {
        inflight_.erase(a);
        queue_.push_front(it->request_id());
      }
    }
  }
}

}  // namespace deepinfer
