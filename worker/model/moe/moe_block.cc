// MoeBlock: routing, routed experts (on the device or through the dispatcher), shared experts,
// expert counts and placement switches.
#include "worker/model/moe/moe_block.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/backend/ops/mlp_ops.h"
#include "worker/backend/ops/moe_ops.h"
#include "worker/model/layers/swiglu_mlp.h"
#include "worker/model/moe/noaux_tc_router.h"

namespace deepinfer {

MoeBlock::MoeBlock(const ModelConfig& config, ModelWeights* weights, Backend* backend,
                   std::unique_ptr<ExpertDispatcher> dispatcher, std::function<void()> drop_graphs,
                   int64_t first_layer, int64_t num_layers)
    : config_(config),
      weights_(weights),
      backend_(backend),
      dispatcher_(std::move(dispatcher)),
      drop_graphs_(std::move(drop_graphs)),
      first_layer_(first_layer),
      end_layer_(num_layers < 0 ? config.num_hidden_layers : first_layer + num_layers) {
  BuildExpertTables();
  moe_index_.assign(weights_->layers.size(), -1);
  for (int64_t l = first_layer_; l < end_layer_; ++l) {
    if (weights_->layers[l].moe) moe_index_[l] = num_moe_layers_++;
  }
  if (num_moe_layers_ > 0) {
    expert_counts_ =
        backend_->Allocate(num_moe_layers_ * config_.n_routed_experts * sizeof(int64_t));
  }
}

absl::Status MoeBlock::Forward(int64_t layer, int64_t rows, const float* h, ActivationView h_gemm,
                               float* out, const LayerContext& ctx, const ResidualNorm* norm) {
  Staged s;
  absl::StatusOr<ExpertDispatcher::Exchange> x =
      BeginStaged(layer, rows, h, h_gemm, out, ctx, norm, &s);
  if (!x.ok()) return x.status();
  if (s.done) return absl::OkStatus();
  if (*x) {
    if (absl::Status st = (*x)(); !st.ok()) return st;
  }
  x = ExpertsStaged(&s);
  if (!x.ok()) return x.status();
  if (*x) {
    if (absl::Status st = (*x)(); !st.ok()) return st;
  }
  return FinishStaged(&s);
}

absl::StatusOr<ExpertDispatcher::Exchange> MoeBlock::BeginStaged(
    int64_t layer, int64_t rows, const float* h, ActivationView h_gemm, float* out,
    const LayerContext& ctx, const ResidualNorm* norm, Staged* s) {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_->layers[layer];
  const int64_t H = c.hidden_size, E = c.n_routed_experts, K = c.num_experts_per_tok;
  const int64_t moe = moe_index_[layer];
  s->layer = layer;
  s->rows = rows;
  s->h_gemm = h_gemm;
  s->out = out;
  s->mode = ctx.mode;
  s->done = false;
  s->topk_ids = backend_->AllocateScratch(rows * K * sizeof(int32_t));
  s->topk_w = Floats(rows * K);
  const int32_t* topk_ids = s->topk_ids->as<int32_t>();
  const float* topk_w = s->topk_w->as<float>();
  RouteTokensArgs ra =
      NoauxTcRouteArgs(c, L, rows, h, s->topk_ids->as<int32_t>(), s->topk_w->as<float>());
  if (norm != nullptr) {
    ra.norm.x = norm->x;
    ra.norm.y = norm->y;
    ra.norm.weight = norm->weight;
    ra.norm.eps = norm->eps;
    ra.norm.out = norm->out;
    ra.norm.out_bf16 = norm->out_bf16;
  }
  // EPLB load statistics, on the device (read back by TakeExpertCounts). A refused device-only
  // step must have counted nothing, so such a step counts in the routing op only for a size
  // whose routed experts the backend has run on the device before; otherwise after the path is
  // known, as its own op.
  int64_t* counts = expert_counts_->as<int64_t>() + moe * E;
  const bool count_in_route = !ctx.device_only || device_expert_rows_.count(rows) > 0;
  if (count_in_route) {
    ra.expert_counts = counts;
    ra.count_limit = ctx.counted_pairs;
  }
  backend_->RouteTokens(ra);
  auto count = [&] {
    if (count_in_route) return;
    backend_->AccumulateExpertCounts(rows * K, topk_ids, E, ctx.counted_pairs, counts);
  };

  // Expert parallelism over a device exchange: dispatch, this rank's experts on the received rows
  // and combine, all on the device (the tables hold this rank's slots, BuildExpertTables).
  if (exchange_slots_ > 0) {
    absl::Status st = dispatcher_->RoutedExpertsOnDevice(
        moe, rows, h, topk_ids, topk_w, out,
        [&](int64_t n, const float* x, const int32_t* slot, float* y) {
          return ReceivedRowsExperts(layer, n, x, slot, y);
        });
    if (!st.ok()) return st;
    if (ctx.device_only) device_expert_rows_.insert(rows);
    count();
    if (c.n_shared_experts > 0) {
      AddSwiGlu(backend_, rows, H, MlpView(*weights_, L.shared), h_gemm, out, ctx.mode);
    }
    s->done = true;
    return ExpertDispatcher::Exchange();
  }
  if (!expert_tables_.empty()) {
    const RoutedExpertsArgs a = DeviceExpertsArgs(layer, rows, h, topk_ids, topk_w, out);
    if (ExpertsOnDevice(backend_, a, h_gemm, ctx.mode)) {
      if (ctx.device_only) device_expert_rows_.insert(rows);
      count();
      if (c.n_shared_experts > 0 && a.shared_inter == 0) {  // FP8 / MXFP4: not in the args
        AddSwiGlu(backend_, rows, H, MlpView(*weights_, L.shared), h_gemm, out, ctx.mode);
      }
      s->done = true;
      return ExpertDispatcher::Exchange();
    }
  }
  if (ctx.device_only) {
    return absl::FailedPreconditionError(
        absl::StrCat("the backend cannot run the routed experts of ", rows,
                     " tokens on the device (Backend::RoutedExperts)"));
  }
  count();
  return dispatcher_->BeginDispatch(moe, rows, K, h, topk_ids, topk_w, &s->dispatched);
}

absl::StatusOr<ExpertDispatcher::Exchange> MoeBlock::ExpertsStaged(Staged* s) {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_->layers[s->layer];
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
  DispatchedTokens& d = s->dispatched;
  if (absl::Status st = dispatcher_->FinishDispatch(&d); !st.ok()) return st;
  std::vector<WeightView> gate_up, down;
  for (int64_t e : dispatcher_->local_experts(moe_index_[s->layer])) {
    const MlpWeights& ew = L.experts.at(e);
    if (ew.gate_up.mxfp4() || ew.down.mxfp4()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "routed expert ", e, " of layer ", s->layer,
          " is kept in MXFP4, which only Backend::RoutedExperts with one rank hosting every "
          "expert runs (not the dispatcher's per-expert GEMMs)"));
    }
    gate_up.push_back(weights_->Matrix(ew.gate_up));
    down.push_back(weights_->Matrix(ew.down));
  }
  s->expert_out = Floats(std::max<int64_t>(1, d.num_rows) * H);
  if (d.num_rows > 0) {
    auto gu = Floats(d.num_rows * 2 * I);
    backend_->GroupedGemm(d.group_offsets, gate_up, 2 * I, H, d.hidden->as<float>(),
                          gu->as<float>());
    auto act = Floats(d.num_rows * I);
    backend_->SiluMul(d.num_rows, I, gu->as<float>(), act->as<float>());
    backend_->GroupedGemm(d.group_offsets, down, H, I, act->as<float>(),
                          s->expert_out->as<float>());
  }
  // out = routed sum (experts ascending) + shared experts, as HF and DeepSeek add them.
  auto zero = backend_->Allocate(s->rows * H * sizeof(float));
  backend_->CopyDeviceToDevice(zero->data(), s->rows * H * sizeof(float), s->out);
  return dispatcher_->BeginCombine(&d, s->expert_out->as<float>(), s->out);
}

