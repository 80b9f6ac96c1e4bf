// Attention ops: non-absorbed MLA prefill where the backend has it, else the absorbed form.
#include "worker/backend/ops/attention_ops.h"

#include <memory>

namespace deepinfer {
namespace {

// The non-absorbed attention and o_proj: false, having done nothing, where the backend has no
// such path for the arguments.
bool MhaPrefillOutput(Backend* backend, const MlaOutputArgs& a) {
  const int64_t T = a.tokens, nh = a.heads, vd = a.v_dim, H = a.hidden_size;
  const bool bf16_out = a.bf16_operands;
  auto o = backend->AllocateScratch(T * nh * vd * (bf16_out ? sizeof(uint16_t) : sizeof(float)));
  MhaPrefillArgs m;
  m.num_tokens = static_cast<int32_t>(T);
  m.num_heads = static_cast<int32_t>(nh);
  m.nope_dim = static_cast<int32_t>(a.nope_dim);
  m.v_dim = static_cast<int32_t>(vd);
  m.q = a.q;
  m.q_token_stride = nh * (a.nope_dim + a.rope_dim);
  m.q_head_stride = a.nope_dim + a.rope_dim;
  m.cache = a.cache;
  m.block_tables = a.block_tables;
  m.max_blocks_per_seq = a.max_blocks_per_seq;
  m.kv_b = a.kv_b;
  m.sequences = a.sequences;
  m.num_sequences = a.num_sequences;
  m.softmax_scale = a.softmax_scale;
  if (bf16_out) {
    m.out_bf16 = o->as<uint16_t>();
  } else {
    m.out = o->as<float>();
  }
  if (!backend->MhaPrefillAttention(m)) return false;
  const ActivationView o_view =
      bf16_out ? ActivationView::Bf16(o->as<uint16_t>()) : ActivationView(o->as<float>());
  backend->Gemm(T, H, nh * vd, o_view, nh * vd, a.o_proj, nh * vd, a.out, H, false);
  return true;
}

}  // namespace

void MlaAttentionOutput(Backend* backend, const MlaOutputArgs& a) {
  if (a.non_absorbed && MhaPrefillOutput(backend, a)) return;
  const int64_t T = a.tokens, nh = a.heads, nope = a.nope_dim, vd = a.v_dim, H = a.hidden_size;
  const int64_t kvl = a.cache.latent_dim, qk = nope + a.rope_dim, qdim = nh * qk;
  auto Floats = [backend](int64_t n) { return backend->AllocateScratch(n * sizeof(float)); };
  // Absorb W_uk into the query: q_latent[t, h] = q_nope[t, h] . W_uk[h], all heads in one
  // batched GEMM (head h: the nope slice of q's head h, block h of w_uk, column block h).
  std::unique_ptr<DeviceBuffer> absorbed;
  const float* q_latent = a.q_latent;
  if (q_latent == nullptr) {
    absorbed = Floats(T * nh * kvl);
    backend->BatchedGemm(nh, T, kvl, nope, a.q, qdim, qk, a.w_uk, nope, kvl * nope,
                         absorbed->as<float>(), nh * kvl, kvl);
    q_latent = absorbed->as<float>();
  }
  auto o_latent = Floats(T * nh * kvl);
  MlaAttentionArgs m;
  m.num_tokens = static_cast<int32_t>(T);
  m.num_heads = static_cast<int32_t>(nh);
  m.q_latent = q_latent;
  m.q_rope = a.q + nope;
  m.q_rope_token_stride = qdim;
  m.q_rope_head_stride = qk;
  m.cache = a.cache;
  m.block_tables = a.block_tables;
  m.max_blocks_per_seq = a.max_blocks_per_seq;
  m.token_seq = a.token_seq;
  m.context_len = a.context_len;
  m.softmax_scale = a.softmax_scale;
  m.out_latent = o_latent->as<float>();
  m.sequences = a.sequences;
  m.num_sequences = a.num_sequences;
  m.max_context_hint = a.max_context_hint;
  backend->MlaAttention(m);
  // Lift back through W_uv (value half of kv_b, rows h*(nope+v)+nope ..) and project out.
  auto o = Floats(T * nh * vd);
  backend->BatchedGemm(nh, T, vd, kvl, o_latent->as<float>(), nh * kvl, kvl,
                       a.kv_b.Offset(nope * kvl), kvl, (nope + vd) * kvl, o->as<float>(), nh * vd,
                       vd);
  backend->Gemm(T, H, nh * vd, o->as<float>(), nh * vd, a.o_proj, nh * vd, a.out, H, false);
}

}  // namespace deepinfer
