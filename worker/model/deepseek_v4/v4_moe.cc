// V4Moe: router, routed experts through the dispatcher, shared expert.
#include "worker/model/deepseek_v4/v4_moe.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace deepinfer {

std::vector<V4MoeLayer> V4Moe::ModelLayers(DeepseekV4Weights* weights) {
  std::vector<V4MoeLayer> layers(weights->layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    layers[l].weights = &weights->moe.layers[l];
    layers[l].hash_table = weights->layers[l].hash_table.get();
  }
  return layers;
}

V4Moe::V4Moe(const DeepseekV4Config& config, DeepseekV4Weights* weights,
             std::vector<V4MoeLayer> layers, Backend* backend,
             std::unique_ptr<ExpertDispatcher> dispatcher, std::function<void()> drop_graphs)
    : config_(config),
      weights_(weights),
      layers_(std::move(layers)),
      backend_(backend),
      dispatcher_(std::move(dispatcher)),
      drop_graphs_(std::move(drop_graphs)),
      expert_counts_(backend->Allocate(
          std::max<int64_t>(1, static_cast<int64_t>(layers_.size()) * config.n_routed_experts) *
          sizeof(int64_t))) {
  const int64_t K = config_.num_experts_per_tok;
  const int64_t num_layers = static_cast<int64_t>(layers_.size());
  distinct_experts_.assign(num_layers, true);
  for (int64_t l = 0; l < num_layers; ++l) {
    const DeviceBuffer* table = layers_[l].hash_table;
    if (table == nullptr) continue;
    std::vector<int32_t> host(config_.vocab_size * K);
    backend_->CopyToHost(table->data(), host.size() * sizeof(int32_t), host.data());
    for (int64_t v = 0; v < config_.vocab_size && distinct_experts_[l]; ++v) {
      std::vector<int32_t> row(host.begin() + v * K, host.begin() + (v + 1) * K);
      std::sort(row.begin(), row.end());
      distinct_experts_[l] = std::adjacent_find(row.begin(), row.end()) == row.end();
    }
  }
  BuildExpertTables();
}

void V4Moe::Mlp(const MlpWeights& w, int64_t rows, const float* h, float* out, bool accumulate,
                bool fused) {
  const int64_t H = config_.hidden_size, I = w.inter;
  const WeightView gate_up = weights_->Matrix(w.gate_up), down = weights_->Matrix(w.down);
  // Prefill with bf16 weights: the gate / up values and the activation in bf16 where the backend
  // writes them so (Backend::GateUpSiluMulBf16 with the clamp), as HF's bf16 model rounds them;
  // half the bytes of the fp32 path between the GEMMs and no rounding pass before down.
  if (fused && rows >= kBf16MlpMinRows && gate_up.dtype == WeightDType::kBFloat16 &&
      down.dtype == WeightDType::kBFloat16) {
    auto act16 = backend_->AllocateScratch(rows * I * sizeof(uint16_t));
    if (backend_->GateUpSiluMulBf16(rows, I, H, h, H, gate_up, H,
                                    static_cast<float>(config_.swiglu_limit),
                                    act16->as<uint16_t>())) {
      backend_->Gemm(rows, H, I, ActivationView::Bf16(act16->as<uint16_t>()), I, down, I, out, H,
                     accumulate);
      return;
    }
  }
  auto gu = Floats(rows * 2 * I);
  backend_->Gemm(rows, 2 * I, H, h, H, gate_up, H, gu->as<float>(), 2 * I, false);
  auto act = Floats(rows * I);
  backend_->v4_ops()->SwiGluClamped(rows, I, gu->as<float>(),
                                    static_cast<float>(config_.swiglu_limit), act->as<float>());
  backend_->Gemm(rows, H, I, act->as<float>(), I, down, I, out, H, accumulate);
}

