// DeepseekV3Model forward pass.
#include "worker/model/deepseek_v3_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/model/layers/residual_stream.h"
#include "worker/model/layers/step_sampling.h"
#include "worker/model/layers/swiglu_mlp.h"
#include "worker/model/local_expert_dispatcher.h"

namespace deepinfer {
absl::StatusOr<std::unique_ptr<DeepseekV3Model>> DeepseekV3Model::Create(
    const ModelConfig& config, std::unique_ptr<ModelWeights> weights, Backend* backend,
    std::unique_ptr<ExpertDispatcher> dispatcher) {
  if (weights == nullptr ||
      static_cast<int64_t>(weights->layers.size()) !=
          config.num_hidden_layers + config.num_draft_layers ||
      static_cast<int64_t>(weights->mtp.size()) != config.num_draft_layers) {
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
  a.keeps_fp8 = true;
  a.keeps_mxfp4_experts = true;
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
  // MLA writes every row's latent entries before its attention reads any, and the paged cache is
  // all the state there is: verification rows are rows like any other.
  graph_model.verify_rows = true;
  graph_model.hidden_width = config_.hidden_size;
  graphs_ = std::make_unique<DecodeGraphRunner>(backend_, std::move(graph_model));
  embedding_ =
      std::make_unique<TokenEmbedding>(backend_, weights_->embed->as<float>(), config_.hidden_size);
  attention_ = std::make_unique<MlaAttention>(config_, weights_.get(), backend_);
  moe_ = std::make_unique<MoeBlock>(config_, weights_.get(), backend_, std::move(dispatcher),
                                    [this] { graphs_->Drop(); });
  if (config_.num_draft_layers > 0 && config_.n_routed_experts > 0) {
    std::vector<int64_t> all(config_.n_routed_experts);
    for (int64_t e = 0; e < config_.n_routed_experts; ++e) all[e] = e;
    draft_moe_ = std::make_unique<MoeBlock>(
        config_, weights_.get(), backend_,
        std::make_unique<LocalExpertDispatcher>(backend_, config_.n_routed_experts,
                                                config_.hidden_size, std::move(all)),
        nullptr, config_.num_hidden_layers, config_.num_draft_layers);
  }
  head_ = std::make_unique<LmHead>(
      backend_, config_.hidden_size, config_.vocab_size, static_cast<float>(config_.rms_norm_eps),
      weights_->final_norm->as<float>(), weights_->Matrix(weights_->lm_head));
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

absl::Status DeepseekV3Model::CheckCache(const KvBlockPool& cache, const char* what) const {
  const ModelConfig& c = config_;
  const KvBlockPoolOptions& co = cache.options();
  const int64_t layers = c.num_hidden_layers + c.num_draft_layers;
  bool matches = co.spec.num_layers() == layers;
  for (int32_t l = 0; matches && l < layers; ++l) {
    const KvCacheGroupSpec& g = cache.LayerGroup(l);
    matches = g.kind == KvCacheKind::kPagedLatent && g.latent_dim == c.kv_lora_rank &&
              g.rope_dim == c.qk_rope_head_dim;
  }
  if (!matches) {
    return absl::InvalidArgumentError(absl::StrCat("DeepseekV3Model::", what, ": the KV cache (",
                                                   co.spec.ToString(), ") is not the model's (",
                                                   CacheSpec().ToString(), ")"));
  }
  return absl::OkStatus();
}

void DeepseekV3Model::CopyHidden(const std::vector<SequenceStep>& batch, int64_t tokens,
                                 const float* x, const float* y, StepOutput* out) {
  const int64_t H = config_.hidden_size;
  std::unique_ptr<DeviceBuffer> sum;
  if (y != nullptr) {
    sum = Floats(tokens * H);
    backend_->Add(tokens * H, x, y, sum->as<float>());
    x = sum->as<float>();
  }
  out->hidden.resize(batch.size());
  int64_t row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int64_t n = static_cast<int64_t>(batch[i].tokens.size());
    if (batch[i].return_hidden) {
      out->hidden[i].resize(n * H);
      backend_->CopyToHost(x + row * H, n * H * sizeof(float), out->hidden[i].data());
    }
    row += n;
  }
}

absl::StatusOr<StepOutput> DeepseekV3Model::Step(const std::vector<SequenceStep>& batch,
                                                 KvBlockPool* cache) {
  const ModelConfig& c = config_;
  if (absl::Status st = CheckCache(*cache, "Step"); !st.ok()) return st;
  if (micro_batches_ == 2) return TwoMicroBatchStep(batch, cache);
  if (std::optional<absl::StatusOr<StepOutput>> out = graphs_->Run(batch, cache)) {
    return *std::move(out);
  }
  auto meta = MakeStepMetadata(backend_, batch, cache, c.vocab_size);
  if (!meta.ok()) return meta.status();
  LayerContext& ctx = (*meta)->ctx;
  ctx.mode = Mode();
  const int64_t T = ctx.num_tokens, H = c.hidden_size;
  auto x = Floats(T * H), y = Floats(T * H);
  if (absl::Status st = Layers(ctx, (*meta)->ids->as<int32_t>(), x->as<float>(), y->as<float>());
      !st.ok()) {
    return st;
  }
  return StepTail(batch, **meta, x->as<float>(), y->as<float>());
}

absl::StatusOr<StepOutput> DeepseekV3Model::StepTail(const std::vector<SequenceStep>& batch,
                                                     const StepMetadata& meta, float* xp,
                                                     float* yp) {
  const ModelConfig& c = config_;
  const int64_t T = meta.ctx.num_tokens, H = c.hidden_size;
  // Final norm and LM head only for the rows whose logits are wanted; the last layer's pending
  // output is added to those rows only (the final norm adds it: a prefill wants one row of each
  // prompt's thousands).
  const int64_t R = meta.num_logit_rows;
  const int32_t* rows = meta.logit_rows->as<int32_t>();
  auto sel = Floats(R * H);
  backend_->GatherRows(R, H, xp, rows, sel->as<float>());
  std::unique_ptr<DeviceBuffer> sel_y, normed;
  if (ResidualPending()) {
    sel_y = Floats(R * H);
    backend_->GatherRows(R, H, yp, rows, sel_y->as<float>());
    normed = Floats(R * H);  // the norm's output may not alias x or y
  }
  auto logits = head_->Logits(R, sel->as<float>(), sel_y != nullptr ? sel_y->as<float>() : nullptr,
                              normed != nullptr ? normed->as<float>() : sel->as<float>(), Mode());
  absl::StatusOr<StepOutput> out =
      SampleOrCopyLogits(backend_, c.vocab_size, batch, logits->as<float>(), R);
  const bool hidden = std::any_of(batch.begin(), batch.end(),
                                  [](const SequenceStep& s) { return s.return_hidden; });
  if (out.ok() && hidden) CopyHidden(batch, T, xp, ResidualPending() ? yp : nullptr, &*out);
  return out;
}

absl::Status DeepseekV3Model::SetMicroBatches(int n) {
  if (n != 1 && n != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeepseekV3Model: ", n, " micro-batches per step (1 or 2)"));
  }
  if (n != micro_batches_) graphs_->Drop();
  micro_batches_ = n;
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> DeepseekV3Model::TwoMicroBatchStep(
    const std::vector<SequenceStep>& batch, KvBlockPool* cache) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size;
  // Sequences [0, k) and [k, n), k splitting the tokens most evenly (the smaller k on a tie).
  int64_t total = 0;
  for (const SequenceStep& s : batch) total += static_cast<int64_t>(s.tokens.size());
  size_t k = 0;
  int64_t before = 0, best = total;
  for (size_t i = 0; i <= batch.size(); ++i) {
    const int64_t gap = std::abs(2 * before - total);
    if (gap < best || (i == 0 && gap <= best)) {
      best = gap;
      k = i;
    }
    if (i < batch.size()) before += static_cast<int64_t>(batch[i].tokens.size());
  }
  struct MicroBatch {
    std::vector<SequenceStep> batch;
    std::unique_ptr<StepMetadata> meta;
    std::unique_ptr<DeviceBuffer> x, y;
    std::unique_ptr<PlainResidualStream> stream;
    MoeBlock::Staged moe;
    ExchangeThread::Ticket ticket = 0;
  };
  MicroBatch mb[2];
  mb[0].batch.assign(batch.begin(), batch.begin() + k);
  mb[1].batch.assign(batch.begin() + k, batch.end());
  for (MicroBatch& m : mb) {
    auto meta = MakeStepMetadata(backend_, m.batch, cache, c.vocab_size);
    if (!meta.ok()) return meta.status();
    m.meta = std::move(*meta);
    m.meta->ctx.mode = Mode();
    const int64_t T = m.meta->ctx.num_tokens;
    m.x = Floats(T * H);
    m.y = Floats(T * H);
    embedding_->Forward(T, m.meta->ids->as<int32_t>(), m.x->as<float>());
    m.stream =
        std::make_unique<PlainResidualStream>(backend_, T, H, static_cast<float>(c.rms_norm_eps),
                                              Mode(), m.x->as<float>(), m.y->as<float>());
  }
  if (exchanges_ == nullptr) exchanges_ = std::make_unique<ExchangeThread>();
  ExchangeThread& xt = *exchanges_;
  // Declared after mb: on any return, every exchange submitted (which reads and writes mb's
  // staged buffers) has run before mb goes away.
  struct Drain {
    ExchangeThread* t;
    ~Drain() { (void)t->WaitAll(); }
  } drain{&xt};
  // Per MoE layer: both micro-batches' attention and routing, then each one's experts, then each
  // one's combine: micro-batch 0's dispatch exchange runs during micro-batch 1's attention,
  // 1's dispatch during 0's experts, 0's combine during 1's experts, 1's combine during 0's
  // shared experts.
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& L = weights_->layers[l];
    if (!L.moe) {
      for (MicroBatch& m : mb) {
        if (absl::Status st = Layer(l, m.meta->ctx, m.stream.get(), moe_.get()); !st.ok()) {
          return st;
        }
      }
      continue;
    }
    for (MicroBatch& m : mb) {
      const ResidualNorm* norm = Attention(l, m.meta->ctx, m.stream.get());
      absl::StatusOr<ExpertDispatcher::Exchange> x =
          moe_->BeginStaged(l, m.meta->ctx.num_tokens, m.stream->h(), m.stream->h_gemm(),
                            m.stream->block_out(), m.meta->ctx, norm, &m.moe);
      if (!x.ok()) return x.status();
      m.ticket = xt.Submit(std::move(*x));
    }
    for (MicroBatch& m : mb) {
      if (absl::Status st = xt.Wait(m.ticket); !st.ok()) return st;
      ExpertDispatcher::Exchange exchange;
      if (!m.moe.done) {
        absl::StatusOr<ExpertDispatcher::Exchange> x = moe_->ExpertsStaged(&m.moe);
        if (!x.ok()) return x.status();
        exchange = std::move(*x);
      }
      m.ticket = xt.Submit(std::move(exchange));
    }
    for (MicroBatch& m : mb) {
      if (absl::Status st = xt.Wait(m.ticket); !st.ok()) return st;
      if (!m.moe.done) {
        if (absl::Status st = moe_->FinishStaged(&m.moe); !st.ok()) return st;
      }
      m.moe = MoeBlock::Staged();
      m.stream->Add();
    }
  }
  StepOutput out;
  for (MicroBatch& m : mb) {
    absl::StatusOr<StepOutput> part =
        StepTail(m.batch, *m.meta, m.x->as<float>(), m.y->as<float>());
    if (!part.ok()) return part.status();
    auto append = [](auto* to, auto& from) {
      to->insert(to->end(), std::make_move_iterator(from.begin()),
                 std::make_move_iterator(from.end()));
    };
    append(&out.logits, part->logits);
    append(&out.sampled, part->sampled);
    append(&out.row_sampled, part->row_sampled);
    append(&out.hidden, part->hidden);
  }
  return out;
}

absl::Status DeepseekV3Model::Layers(const LayerContext& ctx, const int32_t* ids, float* x,
                                     float* y) {
  const ModelConfig& c = config_;
  const int64_t T = ctx.num_tokens, H = c.hidden_size;
  embedding_->Forward(T, ids, x);
  PlainResidualStream stream(backend_, T, H, static_cast<float>(c.rms_norm_eps), ctx.mode, x, y);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (absl::Status st = Layer(l, ctx, &stream, moe_.get()); !st.ok()) return st;
  }
  return absl::OkStatus();
}

