// DeepseekV4Model: the step's metadata, the residual streams and the layer loop.
#include "worker/model/deepseek_v4/deepseek_v4_model.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/model/layers/step_sampling.h"

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
  const int64_t n = std::max(v4_.hc_mult * v4_.hidden_size, v4_.head_dim);
  const std::vector<float> ones(n, 1.0f);
  ones_ = backend_->Allocate(n * sizeof(float));
  backend_->CopyToDevice(ones.data(), n * sizeof(float), ones_->data());
  attention_ = std::make_unique<V4Attention>(v4_, weights_.get(), backend_, ones_->as<float>());
  moe_ = std::make_unique<V4Moe>(v4_, weights_.get(), backend_, std::move(dispatcher));
}

DeepseekV4Model::~DeepseekV4Model() = default;

KvCacheSpec DeepseekV4Model::CacheSpecOf(const DeepseekV4Config& v4) {
  KvCacheSpec spec;
  for (V4AttentionKind kind :
       {V4AttentionKind::kSliding, V4AttentionKind::kCompressed, V4AttentionKind::kSparse}) {
    KvCacheGroupSpec g;
    g.kind = kind == V4AttentionKind::kSliding      ? KvCacheKind::kSlidingWindow
             : kind == V4AttentionKind::kCompressed ? KvCacheKind::kCompressed
                                                    : KvCacheKind::kCompressedSparse;
    g.head_dim = static_cast<int32_t>(v4.head_dim);
    g.window = static_cast<int32_t>(v4.sliding_window);
    if (kind == V4AttentionKind::kSparse) g.index_dim = static_cast<int32_t>(v4.index_head_dim);
    for (int64_t l = 0; l < v4.num_layers; ++l) {
      if (v4.attention[l] != kind) continue;
      g.layers.push_back(static_cast<int32_t>(l));
      g.ratio = static_cast<int32_t>(v4.compress_rate[l]);
    }
    if (!g.layers.empty()) spec.groups.push_back(std::move(g));
  }
  return spec;
}