absl::Status MoeBlock::FinishStaged(Staged* s) {
  const ModelConfig& c = config_;
  if (absl::Status st = dispatcher_->FinishCombine(&s->dispatched, s->out); !st.ok()) return st;
  if (c.n_shared_experts > 0) {
    AddSwiGlu(backend_, s->rows, c.hidden_size,
              MlpView(*weights_, weights_->layers[s->layer].shared), s->h_gemm, s->out, s->mode);
  }
  return absl::OkStatus();
}

RoutedExpertsArgs MoeBlock::DeviceExpertsArgs(int64_t layer, int64_t rows, const float* h,
                                              const int32_t* topk_ids, const float* topk_w,
                                              float* out) const {
  const ModelConfig& c = config_;
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
  a.gate_up = static_cast<const void* const*>(expert_tables_[layer].gate_up->data());
  a.down = static_cast<const void* const*>(expert_tables_[layer].down->data());
  a.gate_up_host = expert_tables_[layer].gate_up_host.data();
  a.down_host = expert_tables_[layer].down_host.data();
  const ExpertTables& t = expert_tables_[layer];
  a.dtype = t.dtype;
  if (t.dtype == WeightDType::kFp8E4M3) {
    a.gate_up_scales = static_cast<const float* const*>(t.gate_up_scales->data());
    a.down_scales = static_cast<const float* const*>(t.down_scales->data());
  } else if (t.dtype == WeightDType::kMxfp4E2M1) {
    a.gate_up_mx_scales = static_cast<const uint8_t* const*>(t.gate_up_scales->data());
    a.down_mx_scales = static_cast<const uint8_t* const*>(t.down_scales->data());
  }
  a.gate_up_scale_ld = t.gate_up_scale_ld;
  a.down_scale_ld = t.down_scale_ld;
  a.out = out;
  const MlpWeights& shared = weights_->layers[layer].shared;
  // The shared experts ride along in `dtype`: unquantised as the model's matrices, or FP8 (with
  // their block scales) beside FP8 experts; otherwise (MXFP4 experts, or a mix) the caller adds
  // them itself (Forward).
  const bool plain =
      a.dtype == weights_->matrix_dtype && !shared.gate_up.fp8() && !shared.down.fp8();
  const bool fp8 = a.fp8() && shared.gate_up.fp8() && shared.down.fp8();
  if (c.n_shared_experts > 0 && (plain || fp8)) {
    const WeightView gate_up = weights_->Matrix(shared.gate_up);
    const WeightView down = weights_->Matrix(shared.down);
    a.shared_inter = shared.inter;
    a.shared_gate_up = gate_up.data;
    a.shared_down = down.data;
    a.shared_gate_up_fp8 = gate_up.fp8;
    a.shared_down_fp8 = down.fp8;
  }
  return a;
}

