// LocalExpertDispatcher: host-planned permutation, device gather / weighted scatter-add.
#include "worker/model/local_expert_dispatcher.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace deepinfer {

LocalExpertDispatcher::LocalExpertDispatcher(Backend* backend, int64_t num_experts,
                                             int64_t hidden_size,
                                             std::vector<int64_t> local_experts)
    : backend_(backend),
      num_experts_(num_experts),
      hidden_size_(hidden_size),
      local_experts_(std::move(local_experts)),
      slot_of_expert_(num_experts, -1) {
  for (size_t i = 0; i < local_experts_.size(); ++i) slot_of_expert_[local_experts_[i]] = i;
}

absl::Status LocalExpertDispatcher::Dispatch(int64_t /*moe_layer*/, int64_t num_tokens,
                                             int64_t top_k, const float* hidden,
                                             const int32_t* topk_ids, const float* topk_weights,
                                             DispatchedTokens* out) {
  const int64_t n = num_tokens * top_k;
  std::vector<int32_t> ids(n);
  std::vector<float> weights(n);
  backend_->CopyToHost(topk_ids, n * sizeof(int32_t), ids.data());
  backend_->CopyToHost(topk_weights, n * sizeof(float), weights.data());
  std::vector<std::vector<std::pair<int32_t, float>>> per_expert(local_experts_.size());
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t k = 0; k < top_k; ++k) {
      const int32_t e = ids[t * top_k + k];
      if (e < 0 || e >= num_experts_ || slot_of_expert_[e] < 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "LocalExpertDispatcher: token routed to expert ", e,
            ", which this rank does not host (expert parallelism needs a communicator)"));
      }
      per_expert[slot_of_expert_[e]].emplace_back(static_cast<int32_t>(t), weights[t * top_k + k]);
    }
  }
  std::vector<int32_t> row_token;
  std::vector<float> row_weight;
  out->group_offsets.assign(1, 0);
  for (const auto& rows : per_expert) {
    for (const auto& [t, w] : rows) {
      row_token.push_back(t);
      row_weight.push_back(w);
    }
    out->group_offsets.push_back(static_cast<int64_t>(row_token.size()));
  }
  out->num_rows = static_cast<int64_t>(row_token.size());
  out->row_token = backend_->Allocate(row_token.size() * sizeof(int32_t));
  out->row_weight = backend_->Allocate(row_weight.size() * sizeof(float));
  backend_->CopyToDevice(row_token.data(), row_token.size() * sizeof(int32_t),
                         out->row_token->data());
  backend_->CopyToDevice(row_weight.data(), row_weight.size() * sizeof(float),
                         out->row_weight->data());
  out->hidden = backend_->Allocate(out->num_rows * hidden_size_ * sizeof(float));
  backend_->GatherRows(out->num_rows, hidden_size_, hidden, out->row_token->as<int32_t>(),
                       out->hidden->as<float>());
  return absl::OkStatus();
}

absl::Status LocalExpertDispatcher::Combine(const DispatchedTokens& d, const float* expert_out,
                                            float* out) {
  backend_->ScatterAddRows(d.num_rows, hidden_size_, expert_out, d.row_token->as<int32_t>(),
                           d.row_weight->as<float>(), out);
  return absl::OkStatus();
}

}  // namespace deepinfer