Architecture DeepseekV4Model::Entry() {
  Architecture a;
  a.name = "DeepseekV4ForCausalLM";
  a.model_types = {"deepseek_v4"};
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
                          float* post, float* comb, float* collapsed) {
  const int64_t S = v4_.hc_mult * v4_.hidden_size, M = v4_.hc_mix();
  auto normed = Floats(T * S), mixes = Floats(T * M);
  backend_->RmsNorm(T, S, streams, S, ones_->as<float>(), static_cast<float>(v4_.rms_norm_eps),
                    normed->as<float>(), S);
  backend_->Gemm(T, M, S, normed->as<float>(), S, WeightView(w.fn->as<float>()), S,
                 mixes->as<float>(), M, false);
  HcMixArgs a;
  a.rows = T;
  a.hc = v4_.hc_mult;
  a.hidden = v4_.hidden_size;
  a.mixes = mixes->as<float>();
  a.base = w.base->as<float>();
  a.scale = w.scale->as<float>();
  a.sinkhorn_iters = static_cast<int32_t>(v4_.hc_sinkhorn_iters);
  a.eps = static_cast<float>(v4_.hc_eps);
  a.streams = streams;
  a.post = post;
  a.comb = comb;
  a.collapsed = collapsed;
  ops_->HcMix(a);
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
  for (int64_t l = 0; l < v4_.num_layers; ++l) {
    const int64_t ratio = v4_.compress_rate[l];
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
  return absl::UnimplementedError(absl::StrCat(
      "DeepSeek-V4 (DeepseekV4ForCausalLM): speculative decoding with its MTP modules is not "
      "implemented (",
      v4_.num_draft_layers, " of ", v4_.num_nextn_predict_layers,
      " loaded and kept; run without --speculative-tokens)"));
}

int64_t DeepseekV4Model::BoundedReplayStart(int64_t kept_end) const {
  int64_t ratio = 0;
  for (int64_t r : v4_.compress_rate) ratio = std::max(ratio, r);
  const int64_t start = kept_end - (v4_.num_layers * (v4_.sliding_window - 1) + 2 * ratio);
  return std::max<int64_t>(0, start);
}

absl::StatusOr<StepOutput> DeepseekV4Model::Step(const std::vector<SequenceStep>& batch,
                                                 KvBlockPool* cache) {
  const DeepseekV4Config& c = v4_;
  const KvBlockPoolOptions& co = cache->options();
  {
    const KvCacheSpec want = CacheSpec();
    bool matches = co.spec.num_layers() == c.num_layers;
    for (int32_t l = 0; matches && l < c.num_layers; ++l) {
      const KvCacheGroupSpec& g = cache->LayerGroup(l);
      const KvCacheGroupSpec* w = nullptr;
      for (const KvCacheGroupSpec& x : want.groups) {
        if (std::find(x.layers.begin(), x.layers.end(), l) != x.layers.end()) w = &x;
      }
      matches = w != nullptr && g.kind == w->kind && g.head_dim == w->head_dim &&
                g.window == w->window && g.ratio == w->ratio && g.index_dim == w->index_dim;
    }
    if (!matches || cache->num_state_slots() == 0) {
      return absl::InvalidArgumentError(absl::StrCat("DeepseekV4Model::Step: the KV cache (",
                                                     co.spec.ToString(), ") is not the model's (",
                                                     want.ToString(), ")"));
    }
  }
  V4StepContext ctx;
  ctx.cache = cache;
  std::vector<int32_t> ids, positions, neg_positions, out_rows;
  for (size_t si = 0; si < batch.size(); ++si) {
    const SequenceStep& s = batch[si];
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
                         " at position ", s.position_offset, " with entries kept up to ",
                         s.kept_end, " (it must start at or before ", start, ", and > 0)"));
      }
    }
    if (absl::Status st = CheckSharedBlocks(s, si, co.block_size); !st.ok()) return st;
    V4Sequence q;
    q.replay_from = s.replay_from;
    q.kept_end = s.kept_end;
    q.first_row = static_cast<int64_t>(ids.size());
    q.num_tokens = static_cast<int64_t>(s.tokens.size());
    q.offset = s.position_offset;
    q.block_table = &s.block_table;
    ctx.seqs.push_back(q);
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      if (s.tokens[i] < 0 || s.tokens[i] >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", si, ": token id ", s.tokens[i], " outside the vocabulary"));
      }
      const int64_t pos = s.position_offset + static_cast<int64_t>(i);
      if (s.all_logits || i + 1 == s.tokens.size()) out_rows.push_back(ids.size());
      ids.push_back(s.tokens[i]);
      positions.push_back(static_cast<int32_t>(pos));
      neg_positions.push_back(-static_cast<int32_t>(pos));
    }
  }
  // State slots last, once the batch is known to be well formed.
  for (size_t si = 0; si < batch.size(); ++si) {
    const SequenceStep& s = batch[si];
    bool fresh = false;
    auto slot = cache->SequenceSlot(s.block_table[s.shared_blocks], &fresh);
    if (!slot.ok()) return slot.status();
    // A rebuild's first step binds a fresh slot at replay_from.
    if (fresh && s.position_offset > s.replay_from) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sequence ", si, " continues at position ", s.position_offset,
          " but the cache holds no state for it (its blocks were freed or never prefilled)"));
    }
    ctx.seqs[si].slot = *slot;
  }
  const int64_t T = static_cast<int64_t>(ids.size());
  auto upload_ints = [&](const std::vector<int32_t>& v) {
    auto buf = backend_->AllocateScratch(std::max<size_t>(1, v.size()) * sizeof(int32_t));
    if (!v.empty()) backend_->CopyToDevice(v.data(), v.size() * sizeof(int32_t), buf->data());
    return buf;
  };
  auto ids_dev = upload_ints(ids);
  auto positions_dev = upload_ints(positions);
  auto neg_dev = upload_ints(neg_positions);
  ctx.num_tokens = T;
  ctx.positions = positions_dev->as<int32_t>();
  ctx.neg_positions = neg_dev->as<int32_t>();

  const int64_t H = c.hidden_size, hc = c.hc_mult, S = hc * H;
  const float eps = static_cast<float>(c.rms_norm_eps);
  // The residual streams: hc copies of each token's embedding, gathered from the table as rows
  // [T * hc, H] (row t * hc + k: token t's id).
  auto streams = Floats(T * S), next = Floats(T * S);
  if (T > 0) {
    std::vector<int32_t> stream_ids(T * hc);
    for (int64_t t = 0; t < T; ++t) {
      std::fill(stream_ids.begin() + t * hc, stream_ids.begin() + (t + 1) * hc, ids[t]);
    }
    auto stream_ids_dev = upload_ints(stream_ids);
    backend_->GatherRows(T * hc, H, weights_->embed->as<float>(), stream_ids_dev->as<int32_t>(),
                         streams->as<float>());
  }
  auto post = Floats(T * hc), comb = Floats(T * hc * hc), collapsed = Floats(T * H);
  auto h = Floats(T * H), y = Floats(T * H);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const V4LayerWeights& L = weights_->layers[l];
    HcExpandArgs ex;
    ex.rows = T;
    ex.hc = hc;
    ex.hidden = H;
    ex.block_out = y->as<float>();
    ex.post = post->as<float>();
    ex.comb = comb->as<float>();
    if (T > 0) {
      Mix(T, L.attn_hc, streams->as<float>(), post->as<float>(), comb->as<float>(),
          collapsed->as<float>());
      backend_->RmsNorm(T, H, collapsed->as<float>(), H, L.input_norm->as<float>(), eps,
                        h->as<float>(), H);
    }
    if (absl::Status st = attention_->Forward(l, ctx, h->as<float>(), y->as<float>()); !st.ok()) {
      return st;
    }
    if (T > 0) {
      ex.streams_in = streams->as<float>();
      ex.streams_out = next->as<float>();
      ops_->HcExpand(ex);
      std::swap(streams, next);
      Mix(T, L.ffn_hc, streams->as<float>(), post->as<float>(), comb->as<float>(),
          collapsed->as<float>());
      backend_->RmsNorm(T, H, collapsed->as<float>(), H, L.post_attention_norm->as<float>(), eps,
                        h->as<float>(), H);
    }
    if (absl::Status st =
            moe_->Forward(l, T, h->as<float>(), ids_dev->as<int32_t>(), y->as<float>());
        !st.ok()) {
      return st;
    }
    if (T > 0) {
      ex.streams_in = streams->as<float>();
      ex.streams_out = next->as<float>();
      ops_->HcExpand(ex);
      std::swap(streams, next);
    }
  }
  // The rows whose logits are wanted: the streams' collapse, final norm, LM head.
  const int64_t R = static_cast<int64_t>(out_rows.size());
  const int64_t V = c.vocab_size;
  auto logits = Floats(R * V);
  if (R > 0) {
    auto rows_dev = upload_ints(out_rows);
    auto sel = Floats(R * S);
    backend_->GatherRows(R, S, streams->as<float>(), rows_dev->as<int32_t>(), sel->as<float>());
    auto normed = Floats(R * S), mixes = Floats(R * hc), head = Floats(R * H),
         final_in = Floats(R * H);
    backend_->RmsNorm(R, S, sel->as<float>(), S, ones_->as<float>(), eps, normed->as<float>(), S);
    backend_->Gemm(R, hc, S, normed->as<float>(), S, WeightView(weights_->hc_head.fn->as<float>()),
                   S, mixes->as<float>(), hc, false);
    HcHeadArgs a;
    a.rows = R;
    a.hc = hc;
    a.hidden = H;
    a.mixes = mixes->as<float>();
    a.base = weights_->hc_head.base->as<float>();
    a.scale = weights_->hc_head.scale->as<float>();
    a.eps = static_cast<float>(c.hc_eps);
    a.streams = sel->as<float>();
    a.out = head->as<float>();
    ops_->HcHead(a);
    backend_->RmsNorm(R, H, head->as<float>(), H, weights_->final_norm->as<float>(), eps,
                      final_in->as<float>(), H);
    backend_->Gemm(R, V, H, final_in->as<float>(), H, weights_->Matrix(weights_->lm_head), H,
                   logits->as<float>(), V, false);
  }
  return SampleOrCopyLogits(backend_, V, batch, logits->as<float>(), R);
}

}  // namespace deepinfer
