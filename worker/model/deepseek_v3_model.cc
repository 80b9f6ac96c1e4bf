// DeepseekV3Model forward pass.
#include "worker/model/deepseek_v3_model.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/sampling/device_sampler.h"

namespace deepinfer {
namespace {

// HF and DeepSeek build q_a_layernorm / kv_a_layernorm without passing rms_norm_eps.
constexpr float kLatentNormEps = 1e-6f;

}  // namespace

struct DeepseekV3Model::StepContext {
  int64_t num_tokens = 0;
  // Device int32 arrays: per token, then block tables [sequences, max_blocks_per_seq].
  const int32_t* positions = nullptr;
  const int32_t* slots = nullptr;
  const int32_t* token_seq = nullptr;
  const int32_t* context_len = nullptr;
  const int32_t* block_tables = nullptr;
  int32_t max_blocks_per_seq = 0;
  KvBlockPool* cache = nullptr;
  std::vector<MlaSequenceSpan> spans;  // host copy of each sequence's rows, for MlaAttention
  // Device int32: how many (token, expert) pairs EPLB counts (a padded step's real tokens x
  // top_k); null: all of them.
  const int32_t* counted_pairs = nullptr;
  // Routed experts only through Backend::RoutedExperts (a recorded step cannot go through the
  // dispatcher, which needs the host): FAILED_PRECONDITION where that path refuses.
  bool device_only = false;
  // MlaAttentionArgs::max_context_hint (a recorded step: its context class's bound; 0: spans).
  int32_t max_context_hint = 0;
};

absl::StatusOr<std::unique_ptr<DeepseekV3Model>> DeepseekV3Model::Create(
    const ModelConfig& config, std::unique_ptr<ModelWeights> weights, Backend* backend,
    std::unique_ptr<ExpertDispatcher> dispatcher) {
  if (weights == nullptr ||
      static_cast<int64_t>(weights->layers.size()) != config.num_hidden_layers) {
    return absl::InvalidArgumentError("DeepseekV3Model: weights do not match the config");
  }
  if (config.n_routed_experts > 0 && dispatcher == nullptr) {
    return absl::InvalidArgumentError("DeepseekV3Model: a MoE model needs an ExpertDispatcher");
  }
  if (dispatcher != nullptr) {
    int64_t moe = 0;
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      if (!weights->layers[l].moe) continue;
      for (int64_t e : dispatcher->local_experts(moe++)) {
        if (!weights->layers[l].experts.count(e)) {
          return absl::InvalidArgumentError(
              absl::StrCat("DeepseekV3Model: dispatcher serves expert ", e, " of layer ", l,
                           " but its weights were not loaded"));
        }
      }
    }
  }
  return std::unique_ptr<DeepseekV3Model>(
      new DeepseekV3Model(config, std::move(weights), backend, std::move(dispatcher)));
}

Architecture DeepseekV3Model::Entry() {
  Architecture a;
  a.name = "DeepseekV3ForCausalLM";
  a.model_types = {"deepseek_v3", "kimi_k2"};  // Kimi-K2 and Moonlight reuse the architecture
  a.build = [](const ModelBuildArgs& args) -> absl::StatusOr<std::unique_ptr<CausalLm>> {
    const ModelConfig& config = *args.config;
    auto weights = ModelWeights::Load(config, args.source, args.backend, args.load);
    if (!weights.ok()) return weights.status();
    std::unique_ptr<ExpertDispatcher> dispatcher;
    if (config.n_routed_experts > 0) {
      auto made = args.make_dispatcher(config, **weights, args.backend);
      if (!made.ok()) return made.status();
      dispatcher = std::move(*made);
    }
    auto model = Create(config, std::move(*weights), args.backend, std::move(dispatcher));
    if (!model.ok()) return model.status();
    return std::unique_ptr<CausalLm>(std::move(*model));
  };
  a.weight_bytes = ModelWeights::DeviceBytes;
  a.activation_floats_per_token = [](const ModelConfig& c) {
    const int64_t H = c.hidden_size, nh = c.num_attention_heads, kvl = c.kv_lora_rank;
    const int64_t K = c.num_experts_per_tok, mi = c.moe_intermediate_size;
    // Floats live at once per token in each part of a layer.
    const int64_t attention = c.q_lora_rank + nh * c.qk_head_dim() + 2 * kvl + c.qk_rope_head_dim +
                              2 * nh * kvl + nh * c.v_head_dim +
                              std::max(nh * c.qk_head_dim(), nh * kvl) / 2;  // bf16 operand copy
    const int64_t dense = 3 * c.intermediate_size + c.intermediate_size / 2;
    const int64_t moe = c.n_routed_experts + 2 * K + 2 * K * H + 3 * K * mi + K * H / 2 + 2 * H +
                        3 * mi * c.n_shared_experts;
    // The residual stream and its neighbours, the largest part, the final norm and the logits.
    return 3 * H + std::max({attention, dense, moe}) + H + c.vocab_size;
  };
  a.cache_spec = [](const ModelConfig& c, WeightDType dtype) {
    return PagedLatentSpec(static_cast<int32_t>(c.num_hidden_layers),
                           static_cast<int32_t>(c.kv_lora_rank),
                           static_cast<int32_t>(c.qk_rope_head_dim), dtype);
  };
  return a;
}

