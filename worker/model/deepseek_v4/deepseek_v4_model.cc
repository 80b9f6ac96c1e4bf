// DeepseekV4Model: the step's metadata, the residual streams and the layer loop.
#include "worker/model/deepseek_v4/deepseek_v4_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/model/layers/step_sampling.h"
#include "worker/model/local_expert_dispatcher.h"

namespace deepinfer {

absl::StatusOr<std::unique_ptr<DeepseekV4Model>> DeepseekV4Model::Create(
    const ModelConfig& config, const DeepseekV4Config& v4,
    std::unique_ptr<DeepseekV4Weights> weights, Backend* backend,
    std::unique_ptr<ExpertDispatcher> dispatcher) {
  if (backend->v4_ops() == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("DeepseekV4Model: the ", backend->name(), " backend has no DeepSeek-V4 ops"));
  }
  if (weights == nullptr || static_cast<int64_t>(weights->layers.size()) != v4.num_layers ||
      static_cast<int64_t>(weights->mtp.size()) != v4.num_draft_layers) {
    return absl::InvalidArgumentError("DeepseekV4Model: weights do not match the config");
  }
  if (dispatcher == nullptr) {
    return absl::InvalidArgumentError("DeepseekV4Model: needs an ExpertDispatcher");
  }
  for (int64_t l = 0; l < v4.num_layers; ++l) {
    for (int64_t e : dispatcher->local_experts(l)) {
      if (!weights->moe.layers[l].experts.count(e)) {
        return absl::InvalidArgumentError(absl::StrCat("DeepseekV4Model: dispatcher serves expert ",
                                                       e, " of layer ", l,
                                                       " but its weights were not loaded"));
      }
    }
  }
  return std::unique_ptr<DeepseekV4Model>(
      new DeepseekV4Model(config, v4, std::move(weights), backend, std::move(dispatcher)));
}

DeepseekV4Model::DeepseekV4Model(const ModelConfig& config, const DeepseekV4Config& v4,
                                 std::unique_ptr<DeepseekV4Weights> weights, Backend* backend,
                                 std::unique_ptr<ExpertDispatcher> dispatcher)
    : config_(config),
      v4_(v4),
      weights_(std::move(weights)),
      backend_(backend),
      ops_(backend->v4_ops()) {
  DecodeGraphModel graph_model;
  graph_model.forward = [this](const DecodeGraphInputs& in) { return DecodeForward(in); };
  // The device-only step needs the routed experts on the device (else: the dispatcher).
  graph_model.available = [this] { return moe_->experts_on_device(); };
  graph_model.prepare = [this](const std::vector<SequenceStep>& batch, int64_t bucket,
                               KvBlockPool* cache) { return PrepareDecode(batch, bucket, cache); };
  graph_model.vocab_size = config_.vocab_size;
  graph_model.max_position_embeddings = config_.max_position_embeddings;
  graph_model.counted_per_row = v4_.num_experts_per_tok;  // EPLB counts real rows only
  graphs_ = std::make_unique<DecodeGraphRunner>(backend_, std::move(graph_model));
  const int64_t n = std::max(v4_.hc_mult * v4_.hidden_size, v4_.head_dim);
  const std::vector<float> ones(n, 1.0f);
  ones_ = backend_->Allocate(n * sizeof(float));
  backend_->CopyToDevice(ones.data(), n * sizeof(float), ones_->data());
  attention_ = std::make_unique<V4Attention>(v4_, weights_.get(), backend_, ones_->as<float>());
  moe_ = std::make_unique<V4Moe>(v4_, weights_.get(), V4Moe::ModelLayers(weights_.get()), backend_,
                                 std::move(dispatcher), [this] { graphs_->Drop(); });
  if (v4_.num_draft_layers > 0) {
    // The MTP modules' MoE: every routed expert on this rank (DeepseekV4Weights::mtp), so Draft
    // has no collectives.
    std::vector<V4MoeLayer> layers(v4_.num_draft_layers);
    for (int64_t i = 0; i < v4_.num_draft_layers; ++i) layers[i].weights = &weights_->mtp[i].moe;
    std::vector<int64_t> all(v4_.n_routed_experts);
    for (int64_t e = 0; e < v4_.n_routed_experts; ++e) all[e] = e;
    draft_moe_ = std::make_unique<V4Moe>(
        v4_, weights_.get(), std::move(layers), backend_,
        std::make_unique<LocalExpertDispatcher>(backend_, v4_.n_routed_experts, v4_.hidden_size,
                                                std::move(all)),
        nullptr);
  }
}

DeepseekV4Model::~DeepseekV4Model() = default;

void DeepseekV4Model::SetFusedOps(bool on) {
  fused_ops_ = on;
  attention_->SetFusedOps(on);
  graphs_->Drop();
}

