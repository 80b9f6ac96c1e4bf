// V4Attention: projections, compressors and indexer, the rows each query attends over, and the
// cache updates. A step gathers one key matrix: per sequence its window keys (from the ring and
// this step, in position order) then its compressed entries (from the paged stream); each query's
// rows are a window range and a range of entries (or the indexer's choice among them), computed
// on the host from the step's shapes, so nothing is read back. Rows move in runs (a ring's rows
// in at most two copies, a sequence's new windows in one paged write, a compressor's windows in
// one gather), so the number of copies a step issues does not grow with its tokens.
#include "worker/model/deepseek_v4/v4_attention.h"

#include <algorithm>
#include <cmath>

namespace deepinfer {

void ReadPaged(Backend* backend, const float* stream, int64_t P, const std::vector<int32_t>& table,
               int64_t begin, int64_t count, float* dst) {
  while (count > 0) {
    const int64_t b = begin / P, off = begin % P, run = std::min(count, P - off);
    backend->CopyDeviceToDevice(stream + int64_t{table[b]} * P + off, run * sizeof(float), dst);
    begin += run;
    count -= run;
    dst += run;
  }
}

void WritePaged(Backend* backend, float* stream, int64_t P, const std::vector<int32_t>& table,
                int64_t begin, int64_t count, const float* src) {
  while (count > 0) {
    const int64_t b = begin / P, off = begin % P, run = std::min(count, P - off);
    backend->CopyDeviceToDevice(src, run * sizeof(float), stream + int64_t{table[b]} * P + off);
    begin += run;
    count -= run;
    src += run;
  }
}

void ReadRing(Backend* backend, const float* ring, int64_t ring_rows, int64_t width, int64_t begin,
              int64_t end, float* dst) {
  while (begin < end) {
    const int64_t row = begin % ring_rows, run = std::min(end - begin, ring_rows - row);
    backend->CopyDeviceToDevice(ring + row * width, run * width * sizeof(float), dst);
    begin += run;
    dst += run * width;
  }
}

void WriteRing(Backend* backend, const float* src, int64_t ring_rows, int64_t width, int64_t begin,
               int64_t end, float* ring) {
  // Rows older than the last ring_rows would be overwritten within this call: skipped.
  const int64_t first = std::max(begin, end - ring_rows);
  src += (first - begin) * width;
  begin = first;
  while (begin < end) {
    const int64_t row = begin % ring_rows, run = std::min(end - begin, ring_rows - row);
    backend->CopyDeviceToDevice(src, run * width * sizeof(float), ring + row * width);
    begin += run;
    src += run * width;
  }
}

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

std::unique_ptr<DeviceBuffer> V4Attention::Ints(const std::vector<int32_t>& v) {
  auto buf = backend_->AllocateScratch(std::max<size_t>(1, v.size()) * sizeof(int32_t));
  if (!v.empty()) backend_->CopyToDevice(v.data(), v.size() * sizeof(int32_t), buf->data());
  return buf;
}

void V4Attention::Compress(int64_t layer, const V4StepContext& ctx, const float* h,
                           const V4CompressorWeights& w, int64_t ratio, bool overlap,
                           int64_t state_offset, int64_t ring_rows, float* stream, int64_t P) {
  const DeepseekV4Config& c = config_;
  const int64_t T = ctx.num_tokens, H = c.hidden_size, dim = w.dim, rd = c.rope_dim;
  const int64_t width = overlap ? 2 * dim : dim, rw = 2 * width;  // a row: kv then gate

  // The windows this step closes: entries o / ratio .. (o + n) / ratio - 1 of each sequence.
  struct Window {
    size_t seq;
    int64_t index;
  };
  std::vector<Window> windows;
  for (size_t s = 0; s < ctx.seqs.size(); ++s) {
    const V4Sequence& q = ctx.seqs[s];
    // Windows ending at or before kept_end hold kept entries (a bounded rebuild).
    for (int64_t i = std::max(q.offset, q.kept_end) / ratio; i < (q.offset + q.num_tokens) / ratio;
         ++i) {
      windows.push_back({s, i});
    }
  }
  const int64_t NW = static_cast<int64_t>(windows.size());
  const int64_t slots = overlap ? 2 * ratio : ratio;
  // The source row of every window slot, in a buffer of this step's rows (T) followed by the
  // rings of the sequences whose windows reach back before this step: row i of sequence s's
  // ring copy at T + ring_base[s] + i. A slot before the sequence's start (has_prev 0) is never
  // read; it names row 0.
  std::vector<int64_t> ring_base(ctx.seqs.size(), -1);
  std::vector<int32_t> source(NW * slots, 0), has_prev(NW), win_pos(NW);
  int64_t ring_copies = 0;
  for (int64_t wi = 0; wi < NW; ++wi) {
    const size_t s = windows[wi].seq;
    const V4Sequence& q = ctx.seqs[s];
    const int64_t first = windows[wi].index * ratio - (overlap ? ratio : 0);
    for (int64_t j = 0; j < slots; ++j) {
      const int64_t p = first + j;
      if (p < 0) continue;
      if (p >= q.offset) {
        source[wi * slots + j] = static_cast<int32_t>(q.first_row + p - q.offset);
        continue;
      }
      if (ring_base[s] < 0) ring_base[s] = ring_rows * ring_copies++;
      source[wi * slots + j] = static_cast<int32_t>(T + ring_base[s] + p % ring_rows);
    }
    has_prev[wi] = windows[wi].index > 0;
    win_pos[wi] = static_cast<int32_t>(windows[wi].index * ratio);
  }
  auto rows = Floats((T + ring_copies * ring_rows) * rw);
  float* rp = rows->as<float>();
  backend_->Gemm(T, width, H, h, H, weights_->Matrix(w.kv_proj), H, rp, rw, false);
  backend_->Gemm(T, width, H, h, H, weights_->Matrix(w.gate_proj), H, rp + width, rw, false);
  for (size_t s = 0; s < ctx.seqs.size(); ++s) {
    if (ring_base[s] < 0) continue;
    const float* state = ctx.cache->SequenceState(static_cast<int32_t>(layer), ctx.seqs[s].slot);
    Copy(state + state_offset, ring_rows * rw, rp + (T + ring_base[s]) * rw);
  }
  if (NW > 0) {
    auto source_dev = Ints(source);
    auto wbuf = Floats(NW * slots * rw);
    backend_->GatherRows(NW * slots, rw, rp, source_dev->as<int32_t>(), wbuf->as<float>());
    auto has_prev_dev = Ints(has_prev);
    auto pos_dev = Ints(win_pos);
    auto pooled = Floats(NW * dim), normed = Floats(NW * dim);
    CompressWindowsArgs a;
    a.windows = NW;
    a.ratio = ratio;
    a.dim = dim;
    a.overlap = overlap;
    a.kv = wbuf->as<float>();
    a.gate = wbuf->as<float>() + width;
    a.row_stride = rw;
    a.bias = w.position_bias->as<float>();
    a.has_prev = has_prev_dev->as<int32_t>();
    a.out = pooled->as<float>();
    ops_->CompressWindows(a);
    backend_->RmsNorm(NW, dim, pooled->as<float>(), dim, w.kv_norm->as<float>(),
                      static_cast<float>(c.rms_norm_eps), normed->as<float>(), dim);
    backend_->ApplyRope(NW, 1, normed->as<float>() + dim - rd, dim, dim, rd, pos_dev->as<int32_t>(),
                        compress_inv_freq_->as<float>(), c.CompressAttentionFactor(),
                        /*interleaved=*/true);
    // A sequence's windows are consecutive entries: one paged write each.
    for (int64_t wi = 0; wi < NW;) {
      int64_t end = wi + 1;
      while (end < NW && windows[end].seq == windows[wi].seq) ++end;
      const V4Sequence& q = ctx.seqs[windows[wi].seq];
      WritePaged(backend_, stream, P, *q.block_table, windows[wi].index * dim, (end - wi) * dim,
                 normed->as<float>() + wi * dim);
      wi = end;
    }
  }
  // Keep the last ring_rows source rows for the windows still open.
  for (const V4Sequence& q : ctx.seqs) {
    float* state = ctx.cache->SequenceState(static_cast<int32_t>(layer), q.slot);
    WriteRing(backend_, rp + q.first_row * rw, ring_rows, rw, q.offset, q.offset + q.num_tokens,
              state + state_offset);
  }
}

absl::Status V4Attention::Forward(int64_t layer, const V4StepContext& ctx, const float* h,
                                  float* out) {
  const DeepseekV4Config& c = config_;
  const V4AttentionWeights& A = weights_->layers[layer].attention;
  const int64_t T = ctx.num_tokens;
  if (T == 0) return absl::OkStatus();
  const int64_t H = c.hidden_size, D = c.head_dim, NH = c.num_heads, QL = c.q_lora_rank;
  const int64_t rd = c.rope_dim, W = c.sliding_window;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const V4AttentionKind kind = c.attention[layer];
  const bool compressed = kind != V4AttentionKind::kSliding;
  const bool sparse = kind == V4AttentionKind::kSparse;
  const float* inv = compressed ? compress_inv_freq_->as<float>() : main_inv_freq_->as<float>();
  const float factor = compressed ? c.CompressAttentionFactor() : 1.0f;

  // Queries: q_residual = RmsNorm(q_a h); q = q_b q_residual, normed per head, rope slice.
  auto qr = Floats(T * QL), qrn = Floats(T * QL);
  backend_->Gemm(T, QL, H, h, H, weights_->Matrix(A.q_a), H, qr->as<float>(), QL, false);
  backend_->RmsNorm(T, QL, qr->as<float>(), QL, A.q_a_norm->as<float>(), eps, qrn->as<float>(), QL);
  auto q = Floats(T * NH * D), qn = Floats(T * NH * D);
  backend_->Gemm(T, NH * D, QL, qrn->as<float>(), QL, weights_->Matrix(A.q_b), QL, q->as<float>(),
                 NH * D, false);
  backend_->RmsNorm(T * NH, D, q->as<float>(), D, ones_, eps, qn->as<float>(), D);
  backend_->ApplyRope(T, NH, qn->as<float>() + D - rd, NH * D, D, rd, ctx.positions, inv, factor,
                      true);
  // The shared K = V head.
  auto kv = Floats(T * D), kvn = Floats(T * D);
  backend_->Gemm(T, D, H, h, H, weights_->Matrix(A.kv_proj), H, kv->as<float>(), D, false);
  backend_->RmsNorm(T, D, kv->as<float>(), D, A.kv_norm->as<float>(), eps, kvn->as<float>(), D);
  backend_->ApplyRope(T, 1, kvn->as<float>() + D - rd, D, D, rd, ctx.positions, inv, factor, true);

  const int32_t l32 = static_cast<int32_t>(layer);
  const KvCacheGroupSpec& g = ctx.cache->LayerGroup(l32);
  const int32_t bs = ctx.cache->block_size();
  float* stream = static_cast<float*>(ctx.cache->LayerData(l32));
  const int64_t Pc = g.CompressedFloatsPerBlock(bs);
  const int64_t Pi = g.IndexFloatsPerBlock(bs);
  float* index_stream = stream + int64_t{ctx.cache->num_blocks()} * Pc;
  const int64_t ratio = compressed ? g.ratio : 1;
  if (compressed) {
    Compress(layer, ctx, h, A.compressor, ratio, sparse, g.compressor_state_offset(),
             g.compressor_rows(), stream, Pc);
    if (sparse) {
      Compress(layer, ctx, h, A.indexer, ratio, true, g.indexer_state_offset(), g.compressor_rows(),
               index_stream, Pi);
    }
  }

  // The key matrix: per sequence its window rows before this step (ring), this step's rows,
  // then its compressed entries.
  std::vector<int64_t> base(ctx.seqs.size()), ring_first(ctx.seqs.size()), entries(ctx.seqs.size());
  int64_t rows = 0;
  for (size_t s = 0; s < ctx.seqs.size(); ++s) {
    const V4Sequence& q = ctx.seqs[s];
    base[s] = rows;
    ring_first[s] = std::max<int64_t>(q.replay_from, q.offset - W + 1);
    entries[s] = compressed ? (q.offset + q.num_tokens) / ratio : 0;
    rows += (q.offset - ring_first[s]) + q.num_tokens + entries[s];
  }
  auto keys = Floats(rows * D);
  float* kp = keys->as<float>();
  for (size_t s = 0; s < ctx.seqs.size(); ++s) {
    const V4Sequence& q = ctx.seqs[s];
    const float* ring = ctx.cache->SequenceState(l32, q.slot);
    int64_t r = base[s];
    ReadRing(backend_, ring, W, D, ring_first[s], q.offset, kp + r * D);
    r += q.offset - ring_first[s];
    Copy(kvn->as<float>() + q.first_row * D, q.num_tokens * D, kp + r * D);
    r += q.num_tokens;
    if (entries[s] > 0)
      ReadPaged(backend_, stream, Pc, *q.block_table, 0, entries[s] * D, kp + r * D);
  }

  // Per query: its window (positions p - W + 1 .. p, contiguous rows of its sequence's block of
  // the key matrix) and its compressed entries (from row `comp` of that block: on HCA layers the
  // first `visible`, on CSA layers the indexer's choice among them).
  std::vector<int32_t> window_begin(T), window_len(T), extra_begin(T), extra_len(T, 0), visible(T),
      candidates(T), key_begin(T);
  int64_t key_rows = 0;
  for (size_t s = 0; s < ctx.seqs.size(); ++s) {
    const V4Sequence& q = ctx.seqs[s];
    const int64_t comp = base[s] + (q.offset - ring_first[s]) + q.num_tokens;
    for (int64_t i = 0; i < q.num_tokens; ++i) {
      const int64_t p = q.offset + i, t = q.first_row + i;
      const int64_t first = std::max<int64_t>(q.replay_from, p - W + 1);
      window_begin[t] = static_cast<int32_t>(base[s] + (first - ring_first[s]));
      window_len[t] = static_cast<int32_t>(p - first + 1);
      extra_begin[t] = static_cast<int32_t>(comp);
      visible[t] = static_cast<int32_t>(compressed ? (p + 1) / ratio : 0);
      if (kind == V4AttentionKind::kCompressed) extra_len[t] = visible[t];
      // The indexer's row: the entries the query sees, or with full-forward ties every entry
      // the sequence has after this step (HF's forward over the prefix ending here).
      candidates[t] = static_cast<int32_t>(full_forward_ties_ ? entries[s] : visible[t]);
      key_begin[t] = static_cast<int32_t>(key_rows);
    }
    key_rows += entries[s];
  }
  auto window_begin_dev = Ints(window_begin), window_len_dev = Ints(window_len);
  auto extra_begin_dev = Ints(extra_begin), extra_len_dev = Ints(extra_len);
  const int64_t topk = c.index_topk;
  std::unique_ptr<DeviceBuffer> selected;
  if (sparse) {
    const int64_t IH = c.index_n_heads, ID = c.index_head_dim;
    auto ikeys = Floats(key_rows * ID);
    int64_t at = 0;
    for (size_t s = 0; s < ctx.seqs.size(); ++s) {
      if (entries[s] > 0) {
        ReadPaged(backend_, index_stream, Pi, *ctx.seqs[s].block_table, 0, entries[s] * ID,
                  ikeys->as<float>() + at * ID);
      }
      at += entries[s];
    }
    auto iq = Floats(T * IH * ID), iw = Floats(T * IH);
    backend_->Gemm(T, IH * ID, QL, qrn->as<float>(), QL, weights_->Matrix(A.index_q_b), QL,
                   iq->as<float>(), IH * ID, false);
    backend_->ApplyRope(T, IH, iq->as<float>() + ID - rd, IH * ID, ID, rd, ctx.positions,
                        compress_inv_freq_->as<float>(), c.CompressAttentionFactor(), true);
    backend_->Gemm(T, IH, H, h, H, weights_->Matrix(A.index_weights), H, iw->as<float>(), IH,
                   false);
    auto key_begin_dev = Ints(key_begin), candidates_dev = Ints(candidates);
    auto visible_dev = Ints(visible);
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
    a.keys = ikeys->as<float>();
    a.key_begin = key_begin_dev->as<int32_t>();
    a.candidates = candidates_dev->as<int32_t>();
    a.visible = visible_dev->as<int32_t>();
    a.selected = selected->as<int32_t>();
    a.max_candidates = *std::max_element(entries.begin(), entries.end());
    ops_->IndexerTopK(a);
  }

  auto o = Floats(T * NH * D);
  SinkAttentionArgs sa;
  sa.tokens = T;
  sa.heads = NH;
  sa.dim = D;
  sa.q = qn->as<float>();
  sa.kv = kp;
  sa.window_begin = window_begin_dev->as<int32_t>();
  sa.window_len = window_len_dev->as<int32_t>();
  sa.extra_begin = extra_begin_dev->as<int32_t>();
  sa.extra_len = extra_len_dev->as<int32_t>();
  if (sparse) {
    sa.selected = selected->as<int32_t>();
    sa.selected_stride = topk;
  }
  sa.sinks = A.sinks->as<float>();
  sa.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  sa.out = o->as<float>();
  ops_->SinkAttention(sa);

  // The window ring keeps the last W keys.
  for (const V4Sequence& q : ctx.seqs) {
    WriteRing(backend_, kvn->as<float>() + q.first_row * D, W, D, q.offset, q.offset + q.num_tokens,
              ctx.cache->SequenceState(l32, q.slot));
  }

  // K = V carried the keys' rotation into the output: rotate its rope slice back.
  backend_->ApplyRope(T, NH, o->as<float>() + D - rd, NH * D, D, rd, ctx.neg_positions, inv, factor,
                      true);
  // Grouped output projection: group g of heads through o_a's rows of group g, then o_b.
  const int64_t G = c.o_groups, OL = c.o_lora_rank, in = NH * D / G;
  auto og = Floats(T * G * OL);
  backend_->BatchedGemm(G, T, OL, in, o->as<float>(), NH * D, in, weights_->Matrix(A.o_a), in,
                        OL * in, og->as<float>(), G * OL, OL);
  backend_->Gemm(T, H, G * OL, og->as<float>(), G * OL, weights_->Matrix(A.o_b), G * OL, out, H,
                 false);
  return absl::OkStatus();
}

}  // namespace deepinfer