DeepseekV3Model::DeepseekV3Model(const ModelConfig& config, std::unique_ptr<ModelWeights> weights,
                                 Backend* backend, std::unique_ptr<ExpertDispatcher> dispatcher)
    : config_(config),
      weights_(std::move(weights)),
      backend_(backend),
      dispatcher_(std::move(dispatcher)) {
  DecodeGraphModel graph_model;
  graph_model.forward = [this](const DecodeGraphInputs& in) { return DecodeForward(in); };
  // A MoE model's device-only step needs its routed experts on the device (else: dispatcher).
  graph_model.available = [this] { return num_moe_layers_ == 0 || !expert_tables_.empty(); };
  graph_model.context_break = [this](int64_t bucket) {
    return backend_->MlaDecodeContextBreak(static_cast<int32_t>(bucket));
  };
  graph_model.vocab_size = config_.vocab_size;
  graph_model.max_position_embeddings = config_.max_position_embeddings;
  graph_model.counted_per_row = config_.num_experts_per_tok;  // EPLB counts real rows only
  graphs_ = std::make_unique<DecodeGraphRunner>(backend_, std::move(graph_model));
  std::vector<float> inv = config_.RopeInvFreq();
  inv_freq_ = Floats(inv.size());
  backend_->CopyToDevice(inv.data(), inv.size() * sizeof(float), inv_freq_->data());
  rope_attention_factor_ = static_cast<float>(config_.RopeAttentionFactor());
  softmax_scale_ = static_cast<float>(config_.SoftmaxScale());
  BuildExpertTables();
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    moe_index_.push_back(weights_->layers[l].moe ? num_moe_layers_++ : -1);
  }
  if (num_moe_layers_ > 0) {
    expert_counts_ =
        backend_->Allocate(num_moe_layers_ * config_.n_routed_experts * sizeof(int64_t));
  }
}

DeepseekV3Model::~DeepseekV3Model() = default;

void DeepseekV3Model::SetDecodeGraphOptions(const DecodeGraphOptions& options) {
  graphs_->SetOptions(options);
}

void DeepseekV3Model::SetFusedOps(bool on) {
  fused_ops_ = on;
  graphs_->Drop();
}

std::vector<int64_t> DeepseekV3Model::TakeExpertCounts() {
  const size_t n = static_cast<size_t>(num_moe_layers_ * config_.n_routed_experts);
  std::vector<int64_t> counts(n, 0);
  if (n == 0) return counts;
  backend_->CopyToHost(expert_counts_->data(), n * sizeof(int64_t), counts.data());
  const std::vector<int64_t> zero(n, 0);
  backend_->CopyToDevice(zero.data(), n * sizeof(int64_t), expert_counts_->data());
  return counts;
}

std::vector<std::vector<int64_t>> DeepseekV3Model::MissingExperts(
    const std::vector<std::vector<int64_t>>& needed) const {
  std::vector<std::vector<int64_t>> missing(needed.size());
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
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

// One rank with every expert: device tables for Backend::RoutedExperts (expert e in slot e),
// rebuilt whenever the experts' buffers may have changed (a placement switch). bf16 weights
// only: fp32 is the parity mode, and there the dispatcher path keeps one rank bit-identical to
// expert parallelism (same GEMM calls, same combine order; ep_expert_dispatcher_gpu_test).
void DeepseekV3Model::BuildExpertTables() {
  graphs_->Drop();  // they hold the tables' addresses
  expert_tables_.clear();
  device_expert_rows_.clear();
  const int64_t E = config_.n_routed_experts;
  if (dispatcher_ != nullptr && dispatcher_->single_rank() &&
      weights_->matrix_dtype == WeightDType::kBFloat16 &&
      static_cast<int64_t>(dispatcher_->local_experts(0).size()) == E) {
    std::vector<int32_t> slots(E);
    for (int64_t e = 0; e < E; ++e) slots[e] = static_cast<int32_t>(e);
    expert_slots_ = backend_->Allocate(E * sizeof(int32_t));
    backend_->CopyToDevice(slots.data(), E * sizeof(int32_t), expert_slots_->data());
    expert_tables_.resize(config_.num_hidden_layers);
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
      const LayerWeights& L = weights_->layers[l];
      if (!L.moe) continue;
      std::vector<const void*> gate_up(E), down(E);
      for (int64_t e = 0; e < E; ++e) {
        gate_up[e] = L.experts.at(e).gate_up->data();
        down[e] = L.experts.at(e).down->data();
      }
      ExpertTables& t = expert_tables_[l];
      t.gate_up = backend_->Allocate(E * sizeof(void*));
      t.down = backend_->Allocate(E * sizeof(void*));
      backend_->CopyToDevice(gate_up.data(), E * sizeof(void*), t.gate_up->data());
      backend_->CopyToDevice(down.data(), E * sizeof(void*), t.down->data());
      t.gate_up_host = std::move(gate_up);
      t.down_host = std::move(down);
    }
  }
}

