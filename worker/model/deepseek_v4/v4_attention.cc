// V4Attention: projections, compressors and indexer, attention over the keys in the cache, and
// the cache updates, every row move by the step's plan.
#include "worker/model/deepseek_v4/v4_attention.h"

#include <algorithm>
#include <cmath>

namespace deepinfer {

V4Attention::V4Attention(const DeepseekV4Config& config, const DeepseekV4Weights* weights,
                         Backend* backend, const float* ones)
    : config_(config), weights_(weights), backend_(backend), ops_(backend->v4_ops()), ones_(ones) {
  auto upload = [&](const std::vector<float>& v) {
    auto buf = backend_->Allocate(v.size() * sizeof(float));
    backend_->CopyToDevice(v.data(), v.size() * sizeof(float), buf->data());
    return buf;
  };
  main_inv_freq_ = upload(config_.MainInvFreq());
  compress_inv_freq_ = upload(config_.CompressInvFreq());
}

void V4Attention::NormedGemms(int64_t T, int64_t dim, float* x, const float* weight,
                              const std::vector<NormedGemm>& gemms) {
  const float eps = static_cast<float>(config_.rms_norm_eps);
  if (!fused_ops_) {
    auto normed = Floats(T * dim);
    backend_->RmsNorm(T, dim, x, dim, weight, eps, normed->as<float>(), dim);
    for (const NormedGemm& g : gemms) {
      backend_->Gemm(T, g.n, dim, normed->as<float>(), dim, g.w, g.ldw, g.c, g.ldc, false);
    }
    return;
  }
  bool bf16 = true;
  for (const NormedGemm& g : gemms) bf16 = bf16 && g.w.dtype == WeightDType::kBFloat16;
  if (bf16) {
    auto normed = backend_->AllocateScratch(std::max<int64_t>(1, T * dim) * sizeof(uint16_t));
    backend_->AddRmsNormGemms(T, dim, x, nullptr, weight, eps, nullptr, normed->as<uint16_t>(),
                              gemms);
  } else {
    auto normed = Floats(T * dim);
    backend_->AddRmsNormGemms(T, dim, x, nullptr, weight, eps, normed->as<float>(), nullptr, gemms);
  }
}

bool V4Attention::NormRopeBf16(int64_t tokens, int64_t heads, int64_t dim, const float* x,
                               const uint16_t* x_bf16, uint16_t* out, const int32_t* positions,
                               const float* inv_freq, float factor) {
  NormRopeArgs a;
  a.tokens = tokens, a.heads = heads, a.dim = dim, a.rope_dim = config_.rope_dim;
  a.x = x, a.x_bf16 = x_bf16, a.weight = ones_, a.eps = static_cast<float>(config_.rms_norm_eps);
  a.out_bf16 = out;
  a.positions = positions, a.inv_freq = inv_freq, a.attention_factor = factor;
  return ops_->NormRope(a);
}

bool V4Attention::QueryBf16(int64_t T, float* qr, const V4AttentionWeights& A,
                            const int32_t* positions, const float* inv_freq, float factor,
                            DeviceBuffer* iq, std::unique_ptr<DeviceBuffer>* q16) {
  const DeepseekV4Config& c = config_;
  const int64_t NH = c.num_heads, D = c.head_dim, QL = c.q_lora_rank;
  auto normed = backend_->AllocateScratch(T * QL * sizeof(uint16_t));
  backend_->AddRmsNorm(T, QL, qr, nullptr, A.q_a_norm->as<float>(),
                       static_cast<float>(c.rms_norm_eps), nullptr, normed->as<uint16_t>());
  const ActivationView nv = ActivationView::Bf16(normed->as<uint16_t>());
  *q16 = backend_->AllocateScratch(T * NH * D * sizeof(uint16_t));
  uint16_t* q16p = (*q16)->as<uint16_t>();
  bool roped;
  if (backend_->GemmToBf16(T, NH * D, QL, nv, QL, weights_->Matrix(A.q_b), QL, q16p, NH * D)) {
    roped = NormRopeBf16(T, NH, D, nullptr, q16p, q16p, positions, inv_freq, factor);
  } else {
    auto q = Floats(T * NH * D);
    backend_->Gemm(T, NH * D, QL, nv, QL, weights_->Matrix(A.q_b), QL, q->as<float>(), NH * D,
                   false);
    roped = NormRopeBf16(T, NH, D, q->as<float>(), nullptr, q16p, positions, inv_freq, factor);
  }
  if (iq != nullptr) {
    const int64_t n = c.index_n_heads * c.index_head_dim;
    backend_->Gemm(T, n, QL, nv, QL, weights_->Matrix(A.index_q_b), QL, iq->as<float>(), n, false);
  }
  return roped;
}

NormRopeArgs V4Attention::NormRopeArgsOf(int64_t tokens, int64_t heads, int64_t dim, const float* x,
                                         const float* weight, float* out, const int32_t* positions,
                                         const float* inv_freq, float factor) const {
  NormRopeArgs a;
  a.tokens = tokens, a.heads = heads, a.dim = dim, a.rope_dim = config_.rope_dim;
  a.x = x, a.weight = weight, a.eps = static_cast<float>(config_.rms_norm_eps), a.out = out;
  a.positions = positions, a.inv_freq = inv_freq, a.attention_factor = factor;
  return a;
}

void V4Attention::NormRope(const NormRopeArgs& a) {
  if (fused_ops_ && ops_->NormRope(a)) return;
  const int64_t rd = a.rope_dim;
  backend_->RmsNorm(a.tokens * a.heads, a.dim, a.x, a.dim, a.weight, a.eps, a.out, a.dim);
  backend_->ApplyRope(a.tokens, a.heads, a.out + a.dim - rd, a.heads * a.dim, a.dim, rd,
                      a.positions, a.inv_freq, a.attention_factor, /*interleaved=*/true);
}

void V4Attention::NormRope(int64_t tokens, int64_t heads, int64_t dim, const float* x,
                           const float* weight, float* out, const int32_t* positions,
                           const float* inv_freq, float factor) {
  NormRope(NormRopeArgsOf(tokens, heads, dim, x, weight, out, positions, inv_freq, factor));
}

void V4Attention::NormRopePair(const NormRopeArgs& first, const NormRopeArgs& second) {
  if (fused_ops_ && ops_->NormRopePair(first, second)) return;
  NormRope(first);
  NormRope(second);
}

std::unique_ptr<DeviceBuffer> V4Attention::CompressorRows(int64_t T, const V4CompressorPlan& cp,
                                                          const V4CompressorWeights& w,
                                                          std::vector<NormedGemm>* gemms) {
  const int64_t H = config_.hidden_size, rw = cp.row_floats, width = rw / 2;  // kv then gate
  auto rows = Floats(T * rw);
  gemms->push_back({width, weights_->Matrix(w.kv_proj), H, rows->as<float>(), rw});
  gemms->push_back({width, weights_->Matrix(w.gate_proj), H, rows->as<float>() + width, rw});
  return rows;
}

void V4Attention::Compress(const V4StepContext& ctx, const V4GroupPlan& gp,
                           const V4CompressorPlan& cp, float* rp, const V4CompressorWeights& w,
                           float* state, float* stream) {
  const DeepseekV4Config& c = config_;
  const int64_t dim = cp.dim;
  const int64_t rw = cp.row_floats, width = rw / 2;  // a row: kv then gate
  const int64_t NW = gp.windows;
  if (NW > 0) {
    // The windows' slots from this step's rows and the ring (before the ring takes this step's
    // rows), pooled, normed, roped at the window's first position, written to the stream.
    auto wbuf = Floats(NW * cp.slots * rw);
    Move(cp.gather_new, rw, rp, wbuf->as<float>());
    Move(cp.gather_ring, rw, state, wbuf->as<float>());
    auto pooled = Floats(NW * dim), normed = Floats(NW * dim);
    CompressWindowsArgs a;
    a.windows = NW;
    a.ratio = cp.ratio;
    a.dim = dim;
    a.overlap = cp.overlap;
    a.kv = wbuf->as<float>();
    a.gate = wbuf->as<float>() + width;
    a.row_stride = rw;
    a.bias = w.position_bias->as<float>();
    a.has_prev = gp.has_prev;
    a.out = pooled->as<float>();
    ops_->CompressWindows(a);
    NormRope(NW, 1, dim, pooled->as<float>(), w.kv_norm->as<float>(), normed->as<float>(),
             gp.window_pos, compress_inv_freq_->as<float>(), c.CompressAttentionFactor());
    Move(cp.entries, cp.piece, normed->as<float>(), stream);
  }
  // Keep the last ring rows of each sequence for the windows still open.
  Move(cp.ring, rw, rp, state);
}

const V4AttentionWeights& V4Attention::WeightsOf(int64_t layer) const {
  // Cache layers past the model's are its MTP modules' (DeepseekV4Model::CacheSpecOf).
  const int64_t module = layer - config_.num_layers;
  return module < 0 ? weights_->layers[layer].attention : weights_->mtp[module].block.attention;
}

V4AttentionKind V4Attention::KindOf(int64_t layer) const {
  const int64_t module = layer - config_.num_layers;
  return module < 0 ? config_.attention[layer] : config_.mtp_attention[module];
}

bool V4Attention::TakesNormedInput(int64_t layer, int64_t T) const {
  if (!fused_ops_ || T < kNormedInputMinRows) return false;
  const V4AttentionWeights& A = WeightsOf(layer);
  const V4AttentionKind kind = KindOf(layer);
  // The matrices of Forward's h_gemms.
  std::vector<const std::unique_ptr<DeviceBuffer>*> h = {&A.q_a, &A.kv_proj};
  if (kind != V4AttentionKind::kSliding) {
    h.insert(h.end(), {&A.compressor.kv_proj, &A.compressor.gate_proj});
  }
  if (kind == V4AttentionKind::kSparse) {
    h.insert(h.end(), {&A.indexer.kv_proj, &A.indexer.gate_proj, &A.index_weights});
  }
  for (const auto* m : h) {
    if (weights_->Matrix(*m).dtype != WeightDType::kBFloat16) return false;
  }
  return true;
}

absl::Status V4Attention::Forward(int64_t layer, const V4StepContext& ctx, float* x,
                                  const float* norm_weight, float* out, const uint16_t* h_bf16) {
  const DeepseekV4Config& c = config_;
  const V4AttentionWeights& A = WeightsOf(layer);
  const V4AttentionKind kind = KindOf(layer);
  const int64_t T = ctx.plan->tokens();
  if (T == 0) return absl::OkStatus();
  const int64_t H = c.hidden_size, D = c.head_dim, NH = c.num_heads, QL = c.q_lora_rank;
  const int64_t IH = c.index_n_heads, ID = c.index_head_dim;
  const int64_t rd = c.rope_dim;
  const bool compressed = kind != V4AttentionKind::kSliding;
  const bool sparse = kind == V4AttentionKind::kSparse;
  const float* inv = compressed ? compress_inv_freq_->as<float>() : main_inv_freq_->as<float>();
  const float factor = compressed ? c.CompressAttentionFactor() : 1.0f;
  const int32_t l32 = static_cast<int32_t>(layer);
  const V4StepPlan& plan = *ctx.plan;
  const V4GroupPlan& gp = plan.group_of_layer(l32);

  // Every projection of h = RmsNorm(x): the queries' q_residual (q_a), the shared K = V head,
  // the compressors' rows, the indexer's per-head weights.
  auto qr = Floats(T * QL), kv = Floats(T * D);
  std::vector<NormedGemm> h_gemms = {{QL, weights_->Matrix(A.q_a), H, qr->as<float>(), QL},
                                     {D, weights_->Matrix(A.kv_proj), H, kv->as<float>(), D}};
  std::unique_ptr<DeviceBuffer> compressor_rows, indexer_rows, iw;
  if (compressed) compressor_rows = CompressorRows(T, gp.compressor, A.compressor, &h_gemms);
  if (sparse) {
    indexer_rows = CompressorRows(T, gp.indexer, A.indexer, &h_gemms);
    iw = Floats(T * IH);
    h_gemms.push_back({IH, weights_->Matrix(A.index_weights), H, iw->as<float>(), IH});
  }
  if (h_bf16 != nullptr) {
    for (const NormedGemm& g : h_gemms) {
      backend_->Gemm(T, g.n, H, ActivationView::Bf16(h_bf16), H, g.w, g.ldw, g.c, g.ldc, false);
    }
  } else {
    NormedGemms(T, H, x, norm_weight, h_gemms);
  }

  // Queries: q = q_b RmsNorm(q_residual) (the indexer's queries: index_q_b of the same normed
  // rows), normed per head, rope slice.
  // The query and the attention's output in bf16 where the backend takes them (prefill with
  // bf16 weights): the query normed, roped and rounded in one pass (the rounding the bf16
  // attention applies), the output rotated back and rounded in the attention's epilogue (the
  // rounding the bf16 o_a GEMM applies).
  const bool bf16_qo = fused_ops_ && ops_->TakesBf16Attention(T, NH, D) &&
                       weights_->Matrix(A.o_a).dtype == WeightDType::kBFloat16;
  // With bf16 q_b (and index_q_b) weights the bf16 query is q_b's bf16 output normed and roped in
  // place (QueryBf16).
  const WeightView q_b = weights_->Matrix(A.q_b);
  std::unique_ptr<DeviceBuffer> q, q16, iq;
  if (sparse) iq = Floats(T * IH * ID);
  if (bf16_qo && q_b.dtype == WeightDType::kBFloat16 &&
      (!sparse || weights_->Matrix(A.index_q_b).dtype == WeightDType::kBFloat16)) {
    if (!QueryBf16(T, qr->as<float>(), A, plan.positions(), inv, factor, iq.get(), &q16)) {
      return absl::InternalError("V4Attention: the backend took a bf16 query but not its NormRope");
    }
  } else {
    q = Floats(T * NH * D);
    std::vector<NormedGemm> q_gemms = {{NH * D, q_b, QL, q->as<float>(), NH * D}};
    if (sparse) {
      q_gemms.push_back({IH * ID, weights_->Matrix(A.index_q_b), QL, iq->as<float>(), IH * ID});
    }
    NormedGemms(T, QL, qr->as<float>(), A.q_a_norm->as<float>(), q_gemms);
    if (bf16_qo) {
      q16 = backend_->AllocateScratch(T * NH * D * sizeof(uint16_t));
      if (!NormRopeBf16(T, NH, D, q->as<float>(), nullptr, q16->as<uint16_t>(), plan.positions(),
                        inv, factor)) {
        return absl::InternalError(
            "V4Attention: the backend took a bf16 query but not its NormRope");
      }
      q.reset();
    }
  }
  // The shared K = V head; in one op with the fp32 query's, which is normed per head in place (no
  // second [T, NH * D] buffer).
  auto kvn = Floats(T * D);
  const NormRopeArgs kv_args = NormRopeArgsOf(T, 1, D, kv->as<float>(), A.kv_norm->as<float>(),
                                              kvn->as<float>(), plan.positions(), inv, factor);
  if (bf16_qo) {
    NormRope(kv_args);
  } else {
    NormRopePair(NormRopeArgsOf(T, NH, D, q->as<float>(), ones_, q->as<float>(), plan.positions(),
                                inv, factor),
                 kv_args);
  }

  const KvCacheGroupSpec& g = ctx.cache->LayerGroup(l32);
  const int32_t bs = ctx.cache->block_size();
  float* state = ctx.cache->SequenceState(l32, 0);  // slot 0: the layer's state
  float* stream = static_cast<float*>(ctx.cache->LayerData(l32));
  const int64_t Pc = g.CompressedFloatsPerBlock(bs);
  const int64_t Pi = g.IndexFloatsPerBlock(bs);
  float* index_stream = stream + int64_t{ctx.cache->num_blocks()} * Pc;
  if (compressed) {
    Compress(ctx, gp, gp.compressor, compressor_rows->as<float>(), A.compressor, state, stream);
    compressor_rows.reset();
  }
  if (sparse) {
    Compress(ctx, gp, gp.indexer, indexer_rows->as<float>(), A.indexer, state, index_stream);
    indexer_rows.reset();
  }

  const int64_t topk = c.index_topk;
  std::unique_ptr<DeviceBuffer> selected;
  if (sparse) {
    backend_->ApplyRope(T, IH, iq->as<float>() + ID - rd, IH * ID, ID, rd, plan.positions(),
                        compress_inv_freq_->as<float>(), c.CompressAttentionFactor(), true);
    selected = backend_->AllocateScratch(std::max<int64_t>(1, T * topk) * sizeof(int32_t));
    IndexerTopKArgs a;
    a.tokens = T;
    a.heads = IH;
    a.dim = ID;
    a.topk = topk;
    a.q = iq->as<float>();
    a.weights = iw->as<float>();
    a.weight_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(IH)));
    a.key_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ID)));
    a.keys = {index_stream, Pi, plan.block_tables(), plan.table_stride(), plan.token_seq()};
    a.candidates = gp.candidates;
    a.visible = gp.visible;
    a.max_candidates = gp.max_candidates;
    a.selected = selected->as<int32_t>();
    ops_->IndexerTopK(a);
    iq.reset();
    iw.reset();
  }

  // Each query over its window (the ring's keys before this step, this step's after) and its
  // compressed entries (HCA: every entry it sees; CSA: the indexer's choice), in place.
  std::unique_ptr<DeviceBuffer> o;
  SinkAttentionArgs sa;
  sa.tokens = T;
  sa.heads = NH;
  sa.dim = D;
  if (bf16_qo) {
    o = backend_->AllocateScratch(T * NH * D * sizeof(uint16_t));
    sa.q_bf16 = q16->as<uint16_t>();
    // K = V carried the keys' rotation into the output: its rope slice rotated back.
    sa.out_bf16 = o->as<uint16_t>();
    sa.out_rope_dim = rd;
    sa.out_rope_positions = plan.neg_positions();
    sa.out_rope_inv_freq = inv;
    sa.out_rope_factor = factor;
  } else {
    o = Floats(T * NH * D);
    sa.q = q->as<float>();
    sa.out = o->as<float>();
  }
  sa.kv = kvn->as<float>();
  sa.positions = plan.positions();
  sa.window_len = plan.window_len();
  sa.step_start = plan.step_start();
  sa.ring = state;
  sa.ring_rows = g.window_rows();
  sa.ring_stride = g.StateFloats();
  sa.ring_slot = plan.slot();
  if (compressed) {
    sa.entries = {stream, Pc, plan.block_tables(), plan.table_stride(), plan.token_seq()};
    sa.entry_table_rows = plan.table_rows();
    if (sparse) {
      sa.selected = selected->as<int32_t>();
      sa.selected_stride = topk;
    } else {
      sa.extra_len = gp.visible;
    }
  }
  sa.sinks = A.sinks->as<float>();
  sa.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  ops_->SinkAttention(sa);
  q16.reset();

  // The window ring keeps the last window_rows() keys.
  Move(gp.window_ring, D, kvn->as<float>(), state);

  // K = V carried the keys' rotation into the output: rotate its rope slice back (bf16: done).
  if (!bf16_qo) {
    backend_->ApplyRope(T, NH, o->as<float>() + D - rd, NH * D, D, rd, plan.neg_positions(), inv,
                        factor, true);
  }
  const ActivationView ov =
      bf16_qo ? ActivationView::Bf16(o->as<uint16_t>()) : ActivationView(o->as<float>());
  // Grouped output projection: group g of heads through o_a's rows of group g, then o_b.
  const int64_t G = c.o_groups, OL = c.o_lora_rank, in = NH * D / G;
  const WeightView o_a = weights_->Matrix(A.o_a), o_b = weights_->Matrix(A.o_b);
  // With the bf16 output and bf16 o_b, the groups' products in bf16 where the backend writes them
  // so (Backend::BatchedGemmToBf16): the rounding o_b's bf16 operand gets anyway (and HF's bf16
  // o_a applies), without an fp32 buffer written, read and rounded between the two.
  if (bf16_qo && o_b.dtype == WeightDType::kBFloat16) {
    auto og16 = backend_->AllocateScratch(T * G * OL * sizeof(uint16_t));
    if (backend_->BatchedGemmToBf16(G, T, OL, in, ov, NH * D, in, o_a, in, OL * in,
                                    og16->as<uint16_t>(), G * OL, OL)) {
      backend_->Gemm(T, H, G * OL, ActivationView::Bf16(og16->as<uint16_t>()), G * OL, o_b, G * OL,
                     out, H, false);
      return absl::OkStatus();
    }
  }
  auto og = Floats(T * G * OL);
  backend_->BatchedGemm(G, T, OL, in, ov, NH * D, in, o_a, in, OL * in, og->as<float>(), G * OL,
                        OL);
  backend_->Gemm(T, H, G * OL, og->as<float>(), G * OL, o_b, G * OL, out, H, false);
  return absl::OkStatus();
}

}  // namespace deepinfer