const ResidualNorm* DeepseekV3Model::Attention(int64_t l, const LayerContext& ctx,
                                               PlainResidualStream* stream) {
  const LayerWeights& L = weights_->layers[l];
  // Each block's norm: applied here, or (fused ops) handed to the block's first op.
  const ResidualNorm* norm = stream->Norm(L.input_norm->as<float>());
  attention_->Forward(l, ctx, stream->h_gemm(), stream->block_out(), norm);
  stream->Add();
  return stream->Norm(L.post_attention_norm->as<float>());
}

absl::Status DeepseekV3Model::Layer(int64_t l, const LayerContext& ctx, PlainResidualStream* stream,
                                    MoeBlock* moe) {
  const int64_t T = ctx.num_tokens, H = config_.hidden_size;
  const LayerWeights& L = weights_->layers[l];
  const ResidualNorm* norm = Attention(l, ctx, stream);
  if (L.moe) {
    // The router and routed experts read fp32 rows, the shared experts the GEMM operand.
    absl::Status st =
        moe->Forward(l, T, stream->h(), stream->h_gemm(), stream->block_out(), ctx, norm);
    if (!st.ok()) return st;
  } else {
    SwiGluMlp(backend_, *weights_, L.dense, H, T, norm, stream->h_gemm(), stream->block_out(),
              ctx.mode);
  }
  stream->Add();
  return absl::OkStatus();
}

