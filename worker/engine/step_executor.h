// StepExecutor: runs one rank's model steps (CausalLm::Step) in the order they are submitted,
// either on a thread of its own (async scheduling: the engine forms and submits step n + 1 and
// handles step n's tokens while step n runs) or on the caller's thread, at Submit (synchronous).
//
// A step may take input tokens that the step before it samples: a decoding sequence whose last
// token is still being sampled is submitted with a placeholder, and the executor writes the
// token the previous step sampled for it into its row right before running the step
// (StepJob::from_previous). On the CUDA backend the previous step's tokens are on the host by
// then (CausalLm::Step returns once its results are read back), so this costs the device no
// more than the step's own upload; on the CPU backend the step runs on the executor's thread
// while the engine's thread does the host work of the step before.
//
// Each step is timed where it runs: `start` right before CausalLm::Step is called, `end` right
// after it returned (its results on the host). The time between one step's end and the next
// one's start is what the device spent waiting for the host (StepStats' gaps).
//
// A failed step fails every step submitted after it with the same status (nothing more runs on
// the model): the engine is dropped after an error.
//
// Thread-safety: Submit, Take, WaitIdle and outstanding are called by one thread (the rank's);
// the model, the pool and what the jobs point to (fill_allowed_tokens' sequences) must not be
// touched by that thread while a step runs, except through the pool's thread-safe allocation.
#ifndef DEEPINFER_WORKER_ENGINE_STEP_EXECUTOR_H_
#define DEEPINFER_WORKER_ENGINE_STEP_EXECUTOR_H_

#include <cstdint>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/causal_lm.h"

namespace deepinfer {

struct StepJob {
  std::vector<SequenceStep> batch;
  // (row of `batch`, row of the previous job): that row's one input token is the token the
  // previous job sampled for its row. The previous job must sample there.
  std::vector<std::pair<int32_t, int32_t>> from_previous;
};

struct StepDone {
  absl::StatusOr<StepOutput> output;
  absl::Time start = absl::InfinitePast();  // CausalLm::Step called
  absl::Time end = absl::InfinitePast();    // ... and returned
  bool recorded_graph = false;              // the step recorded a decode graph
  bool graph_replayed = false;              // it ran through the decode graph path
};

class StepExecutor {
 public:
  // `model` and `pool` must outlive the executor. threaded = false: Submit runs the step.
  StepExecutor(CausalLm* model, KvBlockPool* pool, bool threaded);
  ~StepExecutor();  // waits for the submitted steps
  StepExecutor(const StepExecutor&) = delete;
  StepExecutor& operator=(const StepExecutor&) = delete;

  bool threaded() const { return thread_.joinable(); }

  void Submit(StepJob job);
  // The oldest submitted step's outcome, once it ran. At least one must be outstanding.
  StepDone Take();
  // Returns once every submitted step ran (their outcomes stay to be taken).
  void WaitIdle();
  // Submitted and not taken.
  int outstanding() const;

 private:
  // Runs `job` after the previous one; fills `*done`.
  void Run(StepJob job, StepDone* done);
  void Loop();

  CausalLm* const model_;
  KvBlockPool* const pool_;
  // Of the step that ran last (on the stepping thread only): its sampled tokens, or its error.
  std::vector<int32_t> last_tokens_;
  absl::Status failed_;

  mutable absl::Mutex mu_;
  std::deque<StepJob> jobs_ ABSL_GUARDED_BY(mu_);
  std::deque<StepDone> done_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // jobs taken off jobs_ and not in done_ yet
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_ENGINE_STEP_EXECUTOR_H_
