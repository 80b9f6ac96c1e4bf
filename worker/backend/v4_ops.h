// V4Ops: the operations of DeepSeek-V4 that the Backend interface has no op for: the
// hyper-connection residual streams (mix, Sinkhorn projection, collapse, expand), the
// compressor's gated pooling of a window, attention with per-head sinks over the keys in the
// cache (a window ring, this step's keys, paged compressed entries), the lightning indexer's
// scores and top-k over paged keys, the V4 routers (sqrtsoftplus / sigmoid scores, optional
// hash-table expert choice), the clamped SwiGLU and the row copies that move rows between a
// step's buffers and the cache. A backend that runs V4
// returns them from Backend::v4_ops(); conventions as backend.h (device pointers, fp32
// row-major activations, int32 indices).
#ifndef DEEPINFER_WORKER_BACKEND_V4_OPS_H_
#define DEEPINFER_WORKER_BACKEND_V4_OPS_H_

#include <cstdint>

namespace deepinfer {

// The mixing weights of one hyper-connection site for `rows` tokens of hc streams, from
// mixes = RmsNorm_unweighted(flatten(streams)) · fnᵀ ([rows, (2 + hc) * hc]):
//   pre  = sigmoid(mixes[:hc] * scale[0] + base[:hc]) + eps
//   post = 2 * sigmoid(mixes[hc:2hc] * scale[1] + base[hc:2hc])
//   comb = Sinkhorn(softmax_rows(mixes[2hc:] * scale[2] + base[2hc:]) + eps), an hc x hc matrix
//          (row-major [j][k]) normalised over columns, then sinkhorn_iters - 1 times over rows and
//          columns, each sum + eps
//   collapsed = sum_j pre[j] * streams[j]
struct HcMixArgs {
  int64_t rows = 0, hc = 0, hidden = 0;
  const float* mixes = nullptr;  // [rows, (2 + hc) * hc]
  const float* base = nullptr;   // [(2 + hc) * hc]
  const float* scale = nullptr;  // [3]
  int32_t sinkhorn_iters = 1;
  float eps = 0.0f;
  const float* streams = nullptr;  // [rows, hc, hidden]
  float* post = nullptr;           // [rows, hc]
  float* comb = nullptr;           // [rows, hc, hc]
  float* collapsed = nullptr;      // [rows, hidden]
  // V4Ops::HcMixFromStreams only, which computes mixes itself (mixes is not read):
  //   mixes = RmsNorm_unweighted(flatten(streams), norm_eps) · fnᵀ.
  const float* fn = nullptr;  // [(2 + hc) * hc, hc * hidden]
  float norm_eps = 0.0f;
  // HcMixFromStreams only, optional: also normed = RmsNorm(collapsed, out_norm_weight,
  // out_norm_eps) (the next op's norm), bit for bit Backend::RmsNorm on collapsed, and/or
  // normed_bf16, the same values rounded to bf16 (bits, as Backend::AddRmsNorm's out_bf16: a Gemm
  // operand); collapsed may then be null (not written).
  const float* out_norm_weight = nullptr;  // [hidden]
  float out_norm_eps = 0.0f;
  float* normed = nullptr;          // [rows, hidden]
  uint16_t* normed_bf16 = nullptr;  // [rows, hidden]
};

// The final collapse of the streams before the last norm:
//   out = sum_j (sigmoid(mixes[j] * scale[0] + base[j]) + eps) * streams[j], mixes [rows, hc].
struct HcHeadArgs {
  int64_t rows = 0, hc = 0, hidden = 0;
  const float* mixes = nullptr;
  const float* base = nullptr;   // [hc]
  const float* scale = nullptr;  // [1]
  float eps = 0.0f;
  const float* streams = nullptr;
  float* out = nullptr;  // [rows, hidden]
};

// A block's output placed back into the streams:
//   streams_out[k] = post[k] * block_out + sum_j comb[j][k] * streams_in[j].
struct HcExpandArgs {
  int64_t rows = 0, hc = 0, hidden = 0;
  const float* block_out = nullptr;   // [rows, hidden]
  const float* post = nullptr;        // [rows, hc]
  const float* comb = nullptr;        // [rows, hc, hc]
  const float* streams_in = nullptr;  // [rows, hc, hidden]
  float* streams_out = nullptr;       // [rows, hc, hidden], may not alias streams_in
};

// One compressed entry per window from the projected rows of its source tokens:
//   out[w, d] = sum_s softmax_s(g[w, s, d]) * v[w, s, d].
// Without overlap (HCA): s < ratio, v = kv[w, s, :dim], g = gate[w, s, :dim] + bias[s, :dim].
// With overlap (CSA, rows of width 2 * dim): slots s < ratio read the previous window's rows
// (kv[w, s, :dim], gate + bias[s, :dim]; weight 0 where has_prev[w] is 0), slots ratio + s the
// window's own (kv[w, ratio + s, dim:], gate + bias[s, dim:]).
struct CompressWindowsArgs {
  int64_t windows = 0, ratio = 0, dim = 0;
  bool overlap = false;
  // [windows, (overlap ? 2 : 1) * ratio] rows of width floats, row r at kv + r * row_stride.
  const float* kv = nullptr;
  const float* gate = nullptr;        // the same layout
  int64_t row_stride = 0;             // 0: width
  const float* bias = nullptr;        // [ratio, width] (position_bias)
  const int32_t* has_prev = nullptr;  // [windows] (overlap only)
  float* out = nullptr;               // [windows, dim]
};

// A stream of `dim`-float rows per sequence in a V4 cache layer (worker/kv_cache/kv_cache_spec.h:
// the compressed entries, or the CSA indexer's keys), paged by elements: element e of the stream
// of block-table row r is
//   data[block_tables[r * table_stride + e / block_floats] * block_floats + e % block_floats],
// so row i of the stream is its elements [i * dim, (i + 1) * dim): inside one block when
// block_floats is a multiple of dim (V4-Flash's CSA entries at block size 16: 4 per block), or
// spread over the blocks of its window when it is not (V4-Flash's HCA entries at block size 16:
// 512 floats over 8 blocks of 64). Query t reads the stream of block-table row token_seq[t].
struct V4PagedRows {
  const float* data = nullptr;  // the layer's stream: its blocks, block_floats floats each
  int64_t block_floats = 0;
  const int32_t* block_tables = nullptr;  // [sequences, table_stride]
  int64_t table_stride = 0;
  const int32_t* token_seq = nullptr;  // [tokens]
};

// Attention of one shared K = V head with per-head sinks, reading the keys where the cache keeps
// them. Query t of head h attends over, in this order:
//  * its window, positions positions[t] - window_len[t] + 1 .. positions[t] ascending: position
//    p >= step_start[t] (a token of this step: a sequence's new tokens are consecutive rows at
//    consecutive positions) is row t - (positions[t] - p) of kv, an earlier one row
//    p % ring_rows of its sequence's window ring, ring + ring_slot[t] * ring_stride;
//  * its compressed entries (entries.data null: none): rows i < extra_len[t] of its stream, or,
//    with `selected` set, the rows i in selected[t * selected_stride ..] up to the first -1
//    (ascending, IndexerTopK's output; extra_len is then not read):
//   p = softmax([scale * q[t, h] · k for k in those rows] ++ [sinks[h]]),
//   out[t, h] = sum_k p_k k (the sink's probability is dropped).
struct SinkAttentionArgs {
  int64_t tokens = 0, heads = 0, dim = 0;
  const float* q = nullptr;             // [tokens, heads, dim]
  const float* kv = nullptr;            // [tokens, dim]: this step's keys
  const int32_t* positions = nullptr;   // [tokens]
  const int32_t* window_len = nullptr;  // [tokens] (0: no window rows)
  const int32_t* step_start = nullptr;  // [tokens]: the first position of t's sequence here
  const float* ring = nullptr;          // slots of ring_stride floats
  int64_t ring_rows = 0, ring_stride = 0;
  const int32_t* ring_slot = nullptr;  // [tokens]
  V4PagedRows entries;                 // dim-float rows
  // Host: the rows of entries.block_tables the tokens use (every token_seq below it; 0: not
  // given), for an implementation's per-step copy of the blocks they name.
  int64_t entry_table_rows = 0;
  const int32_t* extra_len = nullptr;  // [tokens]
  const int32_t* selected = nullptr;   // [tokens, selected_stride] or null
  int64_t selected_stride = 0;
  const float* sinks = nullptr;  // [heads]
  float scale = 1.0f;
  float* out = nullptr;  // [tokens, heads, dim]
  // The bf16 forms, only where V4Ops::TakesBf16Attention says the backend takes them:
  //  * q_bf16: q as bf16 bits (q is then not read);
  //  * out_bf16: out[t, h]'s trailing out_rope_dim values rotated as Backend::ApplyRope rotates
  //    them (interleaved pairs, angle out_rope_positions[t] * out_rope_inv_freq[j], cos / sin
  //    times out_rope_factor), then every value rounded to bf16 (nearest even; bits) into
  //    out_bf16 (out is then not written): what ApplyRope on out and the rounding of a bf16 Gemm
  //    operand give, bit for bit.
  const uint16_t* q_bf16 = nullptr;  // [tokens, heads, dim]
  uint16_t* out_bf16 = nullptr;      // [tokens, heads, dim]
  int64_t out_rope_dim = 0;
  const int32_t* out_rope_positions = nullptr;  // [tokens]
  const float* out_rope_inv_freq = nullptr;     // [out_rope_dim / 2]
  float out_rope_factor = 1.0f;
};

// Lightning indexer. Query t's candidates are rows i < candidates[t] of its stream of keys, of
// which the first visible[t] count; the others score -inf. A visible candidate scores
// sum_h weights[t, h] * weight_scale * relu(q[t, h] · key) * key_scale. The min(topk,
// candidates[t]) best are chosen as torch.topk (sorted, largest) chooses them on the CPU:
// (score, i) pairs in candidate order through std::nth_element at k - 1 and std::sort of the
// first k - 1 (std::partial_sort of the first k when k * 64 <= candidates), ties where those
// algorithms leave them. selected[t, :] holds the chosen visible i ascending, then -1.
struct IndexerTopKArgs {
  int64_t tokens = 0, heads = 0, dim = 0, topk = 0;
  const float* q = nullptr;        // [tokens, heads, dim]
  const float* weights = nullptr;  // [tokens, heads]
  float weight_scale = 1.0f, key_scale = 1.0f;
  V4PagedRows keys;                     // dim-float rows
  const int32_t* candidates = nullptr;  // [tokens]
  const int32_t* visible = nullptr;     // [tokens]
  // An upper bound of every candidates[t], known on the host (a device implementation may size
  // its workspace by it; a recorded step's bound holds for every replay).
  int64_t max_candidates = 0;
  int32_t* selected = nullptr;  // [tokens, topk]
};

// Rows of `width` floats copied between device buffers: for r < rows, the floats
// src[src_offsets[r] .. + width) go to dst[dst_offsets[r] .. + width) (offsets in floats, int64: a
// layer's cache may hold more than 2^31; a null offsets array means r * width). A row whose dst
// offset is negative is skipped. The destinations do not overlap each other or the sources.
// The V4 model's cache moves: window and compressor rings, window slots, paged entries.
struct CopyRowsArgs {
  int64_t rows = 0, width = 0;
  const float* src = nullptr;
  const int64_t* src_offsets = nullptr;  // [rows] or null
  float* dst = nullptr;
  const int64_t* dst_offsets = nullptr;  // [rows] or null
};

// V4 routing: scores = f(logits) (sqrtsoftplus: sqrt(softplus(x)); else sigmoid); the experts
// are the top_k of scores + bias (bias null: of scores), or with a hash table the row
// hash_table[token_ids[t]] ([vocab, top_k]); weights = their scores / (sum + 1e-20) * scaling.
// Output pairs sorted by expert id within a token (a repeated expert stays twice).
struct V4RouteArgs {
  int64_t rows = 0, experts = 0, top_k = 0;
  const float* logits = nullptr;        // [rows, experts]
  const float* bias = nullptr;          // [experts] or null
  const int32_t* hash_table = nullptr;  // [vocab, top_k] or null
  const int32_t* token_ids = nullptr;   // [rows], read with hash_table
  bool sqrtsoftplus = true;
  float scaling = 1.0f;
  int32_t* topk_ids = nullptr;    // [rows, top_k]
  float* topk_weights = nullptr;  // [rows, top_k]
};

// Arguments of V4Ops::RouteFromHidden: route with its logits computed from hidden rows and the
// fp32 router weight (route.logits is not read).
struct V4RouteFromHiddenArgs {
  V4RouteArgs route;
  const float* hidden = nullptr;         // [route.rows, hidden_size]
  int64_t hidden_size = 0;
  const float* router_weight = nullptr;  // [route.experts, hidden_size], fp32
};

// Arguments of V4Ops::NormRope: rows r = t * heads + h of dim values at x + r * dim, normed with
// weight and eps into out + r * dim (may be x), each row's last rope_dim values then rotated as
// Backend::ApplyRope rotates them (interleaved pairs, angle positions[t] * inv_freq[j], cos / sin
// times attention_factor).
struct NormRopeArgs {
  int64_t tokens = 0, heads = 0, dim = 0, rope_dim = 0;
  const float* x = nullptr;
  const float* weight = nullptr;  // [dim]
  float eps = 0.0f;
  float* out = nullptr;
  const int32_t* positions = nullptr;  // [tokens]
  const float* inv_freq = nullptr;     // [rope_dim / 2]
  float attention_factor = 1.0f;
  // Set (only where V4Ops::TakesBf16Attention says so, with out null): the values rounded to
  // bf16 (nearest even; bits) go here instead of out, [tokens * heads, dim], not overlapping x
  // (x_bf16: either that or x_bf16 itself, in place).
  uint16_t* out_bf16 = nullptr;
  // Set (only with out_bf16): the rows are these bf16 values (bits, widened to fp32 exactly),
  // [tokens * heads, dim], and x is not read.
  const uint16_t* x_bf16 = nullptr;
};

class V4Ops {
 public:
  virtual ~V4Ops() = default;
  virtual void HcMix(const HcMixArgs& args) = 0;
  // HcMix with the norm and the mixing GEMM before it (args.fn, args.norm_eps) in the op, where
  // the backend has a kernel for them that takes these shapes; false (nothing done) otherwise,
  // and the caller runs RmsNorm, Gemm and HcMix. The results match those three ops within
  // rounding (the norm's scale applies to the dot products instead of the elements). With
  // args.normed, the op also runs the next op's RmsNorm on the collapsed rows (the caller
  // otherwise runs Backend::RmsNorm after HcMix).
  virtual bool HcMixFromStreams(const HcMixArgs& args) { return false; }
  // Backend::RmsNorm(tokens * heads, dim, x, dim, weight, eps, out, dim), then
  // Backend::ApplyRope(tokens, heads, out + dim - rope_dim, heads * dim, dim, rope_dim, positions,
  // inv_freq, attention_factor, true), as one op where the backend has a kernel that takes these
  // shapes (bit for bit the two ops); false (nothing done) otherwise, and the caller runs the two.
  virtual bool NormRope(const NormRopeArgs& args) { return false; }
  // NormRope(first), then NormRope(second) (fp32 outputs, the same rope_dim, positions,
  // inv_freq and attention_factor; second's rows neither overlap first's output nor first's
  // rows second's output), as one op where the backend has a kernel that takes both (bit for bit
  // the two); false (nothing done) otherwise, and the caller runs them.
  virtual bool NormRopePair(const NormRopeArgs& first, const NormRopeArgs& second) { return false; }
  // Whether, for `tokens` queries of `heads` x `dim`, SinkAttention takes q_bf16 and out_bf16
  // and NormRope takes out_bf16 (rows up to 2048 wide, an even rope_dim): the query a bf16
  // attention reads and the output a bf16 Gemm reads passed in bf16, each rounded once where it
  // is made (bit for bit the fp32 path's values). False (the default): fp32 q and out.
  virtual bool TakesBf16Attention(int64_t tokens, int64_t heads, int64_t dim) { return false; }
  virtual void HcHead(const HcHeadArgs& args) = 0;
  virtual void HcExpand(const HcExpandArgs& args) = 0;
  virtual void CompressWindows(const CompressWindowsArgs& args) = 0;
  virtual void SinkAttention(const SinkAttentionArgs& args) = 0;
  virtual void IndexerTopK(const IndexerTopKArgs& args) = 0;
  virtual void Route(const V4RouteArgs& args) = 0;
  // Backend::Gemm of the hidden rows with the router weight (the logits), then Route, as one op
  // where the backend has a kernel for these shapes (the logits summed in its own order); false
  // (nothing done) otherwise, and the caller runs the two.
  virtual bool RouteFromHidden(const V4RouteFromHiddenArgs& args) { return false; }
  virtual void CopyRows(const CopyRowsArgs& args) = 0;
  // out[r, i] = silu(min(x[r, i], limit)) * clamp(x[r, inter + i], -limit, limit); x is
  // [rows, 2 * inter] (gate then up), limit <= 0: no clamp.
  virtual void SwiGluClamped(int64_t rows, int64_t inter, const float* x, float limit,
                             float* out) = 0;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_V4_OPS_H_
