// StepStats: what one rank's engine did with its time while serving, for the end-to-end job
// benchmark (tools/bench/e2e_job.py, docs/e2e-jobs.md).
//
// Per step it records the batch the step ran (decode sequences and prefill tokens), how long
// Model::Step took and the gap since the previous step ended, both timed on the thread that runs
// the steps (the engine's StepExecutor: with async scheduling its own thread): the device has no
// work queued in that gap (Model::Step returns once the step's results are read back), so the
// gaps are the device's idle time between steps as the host sees it (host work inside
// Model::Step before its first kernel counts as step time: a lower bound). Steps that recorded a
// decode graph are counted apart (graph capture is start-up work that happens on first use). Per
// request it records the time to first token, from the step that took the request off the
// rank's queue to the end of the step that sampled its first token.
//
// The batch-size histogram keys steps by (decode sequences, prefill tokens); the benchmark
// prices each key with step times measured by deepinfer-bench to get the job's ideal time.
//
// Not thread-safe: the rank thread that drives the engine writes it; ToJson() is called on the
// same thread.
#ifndef DEEPINFER_WORKER_ENGINE_STEP_STATS_H_
#define DEEPINFER_WORKER_ENGINE_STEP_STATS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace deepinfer {

class StepStats {
 public:
  // A step that started at `start` and whose Model::Step took `duration`; `decodes` of its
  // sequences brought one token after a cached context, the others `prefill_tokens` in all.
  // `recorded_graph`: the step recorded a decode graph; `graph_replayed`: it ran through the
  // decode graph path (DecodeGraphRunner), not the model's eager one.
  void AddStep(absl::Time start, absl::Duration duration, int64_t decodes, int64_t prefill_tokens,
               bool recorded_graph, bool graph_replayed);
  // A request's first token, `ttft` after the step that admitted it started.
  void AddFirstToken(absl::Duration ttft) { ttft_s_.push_back(absl::ToDoubleSeconds(ttft)); }
  // Tokens a step computed for a sequence that had finished before that step was processed
  // (async scheduling runs a sequence's next step before its stop is known); counted in the
  // step's batch too.
  void AddDropped(int64_t tokens) { dropped_tokens_ += tokens; }
  // A request that finished, with how many tokens it generated.
  void AddFinished(int64_t generated) {
    ++finished_;
    generated_tokens_ += generated;
  }

  // Whether the steps were formed while the one before ran (Engine::async_scheduling).
  void set_async_scheduling(bool on) { async_scheduling_ = on; }

  int64_t steps() const { return steps_; }
  // One JSON object (no newline): async_scheduling, counts (graph_steps: through the decode graph
  // path; dropped_tokens: AddDropped), times in seconds, first/last step as Unix seconds,
  // ttft p50/p99, and "histogram": [[decodes, prefill_tokens, steps, seconds], ...].
  std::string ToJson() const;

 private:
  bool async_scheduling_ = false;
  int64_t steps_ = 0;
  int64_t capture_steps_ = 0;
  double step_s_ = 0;        // Model::Step time of the steps that recorded no graph
  double capture_s_ = 0;     // ... of those that did
  int64_t graph_steps_ = 0;  // steps through the decode graph path
  double graph_step_s_ = 0;
  double gap_s_ = 0;  // between one step's end and the next one's start
  double max_gap_s_ = 0;
  int64_t decode_tokens_ = 0;  // tokens computed by decode rows
  int64_t prefill_tokens_ = 0;
  int64_t dropped_tokens_ = 0;
  int64_t finished_ = 0;
  int64_t generated_tokens_ = 0;
  absl::Time first_start_ = absl::InfinitePast();
  absl::Time last_end_ = absl::InfinitePast();
  std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, double>> histogram_;
  std::vector<double> ttft_s_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_ENGINE_STEP_STATS_H_