absl::Status DeepseekV3Model::SwitchPlacement(std::shared_ptr<const ExpertPlacement> placement,
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
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
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
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
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

KvCacheSpec DeepseekV3Model::CacheSpec() const {
  // bf16 weights: a bf16 cache too (fp32 stays fp32).
  return Entry().cache_spec(config_, backend_->weight_dtype());
}

absl::StatusOr<StepOutput> DeepseekV3Model::Step(const std::vector<SequenceStep>& batch,
                                                 KvBlockPool* cache) {
  const ModelConfig& c = config_;
  const KvBlockPoolOptions& co = cache->options();
  bool matches = co.spec.num_layers() == c.num_hidden_layers;
  for (int32_t l = 0; matches && l < c.num_hidden_layers; ++l) {
    const KvCacheGroupSpec& g = cache->LayerGroup(l);
    matches = g.kind == KvCacheKind::kPagedLatent && g.latent_dim == c.kv_lora_rank &&
              g.rope_dim == c.qk_rope_head_dim;
  }
  if (!matches) {
    return absl::InvalidArgumentError(absl::StrCat("DeepseekV3Model::Step: the KV cache (",
                                                   co.spec.ToString(), ") is not the model's (",
                                                   CacheSpec().ToString(), ")"));
  }
  if (std::optional<absl::StatusOr<StepOutput>> out = graphs_->Run(batch, cache)) {
    return *std::move(out);
  }
  // Host-side metadata for every new token.
  StepContext ctx;
  ctx.cache = cache;
  std::vector<int32_t> ids, positions, slots, token_seq, context_len, out_rows;
  int32_t max_blocks = 1;
  for (const SequenceStep& s : batch) {
    max_blocks = std::max<int32_t>(max_blocks, static_cast<int32_t>(s.block_table.size()));
  }
  std::vector<int32_t> tables(batch.size() * max_blocks, 0);
  for (size_t si = 0; si < batch.size(); ++si) {
    const SequenceStep& s = batch[si];
    if (s.tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", si, " has no new tokens"));
    }
    const int64_t end = s.position_offset + static_cast<int64_t>(s.tokens.size());
    if (s.position_offset < 0 || static_cast<int64_t>(s.block_table.size()) * co.block_size < end) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", si, ": block table of ", s.block_table.size(),
                       " blocks cannot hold ", end, " positions (block size ", co.block_size, ")"));
    }
    for (size_t b = 0; b < s.block_table.size(); ++b) {
      if (s.block_table[b] < 0 || s.block_table[b] >= co.num_blocks) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", si, ": bad block id ", s.block_table[b]));
      }
      tables[si * max_blocks + b] = s.block_table[b];
    }
    ctx.spans.push_back({static_cast<int32_t>(ids.size()), static_cast<int32_t>(s.tokens.size()),
                         static_cast<int32_t>(end)});
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      if (s.tokens[i] < 0 || s.tokens[i] >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", si, ": token id ", s.tokens[i], " outside the vocabulary"));
      }
      const int64_t pos = s.position_offset + static_cast<int64_t>(i);
      if (s.all_logits || i + 1 == s.tokens.size()) out_rows.push_back(ids.size());
      ids.push_back(s.tokens[i]);
      positions.push_back(static_cast<int32_t>(pos));
      slots.push_back(s.block_table[pos / co.block_size] * co.block_size + pos % co.block_size);
      token_seq.push_back(static_cast<int32_t>(si));
      context_len.push_back(static_cast<int32_t>(pos + 1));  // causal: itself and before
    }
  }
  const int64_t T = static_cast<int64_t>(ids.size());
  ctx.num_tokens = T;
  ctx.max_blocks_per_seq = max_blocks;
  auto upload_ints = [&](const std::vector<int32_t>& v) {
    auto buf = backend_->AllocateScratch(std::max<size_t>(1, v.size()) * sizeof(int32_t));
    backend_->CopyToDevice(v.data(), v.size() * sizeof(int32_t), buf->data());
    return buf;
  };
  auto ids_dev = upload_ints(ids);
  auto positions_dev = upload_ints(positions);
  auto slots_dev = upload_ints(slots);
  auto token_seq_dev = upload_ints(token_seq);
  auto context_len_dev = upload_ints(context_len);
  auto tables_dev = upload_ints(tables);
  ctx.positions = positions_dev->as<int32_t>();
  ctx.slots = slots_dev->as<int32_t>();
  ctx.token_seq = token_seq_dev->as<int32_t>();
  ctx.context_len = context_len_dev->as<int32_t>();
  ctx.block_tables = tables_dev->as<int32_t>();

  const int64_t H = c.hidden_size;
  auto x = Floats(T * H), y = Floats(T * H);
  float* xp = x->as<float>();
  if (absl::Status st = Layers(ctx, ids_dev->as<int32_t>(), xp, y->as<float>()); !st.ok()) {
    return st;
  }
  // Final norm and LM head only for the rows whose logits are wanted; the last layer's pending
  // output is added to those rows only (the final norm adds it: a prefill wants one row of each
  // prompt's thousands).
  const int64_t R = static_cast<int64_t>(out_rows.size());
  auto rows_dev = upload_ints(out_rows);
  auto sel = Floats(R * H);
  backend_->GatherRows(R, H, xp, rows_dev->as<int32_t>(), sel->as<float>());
  std::unique_ptr<DeviceBuffer> sel_y, normed;
  if (ResidualPending()) {
    sel_y = Floats(R * H);
    backend_->GatherRows(R, H, y->as<float>(), rows_dev->as<int32_t>(), sel_y->as<float>());
    normed = Floats(R * H);  // the norm's output may not alias x or y
  }
  auto sel16 = backend_->AllocateScratch(Bf16Operands() ? R * H * sizeof(uint16_t) : 1);
  const ActivationView head_in =
      FinalNorm(R, sel->as<float>(), sel_y != nullptr ? sel_y->as<float>() : nullptr,
                normed != nullptr ? normed->as<float>() : sel->as<float>(), sel16->as<uint16_t>());
  const int64_t V = c.vocab_size;
  auto logits = Floats(R * V);
  backend_->Gemm(R, V, H, head_in, H, weights_->Matrix(weights_->lm_head), H, logits->as<float>(),
                 V, false);
  return SampleOrCopyLogits(batch, logits->as<float>(), R);
}

