// DeepseekV3Model forward pass.
#include "worker/model/deepseek_v3_model.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/model/layers/swiglu_mlp.h"
#include "worker/sampling/device_sampler.h"

namespace deepinfer {
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
  a.cache_spec = MlaAttention::CacheSpec;
  return a;
}

DeepseekV3Model::DeepseekV3Model(const ModelConfig& config, std::unique_ptr<ModelWeights> weights,
                                 Backend* backend, std::unique_ptr<ExpertDispatcher> dispatcher)
    : config_(config), weights_(std::move(weights)), backend_(backend) {
  DecodeGraphModel graph_model;
  graph_model.forward = [this](const DecodeGraphInputs& in) { return DecodeForward(in); };
  // A MoE model's device-only step needs its routed experts on the device (else: dispatcher).
  graph_model.available = [this] {
    return moe_->num_moe_layers() == 0 || moe_->experts_on_device();
  };
  graph_model.context_break = [this](int64_t bucket) {
    return backend_->MlaDecodeContextBreak(static_cast<int32_t>(bucket));
  };
  graph_model.vocab_size = config_.vocab_size;
  graph_model.max_position_embeddings = config_.max_position_embeddings;
  graph_model.counted_per_row = config_.num_experts_per_tok;  // EPLB counts real rows only
  graphs_ = std::make_unique<DecodeGraphRunner>(backend_, std::move(graph_model));
  attention_ = std::make_unique<MlaAttention>(config_, weights_.get(), backend_);
  moe_ = std::make_unique<MoeBlock>(config_, weights_.get(), backend_, std::move(dispatcher),
                                    [this] { graphs_->Drop(); });
}

DeepseekV3Model::~DeepseekV3Model() = default;

void DeepseekV3Model::SetDecodeGraphOptions(const DecodeGraphOptions& options) {
  graphs_->SetOptions(options);
}

void DeepseekV3Model::SetFusedOps(bool on) {
  fused_ops_ = on;
  graphs_->Drop();
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
  LayerContext ctx;
  ctx.fused_ops = fused_ops_;
  ctx.bf16_operands = Bf16Operands();
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

// Structured output: the engine's masks, written on the host while the forward pass runs (the
// ops above are enqueued), uploaded once and applied to the sampled rows in place.
absl::Status DeepseekV3Model::MaskLogits(const std::vector<SequenceStep>& batch, float* logits) {
  const int64_t V = config_.vocab_size;
  const int64_t words = (V + 31) / 32;
  std::vector<int32_t> rows;
  std::vector<uint32_t> masks;
  int64_t row = 0;
  for (const SequenceStep& s : batch) {
    const int64_t n = s.all_logits ? static_cast<int64_t>(s.tokens.size()) : 1;
    if (s.fill_allowed_tokens && s.sampling.has_value()) {
      masks.resize(masks.size() + words);
      if (s.fill_allowed_tokens(masks.data() + masks.size() - words)) {
        rows.push_back(static_cast<int32_t>(row + n - 1));
      } else {
        masks.resize(masks.size() - words);
      }
    }
    row += n;
  }
  if (rows.empty()) return absl::OkStatus();
  const int64_t k = static_cast<int64_t>(rows.size());
  auto rows_dev = backend_->AllocateScratch(k * sizeof(int32_t));
  auto masks_dev = backend_->AllocateScratch(k * words * sizeof(uint32_t));
  backend_->CopyToDevice(rows.data(), k * sizeof(int32_t), rows_dev->data());
  backend_->CopyToDevice(masks.data(), k * words * sizeof(uint32_t), masks_dev->data());
  backend_->MaskLogitsRows(k, V, logits, rows_dev->as<int32_t>(), masks_dev->as<uint32_t>());
  return absl::OkStatus();  // SampleOrCopyLogits checks the backend's status after its copies
}

absl::StatusOr<StepOutput> DeepseekV3Model::SampleOrCopyLogits(
    const std::vector<SequenceStep>& batch, float* logits, int64_t rows) {
  const int64_t V = config_.vocab_size;
  if (absl::Status st = MaskLogits(batch, logits); !st.ok()) return st;
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

absl::Status DeepseekV3Model::Layers(const LayerContext& ctx, const int32_t* ids, float* xp,
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
      attention_->Forward(l, ctx, hp, yp);
      backend_->Add(T * H, xp, yp, xp);
      backend_->RmsNorm(T, H, xp, H, L.post_attention_norm->as<float>(), eps, hp, H);
      absl::Status st =
          L.moe ? moe_->Forward(l, T, hp, hp, yp, ctx)
                : SwiGluMlp(backend_, *weights_, L.dense, H, T, hp, yp, false, ctx.bf16_operands);
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
    const MlaAttention::InputNorm input_norm{
        xp,  l == 0 ? nullptr : yp,          L.input_norm->as<float>(),
        eps, h16p != nullptr ? nullptr : hp, h16p};
    attention_->Forward(l, ctx, h_gemm, yp, &input_norm);
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
      st = moe_->Forward(l, T, hp, h_gemm, yp, ctx, &norm);
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
        st = SwiGluMlp(backend_, *weights_, L.dense, H, T, h_gemm, yp, false, ctx.bf16_operands);
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
  LayerContext ctx;
  ctx.fused_ops = fused_ops_;
  ctx.bf16_operands = Bf16Operands();
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

}  // namespace deepinfer
