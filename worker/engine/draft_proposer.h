// DraftProposer: the drafting half of speculative decoding (docs/engine.md "Speculative
// decoding"). Each engine step, before the model's step, it runs the model's draft head
// (CausalLm::Draft, DeepSeek's multi-token prediction) over every scheduled sequence:
//
//   round 1: the main model's hidden states of the positions computed in the sequence's last
//            step, each with the token that follows it, go through the draft head (filling its
//            cache entries); the last row predicts the token after the sequence's last token;
//   round r: the draft head's own output of the row before, with the draft of round r - 1, at the
//            next position (module (r - 1) mod the number of modules), predicts one more token.
//
// A sequence stops drafting at its max_drafts, or at the first draft whose probability (the
// draft head's softmax for its own greedy token) is below the confidence threshold; that draft
// is dropped. Every round is one Draft call over the sequences still drafting. The drafts only
// decide how many tokens a step may gain: the verification (Engine) keeps the output exactly
// the main model's.
#ifndef DEEPINFER_WORKER_ENGINE_DRAFT_PROPOSER_H_
#define DEEPINFER_WORKER_ENGINE_DRAFT_PROPOSER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/causal_lm.h"

namespace deepinfer {

struct DraftRequest {
  // Round 1's rows: positions first_position, +1, ...; the main model's hidden state of each
  // ([rows, width], StepOutput::hidden) and the token that follows each position.
  int64_t first_position = 0;
  std::vector<float> hidden;
  std::vector<int32_t> next_tokens;
  // The sequence's block table, covering every position drafting writes (round r writes
  // first_position + rows + r - 2).
  const std::vector<int32_t>* block_table = nullptr;
  // The sequence's prefix-cache blocks and rebuild bounds (DraftStep).
  int32_t shared_blocks = 0;
  int64_t replay_from = 0;
  int64_t kept_end = 0;
  int32_t max_drafts = 0;       // 0: round 1's rows only (a prompt chunk's cache entries)
  std::vector<int32_t> drafts;  // out: at most max_drafts tokens
};

class DraftProposer {
 public:
  // `model` (with a draft head) and `pool` must outlive the proposer. min_confidence in [0, 1].
  DraftProposer(CausalLm* model, KvBlockPool* pool, float min_confidence)
      : model_(model), pool_(pool), min_confidence_(min_confidence) {}

  // Fills each request's drafts. The model's errors as they are.
  absl::Status Propose(std::vector<DraftRequest>* requests);

  // Drafts proposed so far (for tests and logs).
  int64_t proposed() const { return proposed_; }

 private:
  CausalLm* const model_;
  KvBlockPool* const pool_;
  const float min_confidence_;
  int64_t proposed_ = 0;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_ENGINE_DRAFT_PROPOSER_H_