absl::StatusOr<StepOutput> DeepseekV3Model::SampleOrCopyLogits(
    const std::vector<SequenceStep>& batch, const float* logits, int64_t rows) {
  const int64_t V = config_.vocab_size;
  // Sequences that want no logits are sampled on the device (DeviceSampler); the rows of those
  // that want logits, or more top logprobs than the device gives, are copied to the host.
  auto on_device = [](const SequenceStep& s) {
    return !s.return_logits && s.sampling.has_value() && DeviceSampler::Supports(*s.sampling);
  };
  auto needs_host = [&](const SequenceStep& s) {
    return s.return_logits || (s.sampling.has_value() && !on_device(s));
  };
  std::vector<RowSampleRequest> requests;
  std::vector<std::pair<int64_t, int64_t>> runs;  // (first logits row, rows) to copy
  int64_t wanted = 0;
  {
    int64_t row = 0;
    for (const SequenceStep& s : batch) {
      const int64_t n = s.all_logits ? static_cast<int64_t>(s.tokens.size()) : 1;
      if (on_device(s)) {
        RowSampleRequest q;
        q.row = row + n - 1;
        q.params = *s.sampling;
        q.position = s.position_offset + static_cast<int64_t>(s.tokens.size());
        requests.push_back(q);
      } else if (needs_host(s)) {
        // One copy per run of consecutive sequences that need their rows.
        if (!runs.empty() && runs.back().first + runs.back().second == row) {
          runs.back().second += n;
        } else {
          runs.emplace_back(row, n);
        }
        wanted += n;
      }
      row += n;
    }
  }
  auto sampled = DeviceSampler::Sample(backend_, logits, rows, V, requests);
  if (!sampled.ok()) return sampled.status();
  std::vector<float> host(wanted * V);  // the copied rows, in batch order
  int64_t at = 0;
  for (const auto& [first, n] : runs) {
    backend_->CopyToHost(logits + first * V, n * V * sizeof(float), host.data() + at * V);
    at += n;
  }
  // A GPU backend reports failed ops asynchronously; the copies above have waited for all of them.
  if (absl::Status st = backend_->status(); !st.ok()) return st;
  StepOutput out;
  int64_t host_row = 0;
  size_t device_i = 0;
  for (const SequenceStep& s : batch) {
    const int64_t n = s.all_logits ? static_cast<int64_t>(s.tokens.size()) : 1;
    SampledToken sampled_token;
    if (on_device(s)) {
      out.logits.emplace_back();
      sampled_token = std::move((*sampled)[device_i++]);
    } else if (!needs_host(s)) {
      out.logits.emplace_back();  // an intermediate prefill chunk: nothing to return
    } else {
      const float* host_rows = host.data() + host_row * V;
      host_row += n;
      if (s.return_logits) {
        out.logits.emplace_back(host_rows, host_rows + n * V);
      } else {
        out.logits.emplace_back();
      }
      if (s.sampling.has_value()) {
        auto tok = Sampler::Sample(host_rows + (n - 1) * V, static_cast<int32_t>(V), *s.sampling,
                                   s.position_offset + static_cast<int64_t>(s.tokens.size()));
        if (!tok.ok()) return tok.status();
        sampled_token = std::move(*tok);
      }
    }
    out.sampled.push_back(std::move(sampled_token));
  }
  return out;
}

absl::Status DeepseekV3Model::Layers(const StepContext& ctx, const int32_t* ids, float* xp,
                                     float* yp) {
  const ModelConfig& c = config_;
  const int64_t T = ctx.num_tokens, H = c.hidden_size;
  auto h = Floats(T * H);
  float* hp = h->as<float>();
  backend_->GatherRows(T, H, weights_->embed->as<float>(), ids, xp);
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (!fused_ops_) {
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const LayerWeights& L = weights_->layers[l];
      backend_->RmsNorm(T, H, xp, H, L.input_norm->as<float>(), eps, hp, H);
      Attention(l, ctx, hp, yp);
      backend_->Add(T * H, xp, yp, xp);
      backend_->RmsNorm(T, H, xp, H, L.post_attention_norm->as<float>(), eps, hp, H);
      absl::Status st = L.moe ? Moe(l, T, hp, hp, yp, ctx) : Mlp(L.dense, T, hp, yp, false);
      if (!st.ok()) return st;
      backend_->Add(T * H, xp, yp, xp);
    }
    return absl::OkStatus();
  }
  // Fused: each residual add happens inside the next norm, which also writes the bf16 operand
  // of the GEMMs that read it (bf16 weights).
  std::unique_ptr<DeviceBuffer> h16;
  ActivationView h_gemm(hp);
  if (Bf16Operands()) {
    h16 = backend_->AllocateScratch(T * H * sizeof(uint16_t));
    h_gemm = ActivationView::Bf16(h16->as<uint16_t>());
  }
  uint16_t* h16p = h16 != nullptr ? h16->as<uint16_t>() : nullptr;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& L = weights_->layers[l];
    // x += the previous layer's output (nothing to add before the first layer), normed inside
    // Attention with the GEMMs that read it.
    const InputNorm input_norm{xp,  l == 0 ? nullptr : yp,          L.input_norm->as<float>(),
                               eps, h16p != nullptr ? nullptr : hp, h16p};
    Attention(l, ctx, h_gemm, yp, &input_norm);
    // The MoE's router and routed experts read fp32 rows; the dense MLP only the GEMM operand.
    // A MoE layer's norm is part of its routing op (Backend::RouteTokens), which a backend may
    // run in one launch.
    absl::Status st;
    if (L.moe) {
      RouteTokensArgs::Norm norm;
      norm.x = xp;
      norm.y = yp;
      norm.weight = L.post_attention_norm->as<float>();
      norm.eps = eps;
      norm.out = hp;
      norm.out_bf16 = h16p;
      st = Moe(l, T, hp, h_gemm, yp, ctx, &norm);
    } else {
      // The norm and the MLP as one op where the backend has one (CUDA: one decode token,
      // fp32 activations), else the norm and Mlp's ops (the reference).
      DenseMlpArgs d;
      d.rows = T;
      d.hidden_size = H;
      d.inter = L.dense.inter;
      d.x = xp;
      d.y = yp;
      d.norm_weight = L.post_attention_norm->as<float>();
      d.eps = eps;
      d.normed = hp;
      d.gate_up = weights_->Matrix(L.dense.gate_up);
      d.down = weights_->Matrix(L.dense.down);
      d.out = yp;
      if (!backend_->NormedDenseMlp(d)) {
        backend_->AddRmsNorm(T, H, xp, yp, L.post_attention_norm->as<float>(), eps,
                             h16p == nullptr ? hp : nullptr, h16p);
        st = Mlp(L.dense, T, h_gemm, yp, false);
      }
    }
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