KvCacheSpec DeepseekV4Model::CacheSpecOf(const DeepseekV4Config& v4) {
  // Cache layers: the model's, then its MTP modules' (num_layers + i), each in the group of its
  // attention kind and compress rate (a module whose rate no layer of its kind has: a group of
  // its own after that kind's).
  std::vector<V4AttentionKind> kinds = v4.attention;
  std::vector<int64_t> rates = v4.compress_rate;
  for (int64_t i = 0; i < v4.num_draft_layers; ++i) {
    kinds.push_back(v4.mtp_attention[i]);
    rates.push_back(v4.mtp_compress_rate[i]);
  }
  KvCacheSpec spec;
  for (V4AttentionKind kind :
       {V4AttentionKind::kSliding, V4AttentionKind::kCompressed, V4AttentionKind::kSparse}) {
    std::vector<KvCacheGroupSpec> groups;  // of this kind, one per rate
    for (size_t l = 0; l < kinds.size(); ++l) {
      if (kinds[l] != kind) continue;
      const int32_t ratio = kind == V4AttentionKind::kSliding ? 0 : static_cast<int32_t>(rates[l]);
      auto g = std::find_if(groups.begin(), groups.end(),
                            [&](const KvCacheGroupSpec& x) { return x.ratio == ratio; });
      if (g == groups.end()) {
        KvCacheGroupSpec n;
        n.kind = kind == V4AttentionKind::kSliding      ? KvCacheKind::kSlidingWindow
                 : kind == V4AttentionKind::kCompressed ? KvCacheKind::kCompressed
                                                        : KvCacheKind::kCompressedSparse;
        n.head_dim = static_cast<int32_t>(v4.head_dim);
        n.window = static_cast<int32_t>(v4.sliding_window);
        if (kind == V4AttentionKind::kSparse) {
          n.index_dim = static_cast<int32_t>(v4.index_head_dim);
        }
        n.ratio = ratio;
        n.spare_rows = static_cast<int32_t>(v4.speculative_tokens);
        groups.push_back(std::move(n));
        g = groups.end() - 1;
      }
      g->layers.push_back(static_cast<int32_t>(l));
    }
    for (KvCacheGroupSpec& g : groups) spec.groups.push_back(std::move(g));
  }
  return spec;
}

int64_t DeepseekV4Model::MaxDraftsPerStep(const KvBlockPool& cache) const {
  int64_t most = std::numeric_limits<int64_t>::max();
  for (const KvCacheGroupSpec& g : cache.spec().groups)
    most = std::min<int64_t>(most, g.spare_rows);
  return most;
}

int64_t DeepseekV4Model::CompressRateOf(int64_t layer) const {
  return layer < v4_.num_layers ? v4_.compress_rate[layer]
                                : v4_.mtp_compress_rate[layer - v4_.num_layers];
}

Architecture DeepseekV4Model::Entry() {
  Architecture a;
  a.name = "DeepseekV4ForCausalLM";
  a.model_types = {"deepseek_v4"};
  a.keeps_mxfp4_experts = true;
  a.build = [](const ModelBuildArgs& args) -> absl::StatusOr<std::unique_ptr<CausalLm>> {
    auto v4 = DeepseekV4Config::FromModelConfig(*args.config);
    if (!v4.ok()) return v4.status();
    auto weights = DeepseekV4Weights::Load(*v4, args.source, args.backend, args.load);
    if (!weights.ok()) return weights.status();
    auto dispatcher = args.make_dispatcher(*args.config, (*weights)->moe, args.backend);
    if (!dispatcher.ok()) return dispatcher.status();
    auto model =
        Create(*args.config, *v4, std::move(*weights), args.backend, std::move(*dispatcher));
    if (!model.ok()) return model.status();
    return std::unique_ptr<CausalLm>(std::move(*model));
  };
  a.weight_bytes = [](const ModelConfig& c, WeightDType dtype, const LoadOptions& load) {
    auto v4 = DeepseekV4Config::FromModelConfig(c);
    return v4.ok() ? DeepseekV4Weights::DeviceBytes(*v4, dtype, load) : int64_t{0};
  };
  a.activation_floats_per_token = [](const ModelConfig& c) -> int64_t {
    auto v4 = DeepseekV4Config::FromModelConfig(c);
    if (!v4.ok()) return 0;
    const DeepseekV4Config& x = *v4;
    const int64_t H = x.hidden_size, S = x.hc_mult * H, D = x.head_dim, NH = x.num_heads;
    const int64_t K = x.num_experts_per_tok, I = x.moe_intermediate_size;
    // Streams (two copies), the site's mixes and collapse, then the larger block.
    const int64_t attention = 2 * x.q_lora_rank + 3 * NH * D + 4 * D + x.o_groups * x.o_lora_rank +
                              x.index_n_heads * (x.index_head_dim + 1) + 8 * D;
    const int64_t moe = x.n_routed_experts + 2 * K + 2 * K * H + 3 * K * I + 3 * I + 2 * H;
    return 2 * S + x.hc_mix() + 3 * H + std::max(attention, moe) + H + x.vocab_size;
  };
  a.cache_spec = [](const ModelConfig& c, WeightDType) {
    auto v4 = DeepseekV4Config::FromModelConfig(c);
    return v4.ok() ? CacheSpecOf(*v4) : KvCacheSpec{};
  };
  return a;
}

