// V4Moe: router, routed experts through the dispatcher, shared expert.
#include "worker/model/deepseek_v4/v4_moe.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace deepinfer {

V4Moe::V4Moe(const DeepseekV4Config& config, DeepseekV4Weights* weights, Backend* backend,
             std::unique_ptr<ExpertDispatcher> dispatcher)
    : config_(config),
      weights_(weights),
      backend_(backend),
      dispatcher_(std::move(dispatcher)),
      expert_counts_(backend->Allocate(
          std::max<int64_t>(1, config.num_layers * config.n_routed_experts) * sizeof(int64_t))) {}

void V4Moe::Mlp(const MlpWeights& w, int64_t rows, const float* h, float* out, bool accumulate) {
  const int64_t H = config_.hidden_size, I = w.inter;
  auto gu = Floats(rows * 2 * I);
  backend_->Gemm(rows, 2 * I, H, h, H, weights_->Matrix(w.gate_up), H, gu->as<float>(), 2 * I,
                 false);
  auto act = Floats(rows * I);
  backend_->v4_ops()->SwiGluClamped(rows, I, gu->as<float>(),
                                    static_cast<float>(config_.swiglu_limit), act->as<float>());
  backend_->Gemm(rows, H, I, act->as<float>(), I, weights_->Matrix(w.down), I, out, H, accumulate);
}

absl::Status V4Moe::Forward(int64_t layer, int64_t rows, const float* h, const int32_t* ids,
                            float* out) {
  const DeepseekV4Config& c = config_;
  const LayerWeights& L = weights_->moe.layers[layer];
  const int64_t H = c.hidden_size, E = c.n_routed_experts, K = c.num_experts_per_tok;
  const int64_t I = c.moe_intermediate_size;
  auto logits = Floats(rows * E);
  backend_->Gemm(rows, E, H, h, H, WeightView(L.router->as<float>()), H, logits->as<float>(), E,
                 false);
  auto topk_ids = backend_->AllocateScratch(std::max<int64_t>(1, rows * K) * sizeof(int32_t));
  auto topk_w = Floats(rows * K);
  V4RouteArgs r;
  r.rows = rows;
  r.experts = E;
  r.top_k = K;
  r.logits = logits->as<float>();
  r.bias = L.router_bias != nullptr ? L.router_bias->as<float>() : nullptr;
  const auto& table = weights_->layers[layer].hash_table;
  r.hash_table = table != nullptr ? table->as<int32_t>() : nullptr;
  r.token_ids = ids;
  r.sqrtsoftplus = c.scoring_func == "sqrtsoftplus";
  r.scaling = static_cast<float>(c.routed_scaling_factor);
  r.topk_ids = topk_ids->as<int32_t>();
  r.topk_weights = topk_w->as<float>();
  if (rows > 0) {
    backend_->v4_ops()->Route(r);
    backend_->AccumulateExpertCounts(rows * K, topk_ids->as<int32_t>(), E, nullptr,
                                     expert_counts_->as<int64_t>() + layer * E);
  }
  DispatchedTokens d;
  absl::Status st =
      dispatcher_->Dispatch(layer, rows, K, h, topk_ids->as<int32_t>(), topk_w->as<float>(), &d);
  if (!st.ok()) return st;
  std::vector<WeightView> gate_up, down;
  for (int64_t e : dispatcher_->local_experts(layer)) {
    auto it = L.experts.find(e);
    if (it == L.experts.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("layer ", layer, ": expert ", e, " is served here but not loaded"));
    }
    gate_up.push_back(weights_->Matrix(it->second.gate_up));
    down.push_back(weights_->Matrix(it->second.down));
  }
  auto expert_out = Floats(d.num_rows * H);
  if (d.num_rows > 0) {
    auto gu = Floats(d.num_rows * 2 * I);
    backend_->GroupedGemm(d.group_offsets, gate_up, 2 * I, H, d.hidden->as<float>(),
                          gu->as<float>());
    auto act = Floats(d.num_rows * I);
    backend_->v4_ops()->SwiGluClamped(d.num_rows, I, gu->as<float>(),
                                      static_cast<float>(c.swiglu_limit), act->as<float>());
    backend_->GroupedGemm(d.group_offsets, down, H, I, act->as<float>(), expert_out->as<float>());
  }
  if (rows > 0) {
    auto zero = backend_->Allocate(rows * H * sizeof(float));
    backend_->CopyDeviceToDevice(zero->data(), rows * H * sizeof(float), out);
  }
  st = dispatcher_->Combine(d, expert_out->as<float>(), out);
  if (!st.ok()) return st;
  // The shared expert after the routed sum, as HF adds them.
  if (rows > 0) Mlp(L.shared, rows, h, out, /*accumulate=*/true);
  return absl::OkStatus();
}

std::vector<int64_t> V4Moe::TakeExpertCounts() {
  const size_t n = static_cast<size_t>(config_.num_layers * config_.n_routed_experts);
  std::vector<int64_t> counts(n, 0);
  if (n == 0) return counts;
  backend_->CopyToHost(expert_counts_->data(), n * sizeof(int64_t), counts.data());
  const std::vector<int64_t> zero(n, 0);
  backend_->CopyToDevice(zero.data(), n * sizeof(int64_t), expert_counts_->data());
  return counts;
}

std::vector<std::vector<int64_t>> V4Moe::MissingExperts(
    const std::vector<std::vector<int64_t>>& needed) const {
  std::vector<std::vector<int64_t>> missing(needed.size());
  for (size_t l = 0; l < needed.size() && l < weights_->moe.layers.size(); ++l) {
    for (int64_t e : needed[l]) {
      if (!weights_->moe.layers[l].experts.count(e) &&
          std::find(missing[l].begin(), missing[l].end(), e) == missing[l].end()) {
        missing[l].push_back(e);
      }
    }
  }
  return missing;
}

absl::Status V4Moe::SwitchPlacement(std::shared_ptr<const ExpertPlacement> placement,
                                    const std::vector<std::vector<int64_t>>& needed,
                                    std::vector<std::map<int64_t, MlpWeights>> loaded) {
  const int64_t layers = config_.num_layers;
  if (static_cast<int64_t>(needed.size()) != layers ||
      static_cast<int64_t>(loaded.size()) != layers) {
    return absl::InvalidArgumentError(absl::StrCat("expert placement for ", needed.size(),
                                                   " MoE layers, the model has ", layers));
  }
  for (int64_t l = 0; l < layers; ++l) {
    for (int64_t e : needed[l]) {
      if (!weights_->moe.layers[l].experts.count(e) && !loaded[l].count(e)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "expert ", e, " of layer ", l, " is needed by the new placement but not loaded"));
      }
    }
  }
  if (absl::Status st = dispatcher_->SetPlacement(std::move(placement)); !st.ok()) return st;
  for (int64_t l = 0; l < layers; ++l) {
    std::map<int64_t, MlpWeights>& experts = weights_->moe.layers[l].experts;
    std::map<int64_t, MlpWeights> kept;
    for (int64_t e : needed[l]) {
      if (kept.count(e)) continue;
      auto old = experts.find(e);
      kept[e] = old != experts.end() ? std::move(old->second) : std::move(loaded[l][e]);
    }
    experts = std::move(kept);
  }
  return absl::OkStatus();
}

}  // namespace deepinfer