ActivationView DeepseekV3Model::FinalNorm(int64_t rows, float* x, const float* y, float* out,
                                          uint16_t* out_bf16) {
  const int64_t H = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const float* norm = weights_->final_norm->as<float>();
  if (!fused_ops_) {
    backend_->RmsNorm(rows, H, x, H, norm, eps, out, H);
    return out;
  }
  if (Bf16Operands()) {
    backend_->AddRmsNorm(rows, H, x, y, norm, eps, nullptr, out_bf16);
    return ActivationView::Bf16(out_bf16);
  }
  if (out == x) {
    // AddRmsNorm's output may not alias x: y is null here (Step adds it before gathering).
    backend_->RmsNorm(rows, H, x, H, norm, eps, out, H);
  } else {
    backend_->AddRmsNorm(rows, H, x, y, norm, eps, out, nullptr);
  }
  return out;
}

absl::Status DeepseekV3Model::DecodeForward(const DecodeGraphInputs& in) {
  const ModelConfig& c = config_;
  const int64_t B = in.rows, H = c.hidden_size, V = c.vocab_size;
  StepContext ctx;
  ctx.num_tokens = B;
  ctx.positions = in.positions;
  ctx.slots = in.slots;
  ctx.token_seq = in.token_seq;
  ctx.context_len = in.context_len;
  ctx.counted_pairs = in.counted;
  ctx.block_tables = in.block_tables;
  ctx.max_blocks_per_seq = in.max_blocks_per_seq;
  ctx.cache = in.cache;
  ctx.device_only = true;
  ctx.max_context_hint = in.max_context_hint;
  auto x = Floats(B * H), y = Floats(B * H);
  if (absl::Status st = Layers(ctx, in.ids, x->as<float>(), y->as<float>()); !st.ok()) return st;
  // Every row is a sequence's last token: final norm, LM head and greedy pick for all of them.
  auto sel = Floats(B * H);
  auto sel16 = backend_->AllocateScratch(Bf16Operands() ? B * H * sizeof(uint16_t) : 1);
  const ActivationView head_in =
      FinalNorm(B, x->as<float>(), ResidualPending() ? y->as<float>() : nullptr, sel->as<float>(),
                sel16->as<uint16_t>());
  auto logits = Floats(B * V);
  backend_->Gemm(B, V, H, head_in, H, weights_->Matrix(weights_->lm_head), H, logits->as<float>(),
                 V, false);
  backend_->GreedySampleRows(B, V, logits->as<float>(), in.out_tokens, in.out_logprobs);
  return absl::OkStatus();
}