void DeepseekV4Model::Mix(int64_t T, const V4HyperConnectionWeights& w, const float* streams,
                          float* post, float* comb, float* collapsed, const float* norm_weight,
                          float* normed, uint16_t* normed_bf16) {
  const int64_t S = v4_.hc_mult * v4_.hidden_size, M = v4_.hc_mix();
  const float norm_eps = static_cast<float>(v4_.rms_norm_eps);
  HcMixArgs a;
  a.rows = T;
  a.hc = v4_.hc_mult;
  a.hidden = v4_.hidden_size;
  a.base = w.base->as<float>();
  a.scale = w.scale->as<float>();
  a.sinkhorn_iters = static_cast<int32_t>(v4_.hc_sinkhorn_iters);
  a.eps = static_cast<float>(v4_.hc_eps);
  a.streams = streams;
  a.post = post;
  a.comb = comb;
  a.collapsed = collapsed;
  // With fused ops, the norm and the mixing GEMM inside the op where the backend has the
  // kernel (not the CPU backend: its three ops are the reference).
  a.fn = w.fn->as<float>();
  a.norm_eps = norm_eps;
  if (fused_ops_) {
    HcMixArgs f = a;
    if (normed != nullptr || normed_bf16 != nullptr) {
      f.collapsed = nullptr;
      f.out_norm_weight = norm_weight;
      f.out_norm_eps = norm_eps;
      f.normed = normed;
      f.normed_bf16 = normed_bf16;
    }
    if (ops_->HcMixFromStreams(f)) return;
  }
  auto flat_normed = Floats(T * S), mixes = Floats(T * M);
  backend_->RmsNorm(T, S, streams, S, ones_->as<float>(), norm_eps, flat_normed->as<float>(), S);
  backend_->Gemm(T, M, S, flat_normed->as<float>(), S, WeightView(w.fn->as<float>()), S,
                 mixes->as<float>(), M, false);
  a.mixes = mixes->as<float>();
  ops_->HcMix(a);
  if (normed_bf16 != nullptr) {
    backend_->AddRmsNorm(T, v4_.hidden_size, collapsed, nullptr, norm_weight, norm_eps, normed,
                         normed_bf16);
  } else if (normed != nullptr) {
    backend_->RmsNorm(T, v4_.hidden_size, collapsed, v4_.hidden_size, norm_weight, norm_eps, normed,
                      v4_.hidden_size);
  }
}

