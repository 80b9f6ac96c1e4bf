// Attention ops: non-absorbed MLA prefill where the backend has it, else the absorbed form.
#include "worker/backend/ops/attention_ops.h"

#include <memory>
#include <utility>
#include <vector>

namespace deepinfer {
namespace {

// MlaOutputArgs::q's token stride.
int64_t QTokenStride(const MlaOutputArgs& a) {
  return a.q_token_stride != 0 ? a.q_token_stride : a.heads * (a.nope_dim + a.rope_dim);
}

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
  m.q_token_stride = QTokenStride(a);
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

// The absorbed form: q_nope . W_uk, Backend::MlaAttention over the latent cache, . W_uv, o_proj.
void AbsorbedOutput(Backend* backend, const MlaOutputArgs& a) {
  const int64_t T = a.tokens, nh = a.heads, nope = a.nope_dim, vd = a.v_dim, H = a.hidden_size;
  const int64_t kvl = a.cache.latent_dim, qk = nope + a.rope_dim, ldq = QTokenStride(a);
  auto Floats = [backend](int64_t n) { return backend->AllocateScratch(n * sizeof(float)); };
  // Absorb W_uk into the query: q_latent[t, h] = q_nope[t, h] . W_uk[h], all heads in one
  // batched GEMM (head h: the nope slice of q's head h, block h of w_uk, column block h).
  std::unique_ptr<DeviceBuffer> absorbed;
  const float* q_latent = a.q_latent;
  if (q_latent == nullptr) {
    absorbed = Floats(T * nh * kvl);
    backend->BatchedGemm(nh, T, kvl, nope, a.q, ldq, qk, a.w_uk, nope, kvl * nope,
                         absorbed->as<float>(), nh * kvl, kvl);
    q_latent = absorbed->as<float>();
  }
  auto o_latent = Floats(T * nh * kvl);
  MlaAttentionArgs m;
  m.num_tokens = static_cast<int32_t>(T);
  m.num_heads = static_cast<int32_t>(nh);
  m.q_latent = q_latent;
  m.q_rope = a.q + nope;
  m.q_rope_token_stride = ldq;
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

// Sequences [first, last) of `a` as a call of their own, for the non-absorbed op: their tokens,
// spans counted from their first token (stored in *spans) and block-table rows.
MlaOutputArgs NonAbsorbedPart(const MlaOutputArgs& a, int32_t first, int32_t last,
                              std::vector<MlaSequenceSpan>* spans) {
  const int64_t t0 = a.sequences[first].first_token;
  spans->assign(a.sequences + first, a.sequences + last);
  for (MlaSequenceSpan& s : *spans) s.first_token -= static_cast<int32_t>(t0);
  const MlaSequenceSpan& end = a.sequences[last - 1];
  MlaOutputArgs r = a;
  r.tokens = end.first_token + end.num_tokens - t0;
  r.q = a.q + t0 * QTokenStride(a);
  r.q_latent = nullptr;
  r.block_tables = a.block_tables + static_cast<int64_t>(first) * a.max_blocks_per_seq;
  r.sequences = spans->data();
  r.num_sequences = last - first;
  r.out = a.out + t0 * a.hidden_size;
  return r;
}

// Sequences [first, last) of `a` for the absorbed form: their tokens, with the per-token
// sequence indices and contexts into the whole step's block tables. Only a run that starts the
// step keeps its spans (their indices are the block-table rows); a later run passes none.
MlaOutputArgs AbsorbedPart(const MlaOutputArgs& a, int32_t first, int32_t last) {
  const int64_t t0 = a.sequences[first].first_token;
  const MlaSequenceSpan& end = a.sequences[last - 1];
  const int64_t kvl = a.cache.latent_dim;
  MlaOutputArgs r = a;
  r.tokens = end.first_token + end.num_tokens - t0;
  r.q = a.q + t0 * QTokenStride(a);
  if (a.q_latent != nullptr) r.q_latent = a.q_latent + t0 * a.heads * kvl;
  r.token_seq = a.token_seq + t0;
  r.context_len = a.context_len + t0;
  r.sequences = first == 0 ? a.sequences : nullptr;
  r.num_sequences = first == 0 ? last : 0;
  r.non_absorbed = false;
  r.out = a.out + t0 * a.hidden_size;
  return r;
}

}  // namespace

void MlaAttentionOutput(Backend* backend, const MlaOutputArgs& a) {
  if (!a.non_absorbed || a.sequences == nullptr || a.num_sequences == 0) {
    return AbsorbedOutput(backend, a);
  }
  const int32_t n = a.num_sequences;
  auto takes_non_absorbed = [&](int32_t i) {
    return a.sequences[i].num_tokens >= a.non_absorbed_min_tokens;
  };
  int32_t long_sequences = 0;
  for (int32_t i = 0; i < n; ++i) long_sequences += takes_non_absorbed(i) ? 1 : 0;
  if (long_sequences == n) {
    if (!MhaPrefillOutput(backend, a)) AbsorbedOutput(backend, a);
    return;
  }
  if (long_sequences == 0) return AbsorbedOutput(backend, a);
  // Runs of consecutive sequences of one form; the non-absorbed ones first, so that a backend
  // without that op (it declines the first run, having done nothing) gets one absorbed call.
  std::vector<std::pair<int32_t, int32_t>> runs;
  for (int32_t i = 0; i < n;) {
    int32_t j = i + 1;
    while (j < n && takes_non_absorbed(j) == takes_non_absorbed(i)) ++j;
    runs.emplace_back(i, j);
    i = j;
  }
  bool first_non_absorbed = true;
  std::vector<MlaSequenceSpan> spans;
  for (const auto& [first, last] : runs) {
    if (!takes_non_absorbed(first)) continue;
    if (MhaPrefillOutput(backend, NonAbsorbedPart(a, first, last, &spans))) {
      first_non_absorbed = false;
      continue;
    }
    if (first_non_absorbed) return AbsorbedOutput(backend, a);
    AbsorbedOutput(backend, AbsorbedPart(a, first, last));
  }
  for (const auto& [first, last] : runs) {
    if (!takes_non_absorbed(first)) AbsorbedOutput(backend, AbsorbedPart(a, first, last));
  }
}

}  // namespace deepinfer