void DeepseekV3Model::Attention(int64_t layer, const StepContext& ctx, ActivationView h, float* out,
                                const InputNorm* norm) {
  const ModelConfig& c = config_;
  const ModelWeights& W = *weights_;
  const LayerWeights& L = W.layers[layer];
  const int64_t T = ctx.num_tokens, H = c.hidden_size, nh = c.num_attention_heads;
  const int64_t nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, vd = c.v_head_dim;
  const int64_t kvl = c.kv_lora_rank, qk = c.qk_head_dim(), qdim = nh * qk;
  const int32_t* positions = ctx.positions;

  // Queries: [T, heads, nope | rope]; latent and shared rope key: [T, kv_lora | rope].
  auto q = Floats(T * qdim);
  const int64_t kvw = kvl + rope;
  auto kv = Floats(T * kvw);
  std::unique_ptr<DeviceBuffer> qa;
  if (c.q_lora_rank > 0) qa = Floats(T * c.q_lora_rank);
  if (norm != nullptr) {
    std::vector<NormedGemm> gemms;
    if (qa != nullptr) {
      gemms.push_back({c.q_lora_rank, W.Matrix(L.q_a), H, qa->as<float>(), c.q_lora_rank});
    } else {
      gemms.push_back({qdim, W.Matrix(L.q), H, q->as<float>(), qdim});
    }
    gemms.push_back({kvw, W.Matrix(L.kv_a), H, kv->as<float>(), kvw});
    backend_->AddRmsNormGemms(T, H, norm->x, norm->y, norm->weight, norm->eps, norm->normed,
                              norm->normed_bf16, gemms);
  }
  if (c.q_lora_rank > 0) {
    const int64_t r = c.q_lora_rank;
    if (norm == nullptr) {
      backend_->Gemm(T, r, H, h, H, W.Matrix(L.q_a), H, qa->as<float>(), r, false);
    }
    if (Bf16Operands()) {
      auto qa16 = backend_->AllocateScratch(T * r * sizeof(uint16_t));
      backend_->AddRmsNorm(T, r, qa->as<float>(), nullptr, L.q_a_norm->as<float>(), kLatentNormEps,
                           nullptr, qa16->as<uint16_t>());
      backend_->Gemm(T, qdim, r, ActivationView::Bf16(qa16->as<uint16_t>()), r, W.Matrix(L.q_b), r,
                     q->as<float>(), qdim, false);
    } else {
      backend_->RmsNorm(T, r, qa->as<float>(), r, L.q_a_norm->as<float>(), kLatentNormEps,
                        qa->as<float>(), r);
      backend_->Gemm(T, qdim, r, qa->as<float>(), r, W.Matrix(L.q_b), r, q->as<float>(), qdim,
                     false);
    }
  } else if (norm == nullptr) {
    backend_->Gemm(T, qdim, H, h, H, W.Matrix(L.q), H, q->as<float>(), qdim, false);
  }
  if (norm == nullptr) {
    backend_->Gemm(T, kvw, H, h, H, W.Matrix(L.kv_a), H, kv->as<float>(), kvw, false);
  }
  const bool il = c.rope_interleave;
  const PagedLatentCacheView view = ctx.cache->LayerView(static_cast<int32_t>(layer));
  const bool mha_prefill = UsesMhaPrefill(ctx);
  // The absorbed query (below): with fused ops in the same backend op as the cache write.
  std::unique_ptr<DeviceBuffer> q_latent;
  if (!mha_prefill) q_latent = Floats(T * nh * kvl);
  bool query_absorbed = false;
  if (fused_ops_) {
    NormRopeCacheArgs nr;
    nr.tokens = T;
    nr.kv = kv->as<float>();
    nr.ld_kv = kvw;
    nr.norm_weight = L.kv_a_norm->as<float>();
    nr.eps = kLatentNormEps;
    nr.q = q->as<float>() + nope;
    nr.q_heads = nh;
    nr.q_token_stride = qdim;
    nr.q_head_stride = qk;
    nr.positions = positions;
    nr.inv_freq = inv_freq_->as<float>();
    nr.attention_factor = rope_attention_factor_;
    nr.interleaved = il;
    nr.slots = ctx.slots;
    nr.cache = view;
    if (q_latent != nullptr) {
      AbsorbQueryArgs aq;
      aq.heads = nh;
      aq.nope_dim = nope;
      aq.latent_dim = kvl;
      aq.q_nope = q->as<float>();
      aq.q_token_stride = qdim;
      aq.q_head_stride = qk;
      aq.w_uk = W.Matrix(L.w_uk_t);
      aq.q_latent = q_latent->as<float>();
      backend_->NormRopeCacheAbsorbQuery(nr, aq);
      query_absorbed = true;
    } else {
      backend_->NormRopeWriteLatentCache(nr);
    }
  } else {
    auto latent = Floats(T * kvl);
    backend_->RmsNorm(T, kvl, kv->as<float>(), kvw, L.kv_a_norm->as<float>(), kLatentNormEps,
                      latent->as<float>(), kvl);
    backend_->ApplyRope(T, 1, kv->as<float>() + kvl, kvw, 0, rope, positions,
                        inv_freq_->as<float>(), rope_attention_factor_, il);
    backend_->ApplyRope(T, nh, q->as<float>() + nope, qdim, qk, rope, positions,
                        inv_freq_->as<float>(), rope_attention_factor_, il);
    backend_->WriteLatentCache(T, latent->as<float>(), kvl, kv->as<float>() + kvl, kvw, ctx.slots,
                               view);
  }

  if (mha_prefill && MhaPrefillAttention(layer, ctx, q->as<float>(), view, out)) return;

  // Absorb W_uk into the query: q_latent[t, h] = q_nope[t, h] · W_uk[h], all heads in one
  // batched GEMM (head h: the nope slice of q's head h, block h of w_uk_t, column block h).
  if (q_latent == nullptr) q_latent = Floats(T * nh * kvl);  // MHA prefill declined the batch
  if (!query_absorbed) {
    backend_->BatchedGemm(nh, T, kvl, nope, q->as<float>(), qdim, qk, W.Matrix(L.w_uk_t), nope,
                          kvl * nope, q_latent->as<float>(), nh * kvl, kvl);
  }
  auto o_latent = Floats(T * nh * kvl);
  MlaAttentionArgs args;
  args.num_tokens = static_cast<int32_t>(T);
  args.num_heads = static_cast<int32_t>(nh);
  args.q_latent = q_latent->as<float>();
  args.q_rope = q->as<float>() + nope;
  args.q_rope_token_stride = qdim;
  args.q_rope_head_stride = qk;
  args.cache = view;
  args.block_tables = ctx.block_tables;
  args.max_blocks_per_seq = ctx.max_blocks_per_seq;
  args.token_seq = ctx.token_seq;
  args.context_len = ctx.context_len;
  args.softmax_scale = softmax_scale_;
  args.out_latent = o_latent->as<float>();
  args.sequences = ctx.spans.data();
  args.num_sequences = static_cast<int32_t>(ctx.spans.size());
  args.max_context_hint = ctx.max_context_hint;
  backend_->MlaAttention(args);

  // Lift back through W_uv (value half of kv_b, rows h*(nope+v)+nope ..) and project out.
  auto o = Floats(T * nh * vd);
  backend_->BatchedGemm(nh, T, vd, kvl, o_latent->as<float>(), nh * kvl, kvl,
                        W.Matrix(L.kv_b).Offset(nope * kvl), kvl, (nope + vd) * kvl, o->as<float>(),
                        nh * vd, vd);
  backend_->Gemm(T, H, nh * vd, o->as<float>(), nh * vd, W.Matrix(L.o_proj), nh * vd, out, H,
                 false);
}