absl::Status DeepseekV4Model::CheckSharedBlocks(const SequenceStep& s, size_t si,
                                                int32_t block_size) const {
  if (s.shared_blocks == 0) return absl::OkStatus();
  const int64_t shared_end = int64_t{s.shared_blocks} * block_size;
  if (s.shared_blocks < 0 || s.shared_blocks >= static_cast<int64_t>(s.block_table.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", si, ": ", s.shared_blocks, " shared blocks in a table of ",
                     s.block_table.size(), " (its state is keyed by the first block of its own)"));
  }
  // The step writes the compressed entries of windows ending after max(offset, kept_end) (and
  // the window ring and compressor rows, in the state slot): they must lie past the shared
  // blocks.
  const int64_t from = std::max(s.position_offset, s.kept_end);
  for (int64_t l = 0; l < v4_.num_layers + v4_.num_draft_layers; ++l) {
    const int64_t ratio = CompressRateOf(l);
    if (ratio > 0 && from / ratio * ratio < shared_end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", si, ": layer ", l, " would write the compressed entry of positions from ",
          from / ratio * ratio, " into its ", s.shared_blocks, " shared blocks (positions < ",
          shared_end, "); entries of those blocks must be kept (kept_end >= ", shared_end, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DraftOutput> DeepseekV4Model::Draft(const std::vector<DraftStep>& batch,
                                                   KvBlockPool* cache) {
  const DeepseekV4Config& c = v4_;
  const int64_t H = c.hidden_size, hc = c.hc_mult, S = hc * H, V = c.vocab_size;
  if (c.num_draft_layers == 0) {
    return absl::UnimplementedError(
        "DeepSeek-V4 (DeepseekV4ForCausalLM): the model was built without its MTP modules "
        "(ModelConfig::num_draft_layers 0)");
  }
  if (absl::Status st = CheckCache(*cache); !st.ok()) return st;
  DraftOutput out;
  if (batch.empty()) return out;
  // The rows as a step of the module's layer: same checks, slots and plan as Step.
  std::vector<SequenceStep> steps(batch.size());
  std::vector<V4Sequence> seqs;
  std::vector<int32_t> ids;
  std::vector<float> host_hidden;
  int64_t module = -1;
  for (size_t si = 0; si < batch.size(); ++si) {
    const DraftStep& d = batch[si];
    if (d.module < 0 || d.module >= c.num_draft_layers || (module >= 0 && d.module != module)) {
      return absl::InvalidArgumentError(
          absl::StrCat("DeepseekV4Model::Draft: sequence ", si, " asks for MTP module ", d.module,
                       " (the model has ", c.num_draft_layers, "; one module per call)"));
    }
    module = d.module;
    if (d.hidden.size() != d.tokens.size() * static_cast<size_t>(S)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DeepseekV4Model::Draft: sequence ", si, " has ", d.tokens.size(), " tokens but ",
          d.hidden.size(), " hidden values (", hc, " residual streams of ", H, " per token)"));
    }
    SequenceStep& s = steps[si];
    s.tokens = d.tokens;
    s.position_offset = d.position_offset;
    s.block_table = d.block_table;
    s.shared_blocks = d.shared_blocks;
    s.replay_from = d.replay_from;
    s.kept_end = d.kept_end;
    if (absl::Status st = CheckSequence(s, si, *cache); !st.ok()) return st;
    V4Sequence q;
    q.replay_from = s.replay_from;
    q.kept_end = s.kept_end;
    q.first_row = static_cast<int64_t>(ids.size());
    q.num_tokens = static_cast<int64_t>(s.tokens.size());
    q.offset = s.position_offset;
    q.block_table = &s.block_table;
    seqs.push_back(q);
    ids.insert(ids.end(), s.tokens.begin(), s.tokens.end());
    host_hidden.insert(host_hidden.end(), d.hidden.begin(), d.hidden.end());
  }
  for (size_t si = 0; si < steps.size(); ++si) {
    auto slot = BindSlot(steps[si], si, cache);
    if (!slot.ok()) return slot.status();
    seqs[si].slot = *slot;
  }
  const int64_t T = static_cast<int64_t>(ids.size());
  V4StepPlan::Inputs pin;
  pin.config = &c;
  pin.cache = cache;
  pin.seqs = &seqs;
  pin.tokens = T;
  pin.full_forward_ties = full_forward_ties_;
  auto plan = V4StepPlan::Build(pin, backend_);
  if (!plan.ok()) return plan.status();
  auto ids_dev = backend_->AllocateScratch(T * sizeof(int32_t));
  backend_->CopyToDevice(ids.data(), T * sizeof(int32_t), ids_dev->data());

  // Per residual stream: e_proj(enorm(embed(token))) + h_proj(hnorm(stream)) (the release's
  // MTPBlock: the token's projection broadcast over the streams).
  const V4MtpWeights& M = weights_->mtp[module];
  const float eps = static_cast<float>(c.rms_norm_eps);
  auto embedded = Floats(T * H), e_normed = Floats(T * H), e_proj = Floats(T * H);
  backend_->GatherRows(T, H, weights_->embed->as<float>(), ids_dev->as<int32_t>(),
                       embedded->as<float>());
  backend_->RmsNorm(T, H, embedded->as<float>(), H, M.enorm->as<float>(), eps,
                    e_normed->as<float>(), H);
  backend_->Gemm(T, H, H, e_normed->as<float>(), H, weights_->Matrix(M.e_proj), H,
                 e_proj->as<float>(), H, false);
  auto in = Floats(T * S), h_normed = Floats(T * S), h_proj = Floats(T * S), e_rows = Floats(T * S);
  backend_->CopyToDevice(host_hidden.data(), T * S * sizeof(float), in->data());
  backend_->RmsNorm(T * hc, H, in->as<float>(), H, M.hnorm->as<float>(), eps, h_normed->as<float>(),
                    H);
  backend_->Gemm(T * hc, H, H, h_normed->as<float>(), H, weights_->Matrix(M.h_proj), H,
                 h_proj->as<float>(), H, false);
  backend_->GatherRows(T * hc, H, e_proj->as<float>(), (*plan)->stream_rows(), e_rows->as<float>());
  auto streams = Floats(T * S), next = Floats(T * S);
  backend_->Add(T * S, e_rows->as<float>(), h_proj->as<float>(), streams->as<float>());

  V4StepContext ctx;
  ctx.plan = plan->get();
  ctx.cache = cache;
  V4Moe::Mode mode;
  mode.fused = fused_ops_;
  if (absl::Status st =
          Block(c.num_layers + module, ctx, ids_dev->as<int32_t>(), mode, &streams, &next);
      !st.ok()) {
    return st;
  }
  // Each sequence's last row: its streams (the next round's input), then the module's hc head
  // and norm and the model's LM head.
  const int64_t R = static_cast<int64_t>(seqs.size());
  std::vector<int32_t> last(R);
  for (int64_t r = 0; r < R; ++r) {
    last[r] = static_cast<int32_t>(seqs[r].first_row + seqs[r].num_tokens - 1);
  }
  auto last_dev = backend_->AllocateScratch(R * sizeof(int32_t));
  backend_->CopyToDevice(last.data(), R * sizeof(int32_t), last_dev->data());
  auto last_streams = Floats(R * S);
  backend_->GatherRows(R, S, streams->as<float>(), last_dev->as<int32_t>(),
                       last_streams->as<float>());
  auto logits = Logits(R, last_streams->as<float>(), nullptr, M.hc_head, *M.norm);
  // Only the picks and the last rows' streams leave the device.
  if (absl::Status st =
          GreedyPicks(backend_, V, logits->as<float>(), R, &out.token, &out.probability);
      !st.ok()) {
    return st;
  }
  std::vector<float> host_last(R * S);
  backend_->CopyToHost(last_streams->data(), R * S * sizeof(float), host_last.data());
  if (absl::Status st = backend_->status(); !st.ok()) return st;
  out.hidden.resize(R);
  for (int64_t r = 0; r < R; ++r) {
    out.hidden[r].assign(host_last.begin() + r * S, host_last.begin() + (r + 1) * S);
  }
  return out;
}