std::vector<int64_t> MoeBlock::TakeExpertCounts() {
  const size_t n = static_cast<size_t>(num_moe_layers_ * config_.n_routed_experts);
  std::vector<int64_t> counts(n, 0);
  if (n == 0) return counts;
  backend_->CopyToHost(expert_counts_->data(), n * sizeof(int64_t), counts.data());
  const std::vector<int64_t> zero(n, 0);
  backend_->CopyToDevice(zero.data(), n * sizeof(int64_t), expert_counts_->data());
  return counts;
}

std::vector<std::vector<int64_t>> MoeBlock::MissingExperts(
    const std::vector<std::vector<int64_t>>& needed) const {
  std::vector<std::vector<int64_t>> missing(needed.size());
  for (int64_t l = first_layer_; l < end_layer_; ++l) {
    const int64_t moe = moe_index_[l];
    if (moe < 0 || moe >= static_cast<int64_t>(needed.size())) continue;
    for (int64_t e : needed[moe]) {
      if (!weights_->layers[l].experts.count(e) &&
          std::find(missing[moe].begin(), missing[moe].end(), e) == missing[moe].end()) {
        missing[moe].push_back(e);
      }
    }
  }
  return missing;
}

// The local experts of received rows: one choice per row (its local slot, weight 1: the output is
// the expert's, exactly), padding rows (slot -1) take no expert.
bool MoeBlock::ReceivedRowsExperts(int64_t layer, int64_t rows, const float* x, const int32_t* slot,
                                   float* y) {
  const ModelConfig& c = config_;
  if (ones_rows_ < rows) {
    std::vector<float> ones(rows, 1.0f);
    ones_ = backend_->Allocate(rows * sizeof(float));
    backend_->CopyToDevice(ones.data(), rows * sizeof(float), ones_->data());
    ones_rows_ = rows;
  }
  RoutedExpertsArgs a;
  a.num_tokens = static_cast<int32_t>(rows);
  a.top_k = 1;
  a.num_experts = static_cast<int32_t>(exchange_slots_);
  a.hidden_size = c.hidden_size;
  a.inter = c.moe_intermediate_size;
  a.hidden = x;
  a.topk_ids = slot;
  a.topk_weights = ones_->as<float>();
  a.keep_on_device = true;  // the same algorithm eager and recorded; no host copy
  a.slot_of_expert = expert_slots_->as<int32_t>();
  a.gate_up = static_cast<const void* const*>(expert_tables_[layer].gate_up->data());
  a.down = static_cast<const void* const*>(expert_tables_[layer].down->data());
  a.gate_up_host = expert_tables_[layer].gate_up_host.data();
  a.down_host = expert_tables_[layer].down_host.data();
  a.dtype = expert_tables_[layer].dtype;  // bf16 (BuildExpertTables)
  a.out = y;
  return backend_->RoutedExperts(a);
}