bool DeepseekV3Model::UsesMhaPrefill(const StepContext& ctx) const {
  if (prefill_attention_ == PrefillAttention::kAbsorbed || ctx.device_only || ctx.spans.empty()) {
    return false;
  }
  const int32_t min_tokens =
      prefill_attention_ == PrefillAttention::kMha ? 2 : kMhaPrefillMinTokens;
  for (const MlaSequenceSpan& s : ctx.spans) {
    if (s.num_tokens < min_tokens) return false;
  }
  return true;
}

bool DeepseekV3Model::MhaPrefillAttention(int64_t layer, const StepContext& ctx, const float* q,
                                          const PagedLatentCacheView& view, float* out) {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_->layers[layer];
  const int64_t T = ctx.num_tokens, H = c.hidden_size, nh = c.num_attention_heads;
  const int64_t vd = c.v_head_dim, qk = c.qk_head_dim();
  const bool bf16_out = Bf16Operands();
  auto o = backend_->AllocateScratch(T * nh * vd * (bf16_out ? sizeof(uint16_t) : sizeof(float)));
  MhaPrefillArgs args;
  args.num_tokens = static_cast<int32_t>(T);
  args.num_heads = static_cast<int32_t>(nh);
  args.nope_dim = static_cast<int32_t>(c.qk_nope_head_dim);
  args.v_dim = static_cast<int32_t>(vd);
  args.q = q;
  args.q_token_stride = nh * qk;
  args.q_head_stride = qk;
  args.cache = view;
  args.block_tables = ctx.block_tables;
  args.max_blocks_per_seq = ctx.max_blocks_per_seq;
  args.kv_b = weights_->Matrix(L.kv_b);
  args.sequences = ctx.spans.data();
  args.num_sequences = static_cast<int32_t>(ctx.spans.size());
  args.softmax_scale = softmax_scale_;
  if (bf16_out) {
    args.out_bf16 = o->as<uint16_t>();
  } else {
    args.out = o->as<float>();
  }
  if (!backend_->MhaPrefillAttention(args)) return false;
  const ActivationView o_view =
      bf16_out ? ActivationView::Bf16(o->as<uint16_t>()) : ActivationView(o->as<float>());
  backend_->Gemm(T, H, nh * vd, o_view, nh * vd, weights_->Matrix(L.o_proj), nh * vd, out, H,
                 false);
  return true;
}

absl::Status DeepseekV3Model::Mlp(const MlpWeights& w, int64_t rows, ActivationView h, float* out,
                                  bool accumulate) {
  const int64_t H = config_.hidden_size, I = w.inter;
  if (Bf16Operands()) {
    auto act16 = backend_->AllocateScratch(rows * I * sizeof(uint16_t));
    // The backend's bf16-output gate_up where it has one (CUDA: prefill sizes), else fp32
    // gate_up values into SiLU-mul.
    if (!backend_->GateUpSiluMulBf16(rows, I, H, h, H, weights_->Matrix(w.gate_up), H,
                                     act16->as<uint16_t>())) {
      auto gu = Floats(rows * 2 * I);
      backend_->Gemm(rows, 2 * I, H, h, H, weights_->Matrix(w.gate_up), H, gu->as<float>(), 2 * I,
                     false);
      backend_->SiluMulBf16(rows, I, gu->as<float>(), act16->as<uint16_t>());
    }
    backend_->Gemm(rows, H, I, ActivationView::Bf16(act16->as<uint16_t>()), I,
                   weights_->Matrix(w.down), I, out, H, accumulate);
    return absl::OkStatus();
  }
  auto gu = Floats(rows * 2 * I);
  backend_->Gemm(rows, 2 * I, H, h, H, weights_->Matrix(w.gate_up), H, gu->as<float>(), 2 * I,
                 false);
  auto act = Floats(rows * I);
  backend_->SiluMul(rows, I, gu->as<float>(), act->as<float>());
  backend_->Gemm(rows, H, I, act->as<float>(), I, weights_->Matrix(w.down), I, out, H, accumulate);
  return absl::OkStatus();
}