int64_t DeepseekV4Model::BoundedReplayStart(int64_t kept_end) const {
  int64_t ratio = 0;
  for (int64_t r : v4_.compress_rate) ratio = std::max(ratio, r);
  const int64_t start = kept_end - (v4_.num_layers * (v4_.sliding_window - 1) + 2 * ratio);
  return std::max<int64_t>(0, start);
}

absl::Status DeepseekV4Model::CheckCache(const KvBlockPool& cache) const {
  const DeepseekV4Config& c = v4_;
  const KvBlockPoolOptions& co = cache.options();
  const KvCacheSpec want = CacheSpec();
  const int64_t layers = c.num_layers + c.num_draft_layers;
  bool matches = co.spec.num_layers() == layers;
  for (int32_t l = 0; matches && l < layers; ++l) {
    const KvCacheGroupSpec& g = cache.LayerGroup(l);
    const KvCacheGroupSpec* w = nullptr;
    for (const KvCacheGroupSpec& x : want.groups) {
      if (std::find(x.layers.begin(), x.layers.end(), l) != x.layers.end()) w = &x;
    }
    matches = w != nullptr && g.kind == w->kind && g.head_dim == w->head_dim &&
              g.window == w->window && g.ratio == w->ratio && g.index_dim == w->index_dim;
  }
  if (!matches || cache.num_state_slots() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("DeepseekV4Model::Step: the KV cache (",
                                                   co.spec.ToString(), ") is not the model's (",
                                                   want.ToString(), ")"));
  }
  return absl::OkStatus();
}

absl::Status DeepseekV4Model::CheckSequence(const SequenceStep& s, size_t si,
                                            const KvBlockPool& cache) const {
  const KvBlockPoolOptions& co = cache.options();
  if (s.tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", si, " has no new tokens"));
  }
  const int64_t end = s.position_offset + static_cast<int64_t>(s.tokens.size());
  if (s.position_offset < 0 || s.block_table.empty() ||
      static_cast<int64_t>(s.block_table.size()) * co.block_size < end) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", si, ": block table of ", s.block_table.size(),
                     " blocks cannot hold ", end, " positions (block size ", co.block_size, ")"));
  }
  for (int32_t b : s.block_table) {
    if (b < 0 || b >= co.num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", si, ": bad block id ", b));
    }
  }
  if (s.replay_from != 0 || s.kept_end != 0) {
    const int64_t start = BoundedReplayStart(s.kept_end);
    if (s.replay_from <= 0 || s.replay_from > start || s.position_offset < s.replay_from) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", si, ": a rebuild from position ", s.replay_from,
                       " at position ", s.position_offset, " with entries kept up to ", s.kept_end,
                       " (it must start at or before ", start, ", and > 0)"));
    }
  }
  if (absl::Status st = CheckSharedBlocks(s, si, co.block_size); !st.ok()) return st;
  for (int32_t id : s.tokens) {
    if (id < 0 || id >= v4_.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", si, ": token id ", id, " outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> DeepseekV4Model::BindSlot(const SequenceStep& s, size_t si,
                                                  KvBlockPool* cache) const {
  bool fresh = false;
  auto slot = cache->SequenceSlot(s.block_table[s.shared_blocks], &fresh);
  if (!slot.ok()) return slot.status();
  // A rebuild's first step binds a fresh slot at replay_from.
  if (fresh && s.position_offset > s.replay_from) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sequence ", si, " continues at position ", s.position_offset,
        " but the cache holds no state for it (its blocks were freed or never prefilled)"));
  }
  return slot;
}

