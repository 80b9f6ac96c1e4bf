// Test support: a CausalLm wrapper whose drafts are chosen, so that tests of speculative decoding
// can force accepted runs and rejections where they want them. After the wrapped model's draft
// head ran (its cache entries written as usual), each draft becomes the token at that position of
// `continuation` (the prompt and its non-speculative output), except at positions that are
// multiples of `wrong_every`, where it is another token. One request per engine.
#ifndef DEEPINFER_WORKER_ENGINE_ORACLE_DRAFTS_H_
#define DEEPINFER_WORKER_ENGINE_ORACLE_DRAFTS_H_

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "worker/model/causal_lm.h"

namespace deepinfer {

class OracleDrafts : public CausalLm {
 public:
  OracleDrafts(CausalLm* inner, std::vector<int32_t> continuation, int wrong_every)
      : inner_(inner), continuation_(std::move(continuation)), wrong_every_(wrong_every) {}
  const ModelConfig& config() const override { return inner_->config(); }
  KvCacheSpec CacheSpec() const override { return inner_->CacheSpec(); }
  absl::StatusOr<StepOutput> Step(const std::vector<SequenceStep>& batch,
                                  KvBlockPool* cache) override {
    return inner_->Step(batch, cache);
  }
  int64_t BoundedReplayStart(int64_t kept_end) const override {
    return inner_->BoundedReplayStart(kept_end);
  }
  int32_t num_draft_layers() const override { return inner_->num_draft_layers(); }
  int64_t MaxDraftsPerStep(const KvBlockPool& cache) const override {
    return inner_->MaxDraftsPerStep(cache);
  }
  absl::StatusOr<DraftOutput> Draft(const std::vector<DraftStep>& batch,
                                    KvBlockPool* cache) override {
    absl::StatusOr<DraftOutput> out = inner_->Draft(batch, cache);
    if (!out.ok()) return out;
    const int64_t vocab = inner_->config().vocab_size;
    for (size_t i = 0; i < batch.size(); ++i) {
      // Row j, followed by token j + 1, predicts token j + 2.
      const int64_t at =
          batch[i].position_offset + static_cast<int64_t>(batch[i].tokens.size()) + 1;
      if (at >= static_cast<int64_t>(continuation_.size())) continue;
      const int32_t right = continuation_[at];
      out->token[i] = at % wrong_every_ == 0 ? static_cast<int32_t>((right + 1) % vocab) : right;
      out->probability[i] = 1.0f;
    }
    return out;
  }
  void SetDecodeGraphOptions(const DecodeGraphOptions& o) override {
    inner_->SetDecodeGraphOptions(o);
  }
  const DecodeGraphOptions& decode_graph_options() const override {
    return inner_->decode_graph_options();
  }
  void SetFusedOps(bool on) override { inner_->SetFusedOps(on); }
  bool fused_ops() const override { return inner_->fused_ops(); }
  void SetPrefillAttention(PrefillAttention f) override { inner_->SetPrefillAttention(f); }
  PrefillAttention prefill_attention() const override { return inner_->prefill_attention(); }
  void PrepareCache(KvBlockPool* cache) override { inner_->PrepareCache(cache); }
  int64_t decode_graph_steps() const override { return inner_->decode_graph_steps(); }
  int64_t decode_graphs_recorded() const override { return inner_->decode_graphs_recorded(); }
  int64_t num_moe_layers() const override { return inner_->num_moe_layers(); }
  std::vector<int64_t> TakeExpertCounts() override { return inner_->TakeExpertCounts(); }
  std::vector<std::vector<int64_t>> MissingExperts(
      const std::vector<std::vector<int64_t>>& needed) const override {
    return inner_->MissingExperts(needed);
  }
  absl::Status SwitchPlacement(std::shared_ptr<const ExpertPlacement> placement,
                               const std::vector<std::vector<int64_t>>& needed,
                               std::vector<std::map<int64_t, MlpWeights>> loaded) override {
    return inner_->SwitchPlacement(std::move(placement), needed, std::move(loaded));
  }

 private:
  CausalLm* const inner_;
  const std::vector<int32_t> continuation_;
  const int wrong_every_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_ENGINE_ORACLE_DRAFTS_H_