// Device tables for Backend::RoutedExperts, rebuilt whenever the experts' buffers may have
// changed (a placement switch): one rank with every expert (expert e in slot e), or this rank's
// slots of a device expert exchange. bf16 weights only: fp32 is the parity mode, and there the
// dispatcher path keeps one rank bit-identical to expert parallelism (same GEMM calls, same combine
// order; ep_expert_dispatcher_gpu_test).
void MoeBlock::BuildExpertTables() {
  if (drop_graphs_) drop_graphs_();  // they hold the tables' addresses
  expert_tables_.clear();
  device_expert_rows_.clear();
  exchange_slots_ = 0;
  if (dispatcher_ == nullptr || weights_->matrix_dtype != WeightDType::kBFloat16) return;
  const int64_t E = config_.n_routed_experts;
  const int64_t exchange = dispatcher_->device_exchange_slots();
  const bool every_expert =
      dispatcher_->single_rank() && static_cast<int64_t>(dispatcher_->local_experts(0).size()) == E;
  if (exchange <= 0 && !every_expert) return;
  const int64_t S = exchange > 0 ? exchange : E;
  std::vector<int32_t> slots(S);
  for (int64_t s = 0; s < S; ++s) slots[s] = static_cast<int32_t>(s);
  expert_slots_ = backend_->Allocate(S * sizeof(int32_t));
  backend_->CopyToDevice(slots.data(), S * sizeof(int32_t), expert_slots_->data());
  expert_tables_.resize(weights_->layers.size());
  // The block's MoE layers in order (moe_index_ is not filled yet when the constructor calls).
  for (int64_t l = first_layer_, moe = 0; l < end_layer_; ++l) {
    const LayerWeights& L = weights_->layers[l];
    if (!L.moe) continue;
    std::vector<int64_t> ids(S);
    if (exchange > 0) {
      const std::vector<int64_t>& local = dispatcher_->local_experts(moe++);
      if (local.empty() || static_cast<int64_t>(local.size()) > S) {
        expert_tables_.clear();
        return;
      }
      // Slots past the local experts never get a row; they point at the last one's weights so
      // that every table entry is a valid matrix.
      for (int64_t s = 0; s < S; ++s) ids[s] = local[std::min<int64_t>(s, local.size() - 1)];
    } else {
      for (int64_t e = 0; e < E; ++e) ids[e] = e;
    }
    // The exchange's received rows take the bf16 device path only (ReceivedRowsExperts); FP8
    // experts there go through the dispatcher's Dispatch / Combine.
    if (!LayerTables(L, ids, &expert_tables_[l]) ||
        (exchange > 0 && expert_tables_[l].dtype != WeightDType::kBFloat16)) {
      expert_tables_.clear();
      return;
    }
  }
  exchange_slots_ = exchange > 0 ? exchange : 0;
}