std::unique_ptr<DeviceBuffer> DeepseekV4Model::Embed(const V4StepPlan& plan, const int32_t* ids) {
  const int64_t T = plan.tokens(), H = v4_.hidden_size, hc = v4_.hc_mult;
  auto streams = Floats(T * hc * H);
  if (T == 0) return streams;
  // Row t * hc + k of the streams (as [T * hc, H]) is embedding row ids[t]: each token's row
  // gathered once, then copied hc times.
  auto rows = Floats(T * H);
  backend_->GatherRows(T, H, weights_->embed->as<float>(), ids, rows->as<float>());
  backend_->GatherRows(T * hc, H, rows->as<float>(), plan.stream_rows(), streams->as<float>());
  return streams;
}

absl::Status DeepseekV4Model::Layers(const V4StepContext& ctx, const int32_t* ids,
                                     const int32_t* counted, bool device_only,
                                     std::unique_ptr<DeviceBuffer>* streams,
                                     std::unique_ptr<DeviceBuffer>* next) {
  V4Moe::Mode mode;
  mode.fused = fused_ops_;
  mode.device_only = device_only;
  mode.counted = counted;
  for (int64_t l = 0; l < v4_.num_layers; ++l) {
    if (absl::Status st = Block(l, ctx, ids, mode, streams, next); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status DeepseekV4Model::Block(int64_t layer, const V4StepContext& ctx, const int32_t* ids,
                                    const V4Moe::Mode& mode, std::unique_ptr<DeviceBuffer>* streams,
                                    std::unique_ptr<DeviceBuffer>* next) {
  const DeepseekV4Config& c = v4_;
  const int64_t T = ctx.plan->tokens(), H = c.hidden_size, hc = c.hc_mult;
  const int64_t module = layer - c.num_layers;  // >= 0: an MTP module's block
  const V4LayerWeights& L = module < 0 ? weights_->layers[layer] : weights_->mtp[module].block;
  V4Moe* moe = module < 0 ? moe_.get() : draft_moe_.get();
  const int64_t moe_layer = module < 0 ? layer : module;
  auto post = Floats(T * hc), comb = Floats(T * hc * hc), collapsed = Floats(T * H);
  auto h = Floats(T * H), y = Floats(T * H);
  HcExpandArgs ex;
  ex.rows = T;
  ex.hc = hc;
  ex.hidden = H;
  ex.block_out = y->as<float>();
  ex.post = post->as<float>();
  ex.comb = comb->as<float>();
  // The attention takes the input norm into its projections, or (TakesNormedInput) its normed
  // rows from the mix.
  std::unique_ptr<DeviceBuffer> h_bf16;
  if (T > 0 && attention_->TakesNormedInput(layer, T)) {
    h_bf16 = backend_->AllocateScratch(T * H * sizeof(uint16_t));
  }
  if (T > 0) {
    Mix(T, L.attn_hc, (*streams)->as<float>(), post->as<float>(), comb->as<float>(),
        collapsed->as<float>(), h_bf16 != nullptr ? L.input_norm->as<float>() : nullptr, nullptr,
        h_bf16 != nullptr ? h_bf16->as<uint16_t>() : nullptr);
  }
  if (absl::Status st =
          attention_->Forward(layer, ctx, collapsed->as<float>(), L.input_norm->as<float>(),
                              y->as<float>(), h_bf16 != nullptr ? h_bf16->as<uint16_t>() : nullptr);
      !st.ok()) {
    return st;
  }
  if (T > 0) {
    ex.streams_in = (*streams)->as<float>();
    ex.streams_out = (*next)->as<float>();
    ops_->HcExpand(ex);
    std::swap(*streams, *next);
    Mix(T, L.ffn_hc, (*streams)->as<float>(), post->as<float>(), comb->as<float>(),
        collapsed->as<float>(), L.post_attention_norm->as<float>(), h->as<float>());
  }
  if (absl::Status st = moe->Forward(moe_layer, T, h->as<float>(), ids, y->as<float>(), mode);
      !st.ok()) {
    return st;
  }
  if (T > 0) {
    ex.streams_in = (*streams)->as<float>();
    ex.streams_out = (*next)->as<float>();
    ops_->HcExpand(ex);
    std::swap(*streams, *next);
  }
  return absl::OkStatus();
}

std::unique_ptr<DeviceBuffer> DeepseekV4Model::Logits(int64_t R, const float* streams,
                                                      const int32_t* rows) {
  return Logits(R, streams, rows, weights_->hc_head, *weights_->final_norm);
}

std::unique_ptr<DeviceBuffer> DeepseekV4Model::Logits(int64_t R, const float* streams,
                                                      const int32_t* rows,
                                                      const V4HyperConnectionWeights& hc_head,
                                                      const DeviceBuffer& norm) {
  const DeepseekV4Config& c = v4_;
  const int64_t H = c.hidden_size, hc = c.hc_mult, S = hc * H, V = c.vocab_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  auto logits = Floats(R * V);
  if (R == 0) return logits;
  std::unique_ptr<DeviceBuffer> sel;
  if (rows != nullptr) {
    sel = Floats(R * S);
    backend_->GatherRows(R, S, streams, rows, sel->as<float>());
    streams = sel->as<float>();
  }
  auto normed = Floats(R * S), mixes = Floats(R * hc), head = Floats(R * H),
       final_in = Floats(R * H);
  backend_->RmsNorm(R, S, streams, S, ones_->as<float>(), eps, normed->as<float>(), S);
  backend_->Gemm(R, hc, S, normed->as<float>(), S, WeightView(hc_head.fn->as<float>()), S,
                 mixes->as<float>(), hc, false);
  HcHeadArgs a;
  a.rows = R;
  a.hc = hc;
  a.hidden = H;
  a.mixes = mixes->as<float>();
  a.base = hc_head.base->as<float>();
  a.scale = hc_head.scale->as<float>();
  a.eps = static_cast<float>(c.hc_eps);
  a.streams = streams;
  a.out = head->as<float>();
  ops_->HcHead(a);
  backend_->RmsNorm(R, H, head->as<float>(), H, norm.as<float>(), eps, final_in->as<float>(), H);
  backend_->Gemm(R, V, H, final_in->as<float>(), H, weights_->Matrix(weights_->lm_head), H,
                 logits->as<float>(), V, false);
  return logits;
}

absl::StatusOr<StepOutput> DeepseekV4Model::Step(const std::vector<SequenceStep>& batch,
                                                 KvBlockPool* cache) {
  const DeepseekV4Config& c = v4_;
  if (absl::Status st = CheckCache(*cache); !st.ok()) return st;
  const bool hidden = std::any_of(batch.begin(), batch.end(),
                                  [](const SequenceStep& s) { return s.return_hidden; });
  if (!hidden) {
    if (std::optional<absl::StatusOr<StepOutput>> out = graphs_->Run(batch, cache)) {
      return *std::move(out);
    }
  }
  std::vector<V4Sequence> seqs;
  std::vector<int32_t> ids, out_rows;
  for (size_t si = 0; si < batch.size(); ++si) {
    const SequenceStep& s = batch[si];
    if (absl::Status st = CheckSequence(s, si, *cache); !st.ok()) return st;
    V4Sequence q;
    q.replay_from = s.replay_from;
    q.kept_end = s.kept_end;
    q.first_row = static_cast<int64_t>(ids.size());
    q.num_tokens = static_cast<int64_t>(s.tokens.size());
    q.offset = s.position_offset;
    q.block_table = &s.block_table;
    seqs.push_back(q);
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      if (s.all_logits || i + 1 == s.tokens.size()) out_rows.push_back(ids.size());
      ids.push_back(s.tokens[i]);
    }
  }
  // State slots last, once the batch is known to be well formed.
  for (size_t si = 0; si < batch.size(); ++si) {
    auto slot = BindSlot(batch[si], si, cache);
    if (!slot.ok()) return slot.status();
    seqs[si].slot = *slot;
  }
  const int64_t T = static_cast<int64_t>(ids.size());
  V4StepPlan::Inputs pin;
  pin.config = &c;
  pin.cache = cache;
  pin.seqs = &seqs;
  pin.tokens = T;
  pin.full_forward_ties = full_forward_ties_;
  auto plan = V4StepPlan::Build(pin, backend_);
  if (!plan.ok()) return plan.status();
  auto upload_ints = [&](const std::vector<int32_t>& v) {
    auto buf = backend_->AllocateScratch(std::max<size_t>(1, v.size()) * sizeof(int32_t));
    if (!v.empty()) backend_->CopyToDevice(v.data(), v.size() * sizeof(int32_t), buf->data());
    return buf;
  };
  auto ids_dev = upload_ints(ids);
  V4StepContext ctx;
  ctx.plan = plan->get();
  ctx.cache = cache;
  auto streams = Embed(**plan, ids_dev->as<int32_t>());
  auto next = Floats(T * c.hc_mult * c.hidden_size);
  if (absl::Status st = Layers(ctx, ids_dev->as<int32_t>(), nullptr, false, &streams, &next);
      !st.ok()) {
    return st;
  }
  // The rows whose logits are wanted.
  const int64_t R = static_cast<int64_t>(out_rows.size());
  std::unique_ptr<DeviceBuffer> rows_dev = upload_ints(out_rows);
  auto logits = Logits(R, streams->as<float>(), rows_dev->as<int32_t>());
  absl::StatusOr<StepOutput> out =
      SampleOrCopyLogits(backend_, c.vocab_size, batch, logits->as<float>(), R);
  if (out.ok() && hidden) {
    // The residual streams after the last layer, every stream of every new token (the MTP
    // modules' input: docs/model.md, "MTP modules").
    const int64_t S = c.hc_mult * c.hidden_size;
    out->hidden.resize(batch.size());
    for (size_t si = 0; si < batch.size(); ++si) {
      if (!batch[si].return_hidden) continue;
      const int64_t n = seqs[si].num_tokens;
      out->hidden[si].resize(n * S);
      backend_->CopyToHost(streams->as<float>() + seqs[si].first_row * S, n * S * sizeof(float),
                           out->hidden[si].data());
    }
    if (absl::Status st = backend_->status(); !st.ok()) return st;
  }
  return out;
}

absl::StatusOr<bool> DeepseekV4Model::PrepareDecode(const std::vector<SequenceStep>& batch,
                                                    int64_t bucket, KvBlockPool* cache) {
  // Anything the general path would refuse goes there, which says what is wrong.
  for (size_t si = 0; si < batch.size(); ++si) {
    if (!CheckSequence(batch[si], si, *cache).ok()) return false;
  }
  std::vector<V4Sequence> seqs(batch.size());
  for (size_t si = 0; si < batch.size(); ++si) {
    const SequenceStep& s = batch[si];
    auto slot = BindSlot(s, si, cache);
    if (!slot.ok()) return slot.status();
    V4Sequence& q = seqs[si];
    q.first_row = static_cast<int64_t>(si);
    q.num_tokens = 1;
    q.offset = s.position_offset;
    q.block_table = &s.block_table;
    q.slot = *slot;
    q.replay_from = s.replay_from;
    q.kept_end = s.kept_end;
  }
  // Plans hold the cache's geometry and live as long as the graphs that read them; a new cache
  // means new graphs (the runner has dropped the old ones).
  if (plan_cache_id_ != cache->id()) {
    graph_plans_.clear();
    plan_cache_id_ = cache->id();
  }
  V4StepPlan::Inputs pin;
  pin.config = &v4_;
  pin.cache = cache;
  pin.seqs = &seqs;
  pin.full_forward_ties = full_forward_ties_;
  pin.padded_rows = bucket;
  std::unique_ptr<V4StepPlan>& stored = graph_plans_[bucket];
  auto plan = V4StepPlan::Build(pin, backend_, stored.get());
  if (!plan.ok()) return plan.status();
  stored = std::move(*plan);
  return true;
}

absl::Status DeepseekV4Model::DecodeForward(const DecodeGraphInputs& in) {
  const DeepseekV4Config& c = v4_;
  auto it = graph_plans_.find(in.rows);
  if (it == graph_plans_.end()) {
    return absl::InternalError(
        absl::StrCat("DeepseekV4Model: no decode plan for bucket ", in.rows));
  }
  V4StepPlan& plan = *it->second;
  plan.set_block_tables(in.token_seq, in.block_tables, in.max_blocks_per_seq);
  // The indexer's bound holds for every replay: the context class's.
  for (size_t g = 0; g < plan.num_groups(); ++g) {
    const KvCacheGroupSpec& spec = in.cache->spec().groups[g];
    if (spec.ratio > 0) plan.group(g).max_candidates = in.max_context_hint / spec.ratio;
  }
  V4StepContext ctx;
  ctx.plan = &plan;
  ctx.cache = in.cache;
  const int64_t B = in.rows, V = c.vocab_size;
  auto streams = Embed(plan, in.ids);
  auto next = Floats(B * c.hc_mult * c.hidden_size);
  if (absl::Status st = Layers(ctx, in.ids, in.counted, true, &streams, &next); !st.ok()) {
    return st;
  }
  // Every row is a sequence's last token.
  auto logits = Logits(B, streams->as<float>(), nullptr);
  // The greedy and sampled picks (an adjusted copy where the graph has room for adjustments).
  std::unique_ptr<DeviceBuffer> adjusted;
  if (in.adjustment_capacity > 0) adjusted = Floats(B * V);
  DecodeGraphPick(backend_, in, V, logits->as<float>(),
                  adjusted != nullptr ? adjusted->as<float>() : nullptr);
  return absl::OkStatus();
}

}  // namespace deepinfer
