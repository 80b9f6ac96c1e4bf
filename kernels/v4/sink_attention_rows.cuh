// What both SinkAttentionF32 kernels share: a token's key rows in attention order (its window,
// then its compressed entries or the indexer's selection of them), the rows of one split, the
// online-softmax state's start and the partial results a split leaves for the combine. Included
// only by sink_attention.cu, which compiles every kernel of SinkAttentionF32 in one translation
// unit.
#ifndef DEEPINFER_KERNELS_V4_SINK_ATTENTION_ROWS_CUH_
#define DEEPINFER_KERNELS_V4_SINK_ATTENTION_ROWS_CUH_

#include <math.h>

#include <cstdint>

#include "kernels/v4/sink_attention.h"

namespace deepinfer {
namespace kernels {
namespace sink {

// Scores are kept in log2 units (scale * log2(e) folded into the score scale, sinks multiplied
// by it), so every exponential is one exp2f.
constexpr float kLog2e = 1.4426950408889634f;

// Element e of the paged stream of block-table row `seq` (V4PagedRows).
__device__ __forceinline__ const float* PagedElement(const V4PagedRows& s, int64_t seq, int64_t e) {
  const int32_t* table = s.block_tables + seq * s.table_stride;
  return s.data + int64_t{table[e / s.block_floats]} * s.block_floats + e % s.block_floats;
}

// Token t's rows: j < window_len is its window's position pos - window_len + 1 + j (this step's
// kv row t - (pos - p) from step_start on, its ring slot's row p % ring_rows before), then entry
// j - window_len of its compressed entries (row i = j - window_len or selected[j - window_len]
// of its paged stream).
struct TokenRows {
  int64_t pos = 0, step_start = 0, dim = 0;
  const float* own = nullptr;   // kv row t: position pos
  const float* ring = nullptr;  // the token's ring slot
  int64_t ring_rows = 1;
  V4PagedRows entries;
  int64_t seq = 0;  // the token's block-table row
  // Whether an entry's dim floats lie in one block (block_floats a multiple of dim).
  bool entries_whole = true;
  int32_t window_len = 0;
  int32_t count = 0;                  // window_len + the number of compressed entries
  const int32_t* selected = nullptr;  // the token's row of the selection, or null

  // Row j's first element where its dim floats are contiguous (every window row; an entry in one
  // block), else null: read it element by element through At.
  __device__ __forceinline__ const float* RowStart(int32_t j) const {
    if (j < window_len) {
      const int64_t p = pos - window_len + 1 + j;
      return p >= step_start ? own - (pos - p) * dim : ring + (p % ring_rows) * dim;
    }
    if (!entries_whole) return nullptr;
    j -= window_len;
    const int64_t i = selected != nullptr ? selected[j] : j;
    return PagedElement(entries, seq, i * dim);
  }
  // Element d of row j (a group of 4 from a multiple of 4 stays in one block when block_floats
  // is a multiple of 4).
  __device__ __forceinline__ const float* At(int32_t j, int64_t d) const {
    if (j < window_len) return RowStart(j) + d;
    j -= window_len;
    const int64_t i = selected != nullptr ? selected[j] : j;
    return PagedElement(entries, seq, i * dim + d);
  }
};

// Token t's rows. Every thread of the block calls it (a block-wide count of the selection's
// entries through *scratch, with two barriers).
__device__ __forceinline__ TokenRows LoadTokenRows(const SinkAttentionParams& p, int64_t t,
                                                   int32_t* scratch) {
  TokenRows r;
  r.pos = p.positions[t];
  r.step_start = p.step_start[t];
  r.dim = p.dim;
  r.own = p.kv + t * p.dim;
  r.ring = p.ring != nullptr ? p.ring + int64_t{p.ring_slot[t]} * p.ring_stride : nullptr;
  r.ring_rows = p.ring_rows > 0 ? p.ring_rows : 1;
  r.window_len = max(p.window_len[t], 0);
  int32_t extra = 0;
  if (p.entries.data != nullptr) {
    r.entries = p.entries;
    r.seq = p.entries.token_seq[t];
    r.entries_whole = p.entries.block_floats % p.dim == 0;
    if (p.selected != nullptr) {
      // The selection ends at its first negative entry: the smallest such index.
      const int32_t* sel = p.selected + t * p.selected_stride;
      const int32_t stride = static_cast<int32_t>(p.selected_stride);
      if (threadIdx.x == 0) *scratch = stride;
      __syncthreads();
      for (int32_t i = threadIdx.x; i < stride; i += blockDim.x) {
        if (sel[i] < 0) {
          atomicMin(scratch, i);
          break;
        }
      }
      __syncthreads();
      extra = *scratch;
      r.selected = sel;
    } else if (p.extra_len != nullptr) {
      extra = max(p.extra_len[t], 0);
    }
  }
  r.count = r.window_len + extra;
  return r;
}

// Rows [*begin, *end) of split `split` of `count` rows: the splits take whole tiles of kTile rows,
// as evenly as the tiles allow (trailing splits of a short list may be empty).
template <int kTile>
__device__ __forceinline__ void SplitRows(int32_t count, int split, int num_splits, int32_t* begin,
                                          int32_t* end) {
  const int32_t tiles = (count + kTile - 1) / kTile;
  const int32_t first = static_cast<int32_t>(static_cast<int64_t>(tiles) * split / num_splits);
  const int32_t last = static_cast<int32_t>(static_cast<int64_t>(tiles) * (split + 1) / num_splits);
  *begin = first * kTile;
  *end = min(last * kTile, count);
}

// The online softmax's start for head h: split 0 (or the only split) starts from the sink
// (max = sink, sum = exp(0) = 1), the others from nothing (max -inf, sum 0). Heads past the
// last start from nothing and are never written.
__device__ __forceinline__ void StartState(const SinkAttentionParams& p, int64_t h, int split,
                                           float* m, float* l) {
  if (split == 0 && h < p.heads) {
    *m = p.sinks[h] * kLog2e;
    *l = 1.0f;
  } else {
    *m = -INFINITY;
    *l = 0.0f;
  }
}

// Folds a tile's maximum (log2 units) into the running max m and sum l: returns the factor that
// rescales what was accumulated so far and sets *base to what the tile's exponents subtract.
// A max of -inf (nothing seen yet) subtracts 0, so no exp2(-inf - -inf) arises.
__device__ __forceinline__ float Rescale(float tile_max, float* m, float* base) {
  const float m_new = fmaxf(*m, tile_max);
  *base = m_new == -INFINITY ? 0.0f : m_new;
  const float alpha = exp2f(*m - *base);
  *m = m_new;
  return alpha;
}

// Workspace layout with S splits: partial outputs [tokens * heads][S][dim] (unnormalised, relative
// to the split's max), then (max, sum) pairs [tokens * heads][S][2].
__device__ __forceinline__ float* PartialOut(const SinkAttentionParams& p, int num_splits,
                                             int64_t th, int split) {
  return static_cast<float*>(p.workspace) + (th * num_splits + split) * p.dim;
}
__device__ __forceinline__ float* PartialState(const SinkAttentionParams& p, int num_splits,
                                               int64_t th, int split) {
  return static_cast<float*>(p.workspace) + p.tokens * p.heads * num_splits * p.dim +
         (th * num_splits + split) * 2;
}

}  // namespace sink
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_V4_SINK_ATTENTION_ROWS_CUH_