bool V4Moe::ExpertsOnDevice(int64_t layer, int64_t rows, const float* h, const int32_t* topk_ids,
                            const float* topk_w, float* out, bool fused) {
  if (tables_.empty()) return false;
  const DeepseekV4Config& c = config_;
  const ExpertTables& t = tables_[layer];
  const MlpWeights& shared = layers_[layer].weights->shared;
  RoutedExpertsArgs a;
  a.num_tokens = static_cast<int32_t>(rows);
  a.top_k = static_cast<int32_t>(c.num_experts_per_tok);
  a.num_experts = static_cast<int32_t>(c.n_routed_experts);
  a.hidden_size = c.hidden_size;
  a.inter = c.moe_intermediate_size;
  a.hidden = h;
  a.topk_ids = topk_ids;
  a.topk_weights = topk_w;
  a.slot_of_expert = expert_slots_->as<int32_t>();
  a.gate_up = static_cast<const void* const*>(t.gate_up->data());
  a.down = static_cast<const void* const*>(t.down->data());
  a.gate_up_host = t.gate_up_host.data();
  a.down_host = t.down_host.data();
  a.dtype = t.dtype;
  a.out = out;
  a.swiglu_limit = static_cast<float>(c.swiglu_limit);
  if (a.mxfp4()) {
    a.gate_up_mx_scales = static_cast<const uint8_t* const*>(t.gate_up_scales->data());
    a.down_mx_scales = static_cast<const uint8_t* const*>(t.down_scales->data());
    a.gate_up_scale_ld = t.gate_up_scale_ld;
    a.down_scale_ld = t.down_scale_ld;
    // The shared expert stays in the matrix dtype: not in `a`, added after the routed sum.
    if (!backend_->RoutedExperts(a)) return false;
    Mlp(shared, rows, h, out, /*accumulate=*/true, fused);
    return true;
  }
  a.shared_inter = shared.inter;
  a.shared_gate_up = weights_->Matrix(shared.gate_up).data;
  a.shared_down = weights_->Matrix(shared.down).data;
  // The fused block merges the experts of a batch's tokens, which needs each token's experts
  // distinct.
  if (fused && distinct_experts_[layer] && backend_->RoutedAndSharedExperts(a)) return true;
  if (!backend_->RoutedExperts(a)) return false;
  // The shared expert after the routed sum, as HF adds them.
  Mlp(shared, rows, h, out, /*accumulate=*/true, fused);
  return true;
}

absl::Status V4Moe::Forward(int64_t layer, int64_t rows, const float* h, const int32_t* ids,
                            float* out, const Mode& mode) {
  const DeepseekV4Config& c = config_;
  const LayerWeights& L = *layers_[layer].weights;
  const int64_t H = c.hidden_size, E = c.n_routed_experts, K = c.num_experts_per_tok;
  const int64_t I = c.moe_intermediate_size;
  // No rows: nothing to compute, but an expert-parallel dispatcher still takes part in the
  // ranks' exchange.
  if (rows == 0 && !tables_.empty()) return absl::OkStatus();
  auto topk_ids = backend_->AllocateScratch(std::max<int64_t>(1, rows * K) * sizeof(int32_t));
  auto topk_w = Floats(rows * K);
  V4RouteArgs r;
  r.rows = rows;
  r.experts = E;
  r.top_k = K;
  r.bias = L.router_bias != nullptr ? L.router_bias->as<float>() : nullptr;
  const DeviceBuffer* table = layers_[layer].hash_table;
  r.hash_table = table != nullptr ? table->as<int32_t>() : nullptr;
  r.token_ids = ids;
  r.sqrtsoftplus = c.scoring_func == "sqrtsoftplus";
  r.scaling = static_cast<float>(c.routed_scaling_factor);
  r.topk_ids = topk_ids->as<int32_t>();
  r.topk_weights = topk_w->as<float>();
  V4RouteFromHiddenArgs fused;
  fused.route = r;
  fused.hidden = h;
  fused.hidden_size = H;
  fused.router_weight = L.router->as<float>();
  std::unique_ptr<DeviceBuffer> logits;
  if (rows > 0 && !backend_->v4_ops()->RouteFromHidden(fused)) {
    logits = Floats(rows * E);
    backend_->Gemm(rows, E, H, h, H, WeightView(L.router->as<float>()), H, logits->as<float>(), E,
                   false);
    r.logits = logits->as<float>();
    backend_->v4_ops()->Route(r);
  }
  // EPLB load statistics, on the device (read back by TakeExpertCounts), once the experts' path
  // is known: a refused device-only step counts nothing.
  auto count = [&] {
    if (rows == 0) return;
    backend_->AccumulateExpertCounts(rows * K, topk_ids->as<int32_t>(), E, mode.counted,
                                     expert_counts_->as<int64_t>() + layer * E);
  };
  if (ExpertsOnDevice(layer, rows, h, topk_ids->as<int32_t>(), topk_w->as<float>(), out,
                      mode.fused)) {
    count();
    return absl::OkStatus();
  }
  if (mode.device_only) {
    return absl::FailedPreconditionError(
        absl::StrCat("the backend cannot run the routed experts of ", rows,
                     " tokens on the device (Backend::RoutedExperts)"));
  }
  for (const auto& [e, m] : L.experts) {
    if (m.gate_up.mxfp4() || m.down.mxfp4()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "DeepSeek-V4 MoE layer ", layer, ": routed expert ", e,
          " is kept in MXFP4, which only Backend::RoutedExperts with one rank hosting every "
          "expert runs (not the dispatcher's per-expert GEMMs); the backend did not run these ",
          rows, " tokens so"));
    }
  }
  count();
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
  if (rows > 0) Mlp(L.shared, rows, h, out, /*accumulate=*/true, mode.fused);
  return absl::OkStatus();
}