absl::StatusOr<DraftOutput> DeepseekV3Model::Draft(const std::vector<DraftStep>& batch,
                                                   KvBlockPool* cache) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  if (c.num_draft_layers == 0) return absl::UnimplementedError("the model has no draft head");
  if (absl::Status st = CheckCache(*cache, "Draft"); !st.ok()) return st;
  std::vector<SequenceStep> steps(batch.size());
  int64_t module = -1;
  for (size_t i = 0; i < batch.size(); ++i) {
    const DraftStep& d = batch[i];
    if (d.module < 0 || d.module >= c.num_draft_layers || (module >= 0 && d.module != module)) {
      return absl::InvalidArgumentError(
          absl::StrCat("DeepseekV3Model::Draft: sequence ", i, " asks for MTP module ", d.module,
                       " (the model has ", c.num_draft_layers, "; one module per call)"));
    }
    module = d.module;
    if (d.hidden.size() != d.tokens.size() * static_cast<size_t>(H)) {
      return absl::InvalidArgumentError(
          absl::StrCat("DeepseekV3Model::Draft: sequence ", i, " has ", d.tokens.size(),
                       " tokens but ", d.hidden.size(), " hidden values (hidden size ", H, ")"));
    }
    steps[i].tokens = d.tokens;
    steps[i].position_offset = d.position_offset;
    steps[i].block_table = d.block_table;
  }
  DraftOutput out;
  if (batch.empty()) return out;
  auto meta = MakeStepMetadata(backend_, steps, cache, V);
  if (!meta.ok()) return meta.status();
  LayerContext& ctx = (*meta)->ctx;
  ctx.mode = Mode();
  const int64_t T = ctx.num_tokens;
  const MtpWeights& M = weights_->mtp[module];
  const float eps = static_cast<float>(c.rms_norm_eps);
  // [enorm(embedding); hnorm(hidden)] per row, then eh_proj into the module's residual stream.
  std::vector<float> host_hidden;
  host_hidden.reserve(T * H);
  for (const DraftStep& d : batch)
    host_hidden.insert(host_hidden.end(), d.hidden.begin(), d.hidden.end());
  auto hidden = Floats(T * H), embedded = Floats(T * H), joined = Floats(T * 2 * H);
  backend_->CopyToDevice(host_hidden.data(), T * H * sizeof(float), hidden->data());
  embedding_->Forward(T, (*meta)->ids->as<int32_t>(), embedded->as<float>());
  backend_->RmsNorm(T, H, embedded->as<float>(), H, M.enorm->as<float>(), eps, joined->as<float>(),
                    2 * H);
  backend_->RmsNorm(T, H, hidden->as<float>(), H, M.hnorm->as<float>(), eps,
                    joined->as<float>() + H, 2 * H);
  auto x = Floats(T * H), y = Floats(T * H);
  backend_->Gemm(T, H, 2 * H, joined->as<float>(), 2 * H, weights_->Matrix(M.eh_proj), 2 * H,
                 x->as<float>(), H, false);
  PlainResidualStream stream(backend_, T, H, eps, ctx.mode, x->as<float>(), y->as<float>());
  if (absl::Status st = Layer(c.num_hidden_layers + module, ctx, &stream, draft_moe_.get());
      !st.ok()) {
    return st;
  }
  if (stream.pending()) backend_->Add(T * H, x->as<float>(), y->as<float>(), x->as<float>());
  // The last row of each sequence: its hidden state, then shared_head.norm and the LM head.
  const int64_t R = (*meta)->num_logit_rows;
  auto last = Floats(R * H), normed = Floats(R * H);
  backend_->GatherRows(R, H, x->as<float>(), (*meta)->logit_rows->as<int32_t>(), last->as<float>());
  LmHead head(backend_, H, V, eps, M.head_norm->as<float>(), weights_->Matrix(weights_->lm_head));
  auto logits = head.Logits(R, last->as<float>(), nullptr, normed->as<float>(), Mode());
  // Only the picks and the last rows' hidden states leave the device.
  if (absl::Status st =
          GreedyPicks(backend_, V, logits->as<float>(), R, &out.token, &out.probability);
      !st.ok()) {
    return st;
  }
  std::vector<float> host_last(R * H);
  backend_->CopyToHost(last->data(), R * H * sizeof(float), host_last.data());
  if (absl::Status st = backend_->status(); !st.ok()) return st;
  out.hidden.resize(R);
  for (int64_t r = 0; r < R; ++r) {
    out.hidden[r].assign(host_last.begin() + r * H, host_last.begin() + (r + 1) * H);
  }
  return out;
}