absl::Status DeepseekV3Model::Moe(int64_t layer, int64_t rows, const float* h,
                                  ActivationView h_gemm, float* out, const StepContext& ctx,
                                  const RouteTokensArgs::Norm* norm) {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_->layers[layer];
  const int64_t H = c.hidden_size, E = c.n_routed_experts, K = c.num_experts_per_tok;
  const int64_t I = c.moe_intermediate_size;
  const int64_t moe = moe_index_[layer];
  auto topk_ids = backend_->AllocateScratch(rows * K * sizeof(int32_t));
  auto topk_w = Floats(rows * K);
  RouteTokensArgs ra;
  ra.hidden_size = H;
  ra.hidden = h;
  if (norm != nullptr) ra.norm = *norm;
  ra.router_weight = L.router->as<float>();
  ra.route.num_tokens = static_cast<int32_t>(rows);
  ra.route.num_experts = static_cast<int32_t>(E);
  ra.route.correction_bias = L.router_bias->as<float>();
  ra.route.num_groups = static_cast<int32_t>(c.n_group);
  ra.route.topk_groups = static_cast<int32_t>(c.topk_group);
  ra.route.top_k = static_cast<int32_t>(K);
  ra.route.normalize = c.norm_topk_prob;
  ra.route.scaling_factor = static_cast<float>(c.routed_scaling_factor);
  ra.route.topk_ids = topk_ids->as<int32_t>();
  ra.route.topk_weights = topk_w->as<float>();
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
    backend_->AccumulateExpertCounts(rows * K, topk_ids->as<int32_t>(), E, ctx.counted_pairs,
                                     counts);
  };

  absl::Status st;
  bool shared_done = false;
  if (!expert_tables_.empty() && RoutedExpertsOnDevice(layer, rows, h, topk_ids->as<int32_t>(),
                                                       topk_w->as<float>(), out, &shared_done)) {
    if (ctx.device_only) device_expert_rows_.insert(rows);
    count();
    if (shared_done) return absl::OkStatus();
    return SharedExperts(L, rows, h_gemm, out);
  }
  if (ctx.device_only) {
    return absl::FailedPreconditionError(
        absl::StrCat("the backend cannot run the routed experts of ", rows,
                     " tokens on the device (Backend::RoutedExperts)"));
  }
  count();
  DispatchedTokens d;
  st = dispatcher_->Dispatch(moe, rows, K, h, topk_ids->as<int32_t>(), topk_w->as<float>(), &d);
  if (!st.ok()) return st;
  std::vector<WeightView> gate_up, down;
  for (int64_t e : dispatcher_->local_experts(moe)) {
    const MlpWeights& ew = L.experts.at(e);
    gate_up.push_back(weights_->Matrix(ew.gate_up));
    down.push_back(weights_->Matrix(ew.down));
  }
  auto expert_out = Floats(std::max<int64_t>(1, d.num_rows) * H);
  if (d.num_rows > 0) {
    auto gu = Floats(d.num_rows * 2 * I);
    backend_->GroupedGemm(d.group_offsets, gate_up, 2 * I, H, d.hidden->as<float>(),
                          gu->as<float>());
    auto act = Floats(d.num_rows * I);
    backend_->SiluMul(d.num_rows, I, gu->as<float>(), act->as<float>());
    backend_->GroupedGemm(d.group_offsets, down, H, I, act->as<float>(), expert_out->as<float>());
  }
  // out = routed sum (experts ascending) + shared experts, as HF and DeepSeek add them.
  auto zero = backend_->Allocate(rows * H * sizeof(float));
  backend_->CopyDeviceToDevice(zero->data(), rows * H * sizeof(float), out);
  st = dispatcher_->Combine(d, expert_out->as<float>(), out);
  if (!st.ok()) return st;
  return SharedExperts(L, rows, h_gemm, out);
}

bool DeepseekV3Model::RoutedExpertsOnDevice(int64_t layer, int64_t rows, const float* h,
                                            const int32_t* topk_ids, const float* topk_w,
                                            float* out, bool* shared_done) {
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
  a.dtype = weights_->matrix_dtype;
  a.out = out;
  *shared_done = false;
  // The shared experts in the same op where the backend can (decode); fused ops only, so the
  // op-by-op mode keeps the separate shared-expert ops.
  if (fused_ops_ && c.n_shared_experts > 0) {
    const MlpWeights& shared = weights_->layers[layer].shared;
    a.shared_inter = shared.inter;
    a.shared_gate_up = weights_->Matrix(shared.gate_up).data;
    a.shared_down = weights_->Matrix(shared.down).data;
    if (backend_->RoutedAndSharedExperts(a)) {
      *shared_done = true;
      return true;
    }
  }
  return backend_->RoutedExperts(a);
}

// out += shared experts(h), after the routed sum, as HF and DeepSeek add them.
absl::Status DeepseekV3Model::SharedExperts(const LayerWeights& L, int64_t rows, ActivationView h,
                                            float* out) {
  if (config_.n_shared_experts == 0) return absl::OkStatus();
  // Fused: the down projection adds into out itself (one fp32 addition per element, as Add).
  if (fused_ops_) return Mlp(L.shared, rows, h, out, /*accumulate=*/true);
  const int64_t H = config_.hidden_size;
  auto shared = Floats(rows * H);
  absl::Status st = Mlp(L.shared, rows, h, shared->as<float>(), false);
  if (!st.ok()) return st;
  backend_->Add(rows * H, out, shared->as<float>(), out);
  return absl::OkStatus();
}

}  // namespace deepinfer