// One rank with every expert, all in bf16 (fp32 is the parity mode, where the dispatcher keeps
// one rank bit-identical to expert parallelism): device tables for Backend::RoutedExperts.
void V4Moe::BuildExpertTables() {
  if (drop_graphs_) drop_graphs_();  // they hold the tables' addresses
  tables_.clear();
  const int64_t E = config_.n_routed_experts;
  const int64_t num_layers = static_cast<int64_t>(layers_.size());
  if (dispatcher_ == nullptr || !dispatcher_->single_rank() ||
      weights_->moe.matrix_dtype != WeightDType::kBFloat16 || num_layers == 0 ||
      static_cast<int64_t>(dispatcher_->local_experts(0).size()) != E) {
    return;
  }
  std::vector<ExpertTables> tables(num_layers);
  for (int64_t l = 0; l < num_layers; ++l) {
    const LayerWeights& L = *layers_[l].weights;
    std::vector<const void*> gate_up(E), down(E), gate_up_scales(E), down_scales(E);
    int64_t mx = 0;  // experts with both matrices MXFP4
    for (int64_t e = 0; e < E; ++e) {
      auto it = L.experts.find(e);
      if (it == L.experts.end() || it->second.gate_up.fp8() || it->second.down.fp8()) return;
      const MlpWeights& m = it->second;
      if (m.gate_up.mxfp4() != m.down.mxfp4()) return;
      gate_up[e] = m.gate_up->data();
      down[e] = m.down->data();
      if (m.gate_up.mxfp4()) {
        ++mx;
        gate_up_scales[e] = m.gate_up.mx_scales->data();
        down_scales[e] = m.down.mx_scales->data();
      }
    }
    if (L.shared.gate_up.fp8() || L.shared.down.fp8() || (mx != 0 && mx != E)) return;
    ExpertTables& t = tables[l];
    if (mx == E) {
      t.dtype = WeightDType::kMxfp4E2M1;
      t.gate_up_scales = Pointers(gate_up_scales);
      t.down_scales = Pointers(down_scales);
      t.gate_up_scale_ld = L.experts.at(0).gate_up.scale_ld;
      t.down_scale_ld = L.experts.at(0).down.scale_ld;
    } else {
      t.dtype = weights_->moe.matrix_dtype;
    }
    t.gate_up = Pointers(gate_up);
    t.down = Pointers(down);
    t.gate_up_host = std::move(gate_up);
    t.down_host = std::move(down);
  }
  std::vector<int32_t> slots(E);
  for (int64_t e = 0; e < E; ++e) slots[e] = static_cast<int32_t>(e);
  expert_slots_ = backend_->Allocate(E * sizeof(int32_t));
  backend_->CopyToDevice(slots.data(), E * sizeof(int32_t), expert_slots_->data());
  tables_ = std::move(tables);
}

std::unique_ptr<DeviceBuffer> V4Moe::Pointers(const std::vector<const void*>& host) {
  auto buf = backend_->Allocate(std::max<size_t>(1, host.size()) * sizeof(void*));
  backend_->CopyToDevice(host.data(), host.size() * sizeof(void*), buf->data());
  return buf;
}

std::vector<int64_t> V4Moe::TakeExpertCounts() {
  const size_t n = layers_.size() * static_cast<size_t>(config_.n_routed_experts);
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
  for (size_t l = 0; l < needed.size() && l < layers_.size(); ++l) {
    for (int64_t e : needed[l]) {
      if (!layers_[l].weights->experts.count(e) &&
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
  const int64_t layers = static_cast<int64_t>(layers_.size());
  if (static_cast<int64_t>(needed.size()) != layers ||
      static_cast<int64_t>(loaded.size()) != layers) {
    return absl::InvalidArgumentError(absl::StrCat("expert placement for ", needed.size(),
                                                   " MoE layers, the model has ", layers));
  }
  for (int64_t l = 0; l < layers; ++l) {
    for (const auto& [e, m] : layers_[l].weights->experts) {
      if (m.gate_up.mxfp4() || m.down.mxfp4()) {
        return absl::UnimplementedError(absl::StrCat(
            "DeepSeek-V4 MoE layer ", l,
            ": an expert placement change with routed experts kept "
            "in MXFP4 (--dtype mxfp4) is not supported; experts are reloaded in the matrix dtype"));
      }
    }
    for (int64_t e : needed[l]) {
      if (!layers_[l].weights->experts.count(e) && !loaded[l].count(e)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "expert ", e, " of layer ", l, " is needed by the new placement but not loaded"));
      }
    }
  }
  if (absl::Status st = dispatcher_->SetPlacement(std::move(placement)); !st.ok()) return st;
  for (int64_t l = 0; l < layers; ++l) {
    std::map<int64_t, MlpWeights>& experts = layers_[l].weights->experts;
    std::map<int64_t, MlpWeights> kept;
    for (int64_t e : needed[l]) {
      if (kept.count(e)) continue;
      auto old = experts.find(e);
      kept[e] = old != experts.end() ? std::move(old->second) : std::move(loaded[l][e]);
    }
    experts = std::move(kept);
  }
  BuildExpertTables();
  return absl::OkStatus();
}

}  // namespace deepinfer
