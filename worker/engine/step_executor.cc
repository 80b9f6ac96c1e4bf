// StepExecutor implementation.
#include "worker/engine/step_executor.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace deepinfer {

StepExecutor::StepExecutor(CausalLm* model, KvBlockPool* pool, bool threaded)
    : model_(model), pool_(pool) {
  if (threaded) thread_ = std::thread([this] { Loop(); });
}

StepExecutor::~StepExecutor() {
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void StepExecutor::Submit(StepJob job) {
  if (!threaded()) {
    StepDone done;
    Run(std::move(job), &done);
    absl::MutexLock lock(&mu_);
    done_.push_back(std::move(done));
    return;
  }
  absl::MutexLock lock(&mu_);
  jobs_.push_back(std::move(job));
}

StepDone StepExecutor::Take() {
  absl::MutexLock lock(&mu_);
  CHECK(!done_.empty() || !jobs_.empty() || running_ > 0) << "StepExecutor::Take: no step";
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !done_.empty(); };
  mu_.Await(absl::Condition(&ready));
  StepDone done = std::move(done_.front());
  done_.pop_front();
  return done;
}

void StepExecutor::WaitIdle() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return jobs_.empty() && running_ == 0; };
  mu_.Await(absl::Condition(&idle));
}

int StepExecutor::outstanding() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(jobs_.size() + done_.size()) + running_;
}

void StepExecutor::Loop() {
  pool_->backend()->UseOnThisThread();
  while (true) {
    StepJob job;
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !jobs_.empty(); };
      mu_.Await(absl::Condition(&wake));
      // Stopping waits for the submitted steps: their sequences' blocks are still in use.
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      ++running_;
    }
    StepDone done;
    Run(std::move(job), &done);
    absl::MutexLock lock(&mu_);
    done_.push_back(std::move(done));
    --running_;
  }
}

void StepExecutor::Run(StepJob job, StepDone* done) {
  if (!failed_.ok()) {
    done->output = failed_;
    return;
  }
  for (const auto& [row, previous] : job.from_previous) {
    // The engine asks only for rows the previous step sampled.
    const bool valid = row >= 0 && row < static_cast<int32_t>(job.batch.size()) &&
                       job.batch[row].tokens.size() == 1 && previous >= 0 &&
                       previous < static_cast<int32_t>(last_tokens_.size()) &&
                       last_tokens_[previous] >= 0;
    if (!valid) {
      failed_ = absl::InternalError(absl::StrCat("StepExecutor: row ", row,
                                                 " asks for the token the previous step sampled "
                                                 "for its row ",
                                                 previous, ", which it did not sample"));
      done->output = failed_;
      return;
    }
    job.batch[row].tokens[0] = last_tokens_[previous];
  }
  const int64_t graphs = model_->decode_graphs_recorded();
  const int64_t graph_steps = model_->decode_graph_steps();
  done->start = absl::Now();
  done->output = model_->Step(job.batch, pool_);
  done->end = absl::Now();
  done->recorded_graph = model_->decode_graphs_recorded() > graphs;
  done->graph_replayed = model_->decode_graph_steps() > graph_steps;
  if (!done->output.ok()) {
    failed_ = done->output.status();
    return;
  }
  last_tokens_.resize(done->output->sampled.size());
  for (size_t i = 0; i < last_tokens_.size(); ++i) {
    last_tokens_[i] = done->output->sampled[i].token;
  }
}

}  // namespace deepinfer
