// MlaAttention: projections, latent cache write, absorbed or non-absorbed attention, o_proj.
#include "worker/model/attention/mla_attention.h"

#include <utility>
#include <vector>

#include "worker/backend/ops/attention_ops.h"

namespace deepinfer {
namespace {

// HF and DeepSeek build q_a_layernorm / kv_a_layernorm without passing rms_norm_eps.
constexpr float kLatentNormEps = 1e-6f;

}  // namespace

MlaAttention::MlaAttention(const ModelConfig& config, const ModelWeights* weights, Backend* backend)
    : config_(config), weights_(weights), backend_(backend) {
  std::vector<float> inv = config_.RopeInvFreq();
  inv_freq_ = Floats(inv.size());
  backend_->CopyToDevice(inv.data(), inv.size() * sizeof(float), inv_freq_->data());
  rope_attention_factor_ = static_cast<float>(config_.RopeAttentionFactor());
  softmax_scale_ = static_cast<float>(config_.SoftmaxScale());
}

KvCacheSpec MlaAttention::CacheSpec(const ModelConfig& c, WeightDType dtype) {
  return PagedLatentSpec(static_cast<int32_t>(c.num_hidden_layers + c.num_draft_layers),
                         static_cast<int32_t>(c.kv_lora_rank),
                         static_cast<int32_t>(c.qk_rope_head_dim), dtype);
}

void MlaAttention::Forward(int64_t layer, const LayerContext& ctx, ActivationView h, float* out,
                           const ResidualNorm* norm) {
  const ModelConfig& c = config_;
  const ModelWeights& W = *weights_;
  const LayerWeights& L = W.layers[layer];
  const int64_t T = ctx.num_tokens, H = c.hidden_size, nh = c.num_attention_heads;
  const int64_t nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, vd = c.v_head_dim;
  const int64_t kvl = c.kv_lora_rank, qk = c.qk_head_dim(), qdim = nh * qk;
  const int32_t* positions = ctx.positions;

  // The projections of h: the query's first (q_proj, or q_a with q_lora) and kv_a. Queries:
  // [T, heads, nope | rope] at token stride ldq; with q_lora first qa [T, q_lora] at stride
  // ld_proj; latent and shared rope key: [T, kv_lora | rope] at token stride ld_kv. Where L.qkv_a
  // stacks the two projections one GEMM makes each token's row [q or qa | kv]; else each has its
  // own GEMM and buffer.
  const bool lora = c.q_lora_rank > 0;
  const int64_t r = c.q_lora_rank, kvw = kvl + rope;
  const int64_t proj_width = lora ? r : qdim;
  const MatrixBuffer& first = lora ? L.q_a : L.q;
  const bool stacked = L.qkv_a.data != nullptr;
  std::unique_ptr<DeviceBuffer> proj_buf, kv_buf, q_buf;
  float *proj, *kv;
  int64_t ld_proj = proj_width, ld_kv = kvw;
  if (stacked) {
    ld_proj = ld_kv = proj_width + kvw;
    proj_buf = Floats(T * ld_proj);
    proj = proj_buf->as<float>();
    kv = proj + proj_width;
  } else {
    proj_buf = Floats(T * proj_width);
    kv_buf = Floats(T * kvw);
    proj = proj_buf->as<float>();
    kv = kv_buf->as<float>();
  }
  float* q = proj;
  int64_t ldq = ld_proj;
  if (lora) {
    q_buf = Floats(T * qdim);
    q = q_buf->as<float>();
    ldq = qdim;
  }
  if (norm != nullptr) {
    std::vector<NormedGemm> gemms;
    if (stacked) {
      gemms.push_back({proj_width + kvw, W.Matrix(L.qkv_a), H, proj, ld_proj});
    } else {
      gemms.push_back({proj_width, W.Matrix(first), H, proj, proj_width});
      gemms.push_back({kvw, W.Matrix(L.kv_a), H, kv, kvw});
    }
    // AddRmsNormGemms writes exactly one of its two outputs: the GEMMs' operand.
    backend_->AddRmsNormGemms(T, H, norm->x, norm->y, norm->weight, norm->eps,
                              norm->out_bf16 != nullptr ? nullptr : norm->out, norm->out_bf16,
                              gemms);
  } else if (stacked) {
    backend_->Gemm(T, proj_width + kvw, H, h, H, W.Matrix(L.qkv_a), H, proj, ld_proj, false);
  } else {
    backend_->Gemm(T, proj_width, H, h, H, W.Matrix(first), H, proj, proj_width, false);
    backend_->Gemm(T, kvw, H, h, H, W.Matrix(L.kv_a), H, kv, kvw, false);
  }
  if (lora) {
    if (ctx.mode.bf16_operands) {
      auto qa16 = backend_->AllocateScratch(T * r * sizeof(uint16_t));
      backend_->RmsNormBf16(T, r, proj, ld_proj, L.q_a_norm->as<float>(), kLatentNormEps,
                            qa16->as<uint16_t>());
      backend_->Gemm(T, qdim, r, ActivationView::Bf16(qa16->as<uint16_t>()), r, W.Matrix(L.q_b), r,
                     q, qdim, false);
    } else {
      backend_->RmsNorm(T, r, proj, ld_proj, L.q_a_norm->as<float>(), kLatentNormEps, proj,
                        ld_proj);
      backend_->Gemm(T, qdim, r, proj, ld_proj, W.Matrix(L.q_b), r, q, qdim, false);
    }
  }
  const bool il = c.rope_interleave;
  const PagedLatentCacheView view = ctx.cache->LayerView(static_cast<int32_t>(layer));
  const int32_t mha_min_tokens = MhaPrefillMinTokens(ctx);
  const bool mha_prefill = mha_min_tokens > 0;
  // The absorbed query: with fused ops in the same backend op as the cache write (else the
  // attention op makes it).
  std::unique_ptr<DeviceBuffer> q_latent;
  if (ctx.mode.fused) {
    NormRopeCacheArgs nr;
    nr.tokens = T;
    nr.kv = kv;
    nr.ld_kv = ld_kv;
    nr.norm_weight = L.kv_a_norm->as<float>();
    nr.eps = kLatentNormEps;
    nr.q = q + nope;
    nr.q_heads = nh;
    nr.q_token_stride = ldq;
    nr.q_head_stride = qk;
    nr.positions = positions;
    nr.inv_freq = inv_freq_->as<float>();
    nr.attention_factor = rope_attention_factor_;
    nr.interleaved = il;
    nr.slots = ctx.slots;
    nr.cache = view;
    if (!mha_prefill) {
      q_latent = Floats(T * nh * kvl);
      AbsorbQueryArgs aq;
      aq.heads = nh;
      aq.nope_dim = nope;
      aq.latent_dim = kvl;
      aq.q_nope = q;
      aq.q_token_stride = ldq;
      aq.q_head_stride = qk;
      aq.w_uk = W.Matrix(L.w_uk_t);
      aq.q_latent = q_latent->as<float>();
      backend_->NormRopeCacheAbsorbQuery(nr, aq);
    } else {
      backend_->NormRopeWriteLatentCache(nr);
    }
  } else {
    auto latent = Floats(T * kvl);
    backend_->RmsNorm(T, kvl, kv, ld_kv, L.kv_a_norm->as<float>(), kLatentNormEps,
                      latent->as<float>(), kvl);
    backend_->ApplyRope(T, 1, kv + kvl, ld_kv, 0, rope, positions, inv_freq_->as<float>(),
                        rope_attention_factor_, il);
    backend_->ApplyRope(T, nh, q + nope, ldq, qk, rope, positions, inv_freq_->as<float>(),
                        rope_attention_factor_, il);
    backend_->WriteLatentCache(T, latent->as<float>(), kvl, kv + kvl, ld_kv, ctx.slots, view);
  }

  // The attention itself and o_proj: non-absorbed or absorbed, as the op chooses.
  MlaOutputArgs a;
  a.tokens = T;
  a.heads = nh;
  a.nope_dim = nope;
  a.rope_dim = rope;
  a.v_dim = vd;
  a.hidden_size = H;
  a.q = q;
  a.q_token_stride = ldq;
  a.q_latent = q_latent != nullptr ? q_latent->as<float>() : nullptr;
  a.cache = view;
  a.block_tables = ctx.block_tables;
  a.max_blocks_per_seq = ctx.max_blocks_per_seq;
  a.token_seq = ctx.token_seq;
  a.context_len = ctx.context_len;
  a.sequences = ctx.spans.data();
  a.num_sequences = static_cast<int32_t>(ctx.spans.size());
  a.max_context_hint = ctx.max_context_hint;
  a.softmax_scale = softmax_scale_;
  a.w_uk = W.Matrix(L.w_uk_t);
  a.kv_b = W.Matrix(L.kv_b);
  a.o_proj = W.Matrix(L.o_proj);
  a.non_absorbed = mha_prefill;
  a.non_absorbed_min_tokens = mha_min_tokens;
  a.bf16_operands = ctx.mode.bf16_operands;
  a.out = out;
  MlaAttentionOutput(backend_, a);
}

int32_t MlaAttention::MhaPrefillMinTokens(const LayerContext& ctx) const {
  if (prefill_attention_ == PrefillAttention::kAbsorbed || ctx.device_only || ctx.spans.empty()) {
    return 0;
  }
  const int32_t min_tokens =
      prefill_attention_ == PrefillAttention::kMha ? 2 : kMhaPrefillMinTokens;
  for (const MlaSequenceSpan& s : ctx.spans) {
    if (s.num_tokens >= min_tokens) return min_tokens;
  }
  return 0;
}

}  // namespace deepinfer
