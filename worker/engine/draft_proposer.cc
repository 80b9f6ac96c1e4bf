// DraftProposer: draft rounds over the model's draft head.
#include "worker/engine/draft_proposer.h"

#include <utility>

namespace deepinfer {

absl::Status DraftProposer::Propose(std::vector<DraftRequest>* requests) {
  const int32_t modules = model_->num_draft_layers();
  // Per request in this round: its input row (round 1: every row) and, after the round, the
  // draft head's hidden state of its last row.
  std::vector<size_t> active;
  std::vector<DraftStep> batch;
  for (size_t i = 0; i < requests->size(); ++i) {
    DraftRequest& r = (*requests)[i];
    r.drafts.clear();
    if (r.next_tokens.empty()) continue;
    DraftStep step;
    step.tokens = r.next_tokens;
    step.hidden = std::move(r.hidden);
    step.position_offset = r.first_position;
    step.block_table = *r.block_table;
    step.module = 0;
    step.shared_blocks = r.shared_blocks;
    step.replay_from = r.replay_from;
    step.kept_end = r.kept_end;
    batch.push_back(std::move(step));
    active.push_back(i);
  }
  for (int32_t round = 1; !batch.empty(); ++round) {
    absl::StatusOr<DraftOutput> out = model_->Draft(batch, pool_);
    if (!out.ok()) return out.status();
    std::vector<DraftStep> next;
    std::vector<size_t> still;
    for (size_t b = 0; b < batch.size(); ++b) {
      DraftRequest& r = (*requests)[active[b]];
      if (static_cast<int32_t>(r.drafts.size()) >= r.max_drafts) continue;
      if (out->probability[b] < min_confidence_) continue;
      r.drafts.push_back(out->token[b]);
      ++proposed_;
      if (static_cast<int32_t>(r.drafts.size()) >= r.max_drafts) continue;
      DraftStep step;
      step.tokens = {out->token[b]};
      step.hidden = std::move(out->hidden[b]);
      step.position_offset =
          batch[b].position_offset + static_cast<int64_t>(batch[b].tokens.size());
      step.block_table = std::move(batch[b].block_table);
      step.module = round % modules;
      step.shared_blocks = batch[b].shared_blocks;
      step.replay_from = batch[b].replay_from;
      step.kept_end = batch[b].kept_end;
      next.push_back(std::move(step));
      still.push_back(active[b]);
    }
    batch = std::move(next);
    active = std::move(still);
  }
  return absl::OkStatus();
}

}  // namespace deepinfer
