// ConstrainedRequests: the structured-output share of a decode benchmark. A fraction of the
// batch's requests get a grammar (a JSON Schema, or any JSON object) as the engine gives them:
// a GrammarMatcher each over the real tokenizer's vocabulary, one TokenMaskCache shared by all
// (as the requests of a job sharing a schema share one), and SequenceStep::fill_allowed_tokens,
// which the model's step calls on the host after the forward pass is enqueued
// (layers/step_sampling.cc), so mask filling overlaps the device's work as in the engine.
// After each step the matchers take the sampled tokens; a request whose document is complete
// (it sampled the stop token) starts a new one.
#ifndef DEEPINFER_TOOLS_BENCH_CONSTRAINED_REQUESTS_H_
#define DEEPINFER_TOOLS_BENCH_CONSTRAINED_REQUESTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/grammar/grammar_matcher.h"
#include "worker/model/step_batch.h"

namespace deepinfer {

class ConstrainedRequests {
 public:
  // The tokenizer of `tokenizer_dir` (tokenizer.json, tokenizer_config.json for the stop
  // token) over `vocab_size` rows, and the JSON Schema in the file `schema_path` (empty: any
  // JSON object). INVALID_ARGUMENT naming what could not be read or compiled.
  static absl::StatusOr<std::unique_ptr<ConstrainedRequests>> Create(
      const std::string& tokenizer_dir, const std::string& schema_path, int64_t vocab_size);

  // Constrains round(fraction * size) of `seqs`, spread evenly over the batch (the first is
  // sequence 0 when any is), each with a fresh matcher. `seqs` must outlive the steps.
  void Attach(double fraction, std::vector<SequenceStep>* seqs);
  // After a step of the attached batch: each constrained request's matcher takes its sampled
  // token. INTERNAL when one was not allowed (the mask was not applied).
  absl::Status Advance(const StepOutput& out);

  int64_t count() const { return static_cast<int64_t>(rows_.size()); }
  // Host time spent filling masks since the last call, in seconds.
  double TakeFillSeconds();

 private:
  ConstrainedRequests() = default;

  std::shared_ptr<grammar::TokenMaskCache> cache_;
  std::vector<int64_t> rows_;  // the constrained sequences' indices in the batch
  std::vector<std::unique_ptr<grammar::GrammarMatcher>> matchers_;
  double fill_seconds_ = 0;
};

}  // namespace deepinfer

#endif  // DEEPINFER_TOOLS_BENCH_CONSTRAINED_REQUESTS_H_
