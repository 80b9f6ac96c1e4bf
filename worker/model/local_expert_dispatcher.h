// LocalExpertDispatcher: ExpertDispatcher for one rank that hosts every expert a token can pick
// (no communication). Rows are grouped by expert in ascending expert id and, within an expert,
// by token order; Combine adds contributions in that order, which reproduces HF's summation
// order (experts ascending, then the shared expert).
#ifndef DEEPINFER_WORKER_MODEL_LOCAL_EXPERT_DISPATCHER_H_
#define DEEPINFER_WORKER_MODEL_LOCAL_EXPERT_DISPATCHER_H_

#include <vector>

#include "worker/backend/backend.h"
#include "worker/model/expert_dispatcher.h"

namespace deepinfer {

class LocalExpertDispatcher : public ExpertDispatcher {
 public:
  // local_experts: ascending global ids hosted here; a token routed elsewhere is an error.
  LocalExpertDispatcher(Backend* backend, int64_t num_experts, int64_t hidden_size,
                        std::vector<int64_t> local_experts);

  const std::vector<int64_t>& local_experts(int64_t) const override { return local_experts_; }
  bool single_rank() const override { return true; }
  absl::Status Dispatch(int64_t moe_layer, int64_t num_tokens, int64_t top_k, const float* hidden,
                        const int32_t* topk_ids, const float* topk_weights,
                        DispatchedTokens* out) override;
  absl::Status Combine(const DispatchedTokens& dispatched, const float* expert_out,
                       float* out) override;

 private:
  Backend* backend_;
  const int64_t num_experts_;
  const int64_t hidden_size_;
  const std::vector<int64_t> local_experts_;
  std::vector<int64_t> slot_of_expert_;  // global id -> local index or -1
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_LOCAL_EXPERT_DISPATCHER_H_