absl::Status DeepseekV3Model::DecodeForward(const DecodeGraphInputs& in) {
  const ModelConfig& c = config_;
  const int64_t B = in.rows, H = c.hidden_size, V = c.vocab_size;
  LayerContext ctx;
  ctx.mode = Mode();
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
  if (in.out_hidden != nullptr) {  // the residual stream before the final norm (CopyHidden's)
    if (ResidualPending()) {
      backend_->Add(B * H, x->as<float>(), y->as<float>(), in.out_hidden);
    } else {
      backend_->CopyDeviceToDevice(x->as<float>(), B * H * sizeof(float), in.out_hidden);
    }
  }
  // Every row is a token whose next one is picked: final norm, LM head and picks for all.
  auto normed = Floats(B * H);
  auto logits = head_->Logits(B, x->as<float>(), ResidualPending() ? y->as<float>() : nullptr,
                              normed->as<float>(), Mode());
  // The greedy and sampled picks (an adjusted copy where the graph has room for adjustments).
  std::unique_ptr<DeviceBuffer> adjusted;
  if (in.adjustment_capacity > 0) adjusted = Floats(B * V);
  DecodeGraphPick(backend_, in, V, logits->as<float>(),
                  adjusted != nullptr ? adjusted->as<float>() : nullptr);
  return absl::OkStatus();
}

}  // namespace deepinfer