bool MoeBlock::LayerTables(const LayerWeights& L, const std::vector<int64_t>& ids,
                           ExpertTables* t) {
  const size_t n = ids.size();
  std::vector<const void*> gate_up(n), down(n), gate_up_scales(n), down_scales(n);
  size_t fp8 = 0, mx = 0;
  bool mixed = false;  // one MLP with FP8 and other matrices
  for (size_t s = 0; s < n; ++s) {
    const MlpWeights& m = L.experts.at(ids[s]);
    gate_up[s] = m.gate_up->data();
    down[s] = m.down->data();
    const bool both = m.gate_up.fp8() && m.down.fp8();
    const bool both_mx = m.gate_up.mxfp4() && m.down.mxfp4();
    fp8 += both ? 1 : 0;
    mx += both_mx ? 1 : 0;
    gate_up_scales[s] = both      ? m.gate_up.fp8_scales->data()
                        : both_mx ? m.gate_up.mx_scales->data()
                                  : nullptr;
    down_scales[s] = both      ? m.down.fp8_scales->data()
                     : both_mx ? m.down.mx_scales->data()
                               : nullptr;
    mixed |= !both && (m.gate_up.fp8() || m.down.fp8());
    mixed |= !both_mx && (m.gate_up.mxfp4() || m.down.mxfp4());
  }
  // Mixed storage: the dispatcher's per-expert GEMMs (which refuse MXFP4 experts).
  if (mixed || (fp8 != 0 && fp8 != n) || (mx != 0 && mx != n)) return false;
  t->dtype = fp8 == n  ? WeightDType::kFp8E4M3
             : mx == n ? WeightDType::kMxfp4E2M1
                       : weights_->matrix_dtype;
  t->gate_up = Pointers(gate_up);
  t->down = Pointers(down);
  if (fp8 == n || mx == n) {
    t->gate_up_scales = Pointers(gate_up_scales);
    t->down_scales = Pointers(down_scales);
    // Every expert has the same shapes, so the same scale strides.
    t->gate_up_scale_ld = L.experts.at(ids[0]).gate_up.scale_ld;
    t->down_scale_ld = L.experts.at(ids[0]).down.scale_ld;
  }
  t->gate_up_host = std::move(gate_up);
  t->down_host = std::move(down);
  return true;
}

std::unique_ptr<DeviceBuffer> MoeBlock::Pointers(const std::vector<const void*>& host) {
  auto buf = backend_->Allocate(std::max<size_t>(1, host.size()) * sizeof(void*));
  backend_->CopyToDevice(host.data(), host.size() * sizeof(void*), buf->data());
  return buf;
}

absl::Status MoeBlock::SwitchPlacement(std::shared_ptr<const ExpertPlacement> placement,
                                       const std::vector<std::vector<int64_t>>& needed,
                                       std::vector<std::map<int64_t, MlpWeights>> loaded) {
  if (dispatcher_ == nullptr) {
    return absl::FailedPreconditionError("expert placement for a model without routed experts");
  }
  if (static_cast<int64_t>(needed.size()) != num_moe_layers_ ||
      static_cast<int64_t>(loaded.size()) != num_moe_layers_) {
    return absl::InvalidArgumentError(absl::StrCat("expert placement for ", needed.size(),
                                                   " MoE layers, the model has ", num_moe_layers_));
  }
  // Check first, so that a bad switch changes nothing.
  for (int64_t l = first_layer_; l < end_layer_; ++l) {
    const int64_t moe = moe_index_[l];
    if (moe < 0) continue;
    for (int64_t e : needed[moe]) {
      if (!weights_->layers[l].experts.count(e) && !loaded[moe].count(e)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "expert ", e, " of layer ", l, " is needed by the new placement but not loaded"));
      }
    }
  }
  if (absl::Status st = dispatcher_->SetPlacement(std::move(placement)); !st.ok()) return st;
  for (int64_t l = first_layer_; l < end_layer_; ++l) {
    const int64_t moe = moe_index_[l];
    if (moe < 0) continue;
    std::map<int64_t, MlpWeights>& experts = weights_->layers[l].experts;
    std::map<int64_t, MlpWeights> kept;
    for (int64_t e : needed[moe]) {
      if (kept.count(e)) continue;
      auto old = experts.find(e);
      kept[e] = old != experts.end() ? std::move(old->second) : std::move(loaded[moe][e]);
    }
    experts = std::move(kept);  // experts no longer hosted are freed here
  }
  BuildExpertTables();
  return absl::OkStatus();
}

}  // namespace deepinfer
