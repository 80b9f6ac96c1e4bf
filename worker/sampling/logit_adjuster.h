// LogitAdjuster: one sequence's logit_bias, min_tokens and penalties, with the token counts they
// need, turned into the LogitAdjustment entries of its next token (logit_adjustment.h).
//
// It keeps the generated tokens' counts and, with a repetition penalty, the set of prompt
// tokens, so that building a step's entries costs O(distinct tokens involved), not O(sequence).
#ifndef DEEPINFER_WORKER_SAMPLING_LOGIT_ADJUSTER_H_
#define DEEPINFER_WORKER_SAMPLING_LOGIT_ADJUSTER_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/sampling/logit_adjustment.h"

namespace deepinfer {

struct LogitAdjusterParams {
  std::map<int32_t, float> logit_bias;  // token id -> bias added to its logit
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;  // > 0; 1: none
  // `stop_tokens` (EOS unless ignored, stop_token_ids) get -inf while fewer than min_tokens
  // tokens are generated.
  int32_t min_tokens = 0;
  std::vector<int32_t> stop_tokens;
};

class LogitAdjuster {
 public:
  // INVALID_ARGUMENT naming the parameter: a token id outside [0, vocab), a bias or penalty
  // that is not finite, repetition_penalty <= 0, min_tokens < 0.
  static absl::StatusOr<LogitAdjuster> Create(LogitAdjusterParams params, int64_t vocab,
                                              absl::Span<const int32_t> prompt);

  // Whether any entry can ever be produced (else a sequence need not carry one).
  bool active() const;
  // Counts a generated token.
  void AddGenerated(int32_t token);
  int64_t generated() const { return generated_; }
  // The entries for the next token, by token id ascending, `row` set to 0.
  std::vector<LogitAdjustment> Entries() const { return EntriesAfter(0); }
  // Whether the entries depend on which tokens were generated (a penalty), not only on how many.
  bool counts_tokens() const;
  // The entries for the token after `pending` more generated tokens whose ids are not known yet
  // (async scheduling); only without counts_tokens().
  std::vector<LogitAdjustment> EntriesAfter(int64_t pending) const;

 private:
  explicit LogitAdjuster(LogitAdjusterParams params) : params_(std::move(params)) {}

  LogitAdjusterParams params_;
  absl::flat_hash_set<int32_t> prompt_tokens_;  // only with a repetition penalty
  absl::flat_hash_map<int32_t, int32_t> generated_counts_;
  int64_t generated_ = 0;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_SAMPLING_LOGIT_ADJUSTER_H_
