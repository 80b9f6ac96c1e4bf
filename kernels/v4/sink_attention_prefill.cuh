// SinkAttentionF32's kTensorCoreBf16Prefill kernel: dim 512, 64 heads per block, one split, the
// bf16 operands of kTensorCoreBf16 (Q, K = V and P rounded to bf16, fp32 sums) in another
// division of the work. Included only by sink_attention.cu.
//
// Blocks of 8 warps per group of 64 heads (one per SM by default, SinkAttentionParams::
// prefill_blocks), each taking tokens blockIdx.x, blockIdx.x + gridDim.x, ... in turn. A token's
// Q [64 x 512] sits in shared memory in bf16; its rows go through in tiles of 64 key rows, double
// buffered (the tile after the current one is copied while the block computes; during a token's
// last tile, the next token's first tile and Q). Per tile:
//   score   warp w computes S[16 heads x 32 rows] over all 512 dims (heads 16 (w % 4) .., rows
//           32 (w / 4) .. of the tile; mma.sync m16n8k16, Q as A, the key rows as B), so no
//           partial sums cross warps; each warp writes its heads' maximum over its 32 rows;
//   barrier the two warps of a head group take the larger maximum: both hold the same running
//           max, the same P = 2^(S - max) (written to shared memory in bf16, [64 heads x 64
//           rows]), the same rescale factor and row sums (written too);
//   barrier each warp accumulates O[64 heads x 64 columns (64 w ..)] += P V over the 64 rows:
//           a V fragment (ldmatrix.trans of the key rows) feeds four MMAs (the 4 head tiles) and
//           a P fragment eight, where a warp owning 16 heads x 256 columns feeds two per V
//           fragment and exchanges fp32 partial scores every 32 rows.
// Three block barriers per 64 rows (tile complete, maxima, P). Per 64 rows a warp issues 96
// ldmatrix for 128 score MMAs and 32 for 128 value MMAs (kTensorCoreBf16: 96 and 64 for the
// same, and 4 KiB of fp32 partial scores through shared memory). Shared memory: Q 65 KiB, two
// key tiles 130 KiB, P 9 KiB, the token's selection (up to kPrefillMaxSelected entries) 8 KiB,
// the rope table 2 KiB: 216 KiB, one block per SM; 128 accumulator registers a thread.
//
// Rows: a row with a bf16 copy of its buffer (kv_bf16, ring_bf16, entries_bf16) is copied with
// cp.async straight into the tile; the entries' copy, when it holds each table row's stream
// contiguously (SinkEntriesBf16::seq_stride, SinkAttentionEntriesToBf16's layout), is addressed
// without reading the block tables; the token's selection is read into shared memory once, so
// no row address waits on a global load in the tile loop. A row without a copy is read in fp32
// by plain loads and rounded to bf16 by the thread that reads it (a slower path: its loads'
// latency is not hidden).
#ifndef DEEPINFER_KERNELS_V4_SINK_ATTENTION_PREFILL_CUH_
#define DEEPINFER_KERNELS_V4_SINK_ATTENTION_PREFILL_CUH_

#include <cuda_bf16.h>
#include <math.h>

#include <cstdint>

#include "kernels/attention/mma_sm80.cuh"
#include "kernels/v4/sink_attention.h"
#include "kernels/v4/sink_attention_mma.cuh"
#include "kernels/v4/sink_attention_rows.cuh"

namespace deepinfer {
namespace kernels {
namespace sink {

// Window row j's buffer (kv or the ring: *base) and its bf16 copy (*base16, null where the
// params give none): element e of the buffer is element e of the copy.
__device__ __forceinline__ void WindowBuffers(const SinkAttentionParams& p, const TokenRows& rows,
                                              int32_t j, const float** base,
                                              const uint16_t** base16) {
  const int64_t pos = rows.pos - rows.window_len + 1 + j;
  if (pos >= rows.step_start) {
    *base = p.kv;
    *base16 = p.kv_bf16;
  } else {
    *base = p.ring;
    *base16 = p.ring_bf16;
  }
}

// Element e of the token's entry stream in entries_bf16 (SinkEntriesBf16's layout).
__device__ __forceinline__ const uint16_t* EntryBf16(const SinkAttentionParams& p,
                                                     const TokenRows& rows, int64_t e) {
  const SinkEntriesBf16& c = p.entries_bf16;
  const int32_t* tables = c.block_tables != nullptr ? c.block_tables : p.entries.block_tables;
  const int64_t stride = c.block_tables != nullptr ? c.table_stride : p.entries.table_stride;
  const int64_t bf = p.entries.block_floats;
  return c.data + int64_t{tables[rows.seq * stride + e / bf]} * bf + e % bf;
}

struct PrefillShape {
  static constexpr int kRows = 64;            // key rows per tile
  static constexpr int kPLd = kRows + 8;      // bf16 stride of P's rows (ldmatrix conflict-free)
  static constexpr int kColsPerWarp = kMmaDim / 8;  // output columns a warp accumulates
  static constexpr int kOutTiles = kColsPerWarp / 8;
  static constexpr size_t kQBytes = size_t{kMmaHeads} * kMmaLd * sizeof(__nv_bfloat16);
  static constexpr size_t kKBytes = size_t{kRows} * kMmaLd * sizeof(__nv_bfloat16);
  static constexpr size_t kPBytes = size_t{kMmaHeads} * kPLd * sizeof(__nv_bfloat16);
  // Per head: the two row halves' maxima and sums, the rescale factor, the final sum.
  static constexpr size_t kStatBytes = size_t{6} * kMmaHeads * sizeof(float);
  static constexpr size_t kSelectedBytes = size_t{kPrefillMaxSelected} * sizeof(int32_t);
  static constexpr size_t kRopeBytes = size_t{kMmaDim / 2} * sizeof(float2);
  static constexpr size_t kSmemBytes = kQBytes + 2 * kKBytes + kPBytes + kStatBytes +
                                       kSelectedBytes + kRopeBytes + sizeof(TokenRows) + 16;
};
static_assert(PrefillShape::kSmemBytes <= 227 * 1024, "fits sm_90's opt-in shared memory");
static_assert(kMmaThreads == 256 && kMmaHeads == 64, "8 warps: 4 head groups x 2 row halves");

// Token t's scalars LoadPrefillRows reads, loaded on their own so that their latency can pass
// while the block computes (the token's selection is read later).
struct RowScalars {
  int32_t pos = 0, step_start = 0, window_len = 0, slot = 0, seq = 0, extra = 0;
};
__device__ __forceinline__ RowScalars LoadRowScalars(const SinkAttentionParams& p, int64_t t) {
  RowScalars s;
  s.pos = p.positions[t];
  s.step_start = p.step_start[t];
  s.window_len = p.window_len[t];
  if (p.ring != nullptr) s.slot = p.ring_slot[t];
  if (p.entries.data != nullptr) {
    s.seq = p.entries.token_seq[t];
    if (p.selected == nullptr && p.extra_len != nullptr) s.extra = p.extra_len[t];
  }
  return s;
}

// Token t's rows (LoadTokenRows) from its scalars, with its selection, up to its first negative
// entry, copied to sel_s (the result's `selected` then points there). Every thread calls it (two
// barriers with a selection).
__device__ __forceinline__ TokenRows LoadPrefillRows(const SinkAttentionParams& p, int64_t t,
                                                     const RowScalars& sc, int32_t* sel_s,
                                                     int32_t* scratch) {
  TokenRows r;
  r.pos = sc.pos;
  r.step_start = sc.step_start;
  r.dim = p.dim;
  r.own = p.kv + t * p.dim;
  r.ring = p.ring != nullptr ? p.ring + int64_t{sc.slot} * p.ring_stride : nullptr;
  r.ring_rows = p.ring_rows > 0 ? p.ring_rows : 1;
  r.window_len = max(sc.window_len, 0);
  int32_t extra = 0;
  if (p.entries.data != nullptr) {
    r.entries = p.entries;
    r.seq = sc.seq;
    r.entries_whole = p.entries.block_floats % p.dim == 0;
    if (p.selected != nullptr) {
      const int32_t* sel = p.selected + t * p.selected_stride;
      const int32_t stride = static_cast<int32_t>(p.selected_stride);
      if (threadIdx.x == 0) *scratch = stride;
      __syncthreads();
      for (int32_t i = threadIdx.x; i < stride; i += blockDim.x) {
        const int32_t v = sel[i];
        sel_s[i] = v;
        if (v < 0) atomicMin(scratch, i);
      }
      __syncthreads();
      extra = *scratch;
      r.selected = sel_s;
    } else {
      extra = max(sc.extra, 0);
    }
  }
  r.count = r.window_len + extra;
  return r;
}

// Starts copying Q of heads h0 .. h0 + 63 of token t from q_bf16 (zeros past the last head)
// into qh [64][kMmaLd] and commits the copies as one group.
__device__ __forceinline__ void IssueQueryBf16(const SinkAttentionParams& p, int64_t t,
                                               int64_t h0, __nv_bfloat16* qh) {
  constexpr int kU4 = kMmaDim / 8;  // 16-byte pieces per head
#pragma unroll 4
  for (int e = threadIdx.x; e < kMmaHeads * kU4; e += kMmaThreads) {
    const int hl = e / kU4, f = e % kU4;
    const bool valid = h0 + hl < p.heads;
    const uint16_t* src = p.q_bf16 + ((t * p.heads + (valid ? h0 + hl : 0)) * kMmaDim + 8 * f);
    sm80::CopyAsync16(sm80::SharedAddr(qh + hl * kMmaLd + 8 * f), src, valid);
  }
  sm80::CopyAsyncCommit();
}

// 8 fp32 values from src (two 4-float groups, each within one block of the entries) rounded to
// bf16 into dst.
__device__ __forceinline__ void StoreEightBf16(const float* lo, const float* hi,
                                               __nv_bfloat16* dst) {
  const float4 a = *reinterpret_cast<const float4*>(lo);
  const float4 b = *reinterpret_cast<const float4*>(hi);
  uint4 v;
  v.x = sm80::PackBf16(a.x, a.y);
  v.y = sm80::PackBf16(a.z, a.w);
  v.z = sm80::PackBf16(b.x, b.y);
  v.w = sm80::PackBf16(b.z, b.w);
  *reinterpret_cast<uint4*>(dst) = v;
}

// Starts copying the tile of rows row0 .. row0 + 63 (zeros at and past `end`) into kb
// [kRows][kMmaLd] and commits the copies as one group. Thread i takes row i / 4 (one row's
// address worked out per thread) and its 16-byte pieces (8 values) i % 4 + 4 c; a warp's copy
// instruction covers 64 contiguous bytes of each of 8 rows. A row without a bf16 copy is read and
// rounded here (plain stores, complete at the caller's next block barrier).
__device__ __forceinline__ void IssuePrefillTile(const SinkAttentionParams& p,
                                                 const TokenRows& rows, int32_t row0, int32_t end,
                                                 __nv_bfloat16* kb) {
  constexpr int kThreadsPerRow = kMmaThreads / PrefillShape::kRows;
  constexpr int kPieces = kMmaDim / 8 / kThreadsPerRow;  // this thread's pieces of its row
  static_assert(kThreadsPerRow == 4, "a row per 4 threads");
  const int r = threadIdx.x / kThreadsPerRow, c0 = threadIdx.x % kThreadsPerRow;
  const int32_t j = row0 + r;
  __nv_bfloat16* dst = kb + r * kMmaLd;
  if (j >= end) {
#pragma unroll
    for (int c = 0; c < kPieces; ++c) {
      sm80::CopyAsync16(sm80::SharedAddr(dst + 8 * (c0 + kThreadsPerRow * c)), p.kv, false);
    }
    sm80::CopyAsyncCommit();
    return;
  }
  // The row's bf16 start (null: none, or an entry spread over blocks of a tabled copy, read
  // piece by piece when `piecewise`).
  const uint16_t* row16 = nullptr;
  bool piecewise = false;
  int64_t e0 = 0;  // an entry's first element in its stream
  if (j < rows.window_len) {
    const float* base;
    const uint16_t* base16;
    WindowBuffers(p, rows, j, &base, &base16);
    if (base16 != nullptr) row16 = base16 + (rows.RowStart(j) - base);
  } else {
    const int32_t i = j - rows.window_len;
    e0 = int64_t{rows.selected != nullptr ? rows.selected[i] : i} * rows.dim;
    const SinkEntriesBf16& c16 = p.entries_bf16;
    if (c16.data != nullptr) {
      if (c16.seq_stride > 0) {
        row16 = c16.data + rows.seq * c16.seq_stride + e0;
      } else if (rows.entries_whole) {
        row16 = EntryBf16(p, rows, e0);
      } else {
        piecewise = true;
      }
    }
  }
  if (row16 != nullptr) {
#pragma unroll
    for (int c = 0; c < kPieces; ++c) {
      const int piece = c0 + kThreadsPerRow * c;
      sm80::CopyAsync16(sm80::SharedAddr(dst + 8 * piece), row16 + 8 * piece, true);
    }
  } else if (piecewise) {
#pragma unroll 4
    for (int c = 0; c < kPieces; ++c) {
      const int piece = c0 + kThreadsPerRow * c;
      sm80::CopyAsync16(sm80::SharedAddr(dst + 8 * piece), EntryBf16(p, rows, e0 + 8 * piece),
                        true);
    }
  } else {
    const float* src = rows.RowStart(j);  // null: an entry spread over blocks
#pragma unroll 4
    for (int c = 0; c < kPieces; ++c) {
      const int d = 8 * (c0 + kThreadsPerRow * c);
      if (src != nullptr) {
        StoreEightBf16(src + d, src + d + 4, dst + d);
      } else {
        StoreEightBf16(rows.At(j, d), rows.At(j, d + 4), dst + d);
      }
    }
  }
  sm80::CopyAsyncCommit();
}

// The scores S[16 heads x 32 rows] of head group hg over key rows 32 rh .. 32 rh + 31 of the
// tile kb, all 512 dims, in the m16n8 accumulator layout (s[n]: rows 8 n ..). Independent
// accumulators per k-step parity keep more MMA chains in flight.
__device__ __forceinline__ void PrefillScores(const __nv_bfloat16* qh, const __nv_bfloat16* kb,
                                              int hg, int rh, int lane, float (&s)[4][4]) {
  float acc[2][4][4] = {};
  const int q_off = (hg * 16 + (lane & 15)) * kMmaLd + (lane >> 4) * 8;
  const int k_off = (rh * 32 + (lane & 7) + (lane >> 4) * 8) * kMmaLd + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int ks = 0; ks < kMmaDim / 16; ++ks) {
    const int par = ks & 1;
    uint32_t a[4];
    sm80::LdMatrixX4<false>(a, qh + q_off + ks * 16);
#pragma unroll
    for (int np = 0; np < 2; ++np) {
      uint32_t b[4];
      sm80::LdMatrixX4<false>(b, kb + k_off + np * 16 * kMmaLd + ks * 16);
      sm80::MmaBf16(acc[par][2 * np], a, b[0], b[1]);
      sm80::MmaBf16(acc[par][2 * np + 1], a, b[2], b[3]);
    }
  }
#pragma unroll
  for (int n = 0; n < 4; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) s[n][i] = acc[0][n][i] + acc[1][n][i];
  }
}

// O[64 heads x 64 columns (64 warp ..)] += P[64 x 64] V[64 rows x those columns] (P from
// shared memory, V the tile's rows read transposed).
__device__ __forceinline__ void PrefillValues(const __nv_bfloat16* ps, const __nv_bfloat16* kb,
                                              int warp, int lane,
                                              float (&o)[4][PrefillShape::kOutTiles][4]) {
  constexpr int kPLd = PrefillShape::kPLd;
  const int p_off = (lane & 15) * kPLd + (lane >> 4) * 8;
  const int v_off = ((lane & 7) + ((lane >> 3) & 1) * 8) * kMmaLd +
                    warp * PrefillShape::kColsPerWarp + (lane >> 4) * 8;
#pragma unroll
  for (int kk = 0; kk < PrefillShape::kRows / 16; ++kk) {
    uint32_t pa[4][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      sm80::LdMatrixX4<false>(pa[mt], ps + p_off + mt * 16 * kPLd + kk * 16);
    }
#pragma unroll
    for (int np = 0; np < PrefillShape::kOutTiles / 2; ++np) {
      uint32_t b[4];
      sm80::LdMatrixX4<true>(b, kb + v_off + kk * 16 * kMmaLd + np * 16);
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        sm80::MmaBf16(o[mt][2 * np], pa[mt], b[0], b[1]);
        sm80::MmaBf16(o[mt][2 * np + 1], pa[mt], b[2], b[3]);
      }
    }
  }
}

// The epilogue (every thread; the caller's block barrier makes l_s, rope and stage ready):
// out[t, h] = o / l for this warp's columns, l_s[h] the final sums. With out_bf16 each value as
// the fp32 output has it, a pair in the rope slice rotated (rope_pair.cuh, as StoreOutBf16) and
// rounded to bf16 into stage [64][kMmaLd], then the block stores the existing heads' rows in
// 16-byte pieces (4-byte words where out_bf16 is only 4-byte aligned).
__device__ __forceinline__ void StorePrefillOut(const SinkAttentionParams& p, int64_t t,
                                                int64_t h0, const float (&o)[4][8][4],
                                                const float* l_s, const float2* rope,
                                                __nv_bfloat16* stage) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int col = warp * PrefillShape::kColsPerWarp + 2 * tq;
  const int rope_begin = kMmaDim - static_cast<int>(p.out_rope_dim);
  const bool bf16 = p.out_bf16 != nullptr;
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int hl = mt * 16 + g + 8 * r;
      const float l = l_s[hl];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      if (bf16) {
        uint32_t* dst = reinterpret_cast<uint32_t*>(stage + hl * kMmaLd + col);
#pragma unroll
        for (int nt = 0; nt < PrefillShape::kOutTiles; ++nt) {
          dst[nt * 4] = OutputPairBf16(o[mt][nt][2 * r] * inv, o[mt][nt][2 * r + 1] * inv,
                                       col + nt * 8, rope_begin, rope);
        }
      } else if (h0 + hl < p.heads) {
        float* dst = p.out + (t * p.heads + h0 + hl) * kMmaDim + col;
#pragma unroll
        for (int nt = 0; nt < PrefillShape::kOutTiles; ++nt) {
          *reinterpret_cast<float2*>(dst + nt * 8) =
              make_float2(o[mt][nt][2 * r] * inv, o[mt][nt][2 * r + 1] * inv);
        }
      }
    }
  }
  if (!bf16) return;
  __syncthreads();
  const int64_t left = p.heads - h0;
  const int heads = left < kMmaHeads ? static_cast<int>(left) : kMmaHeads;
  const uint16_t* src = reinterpret_cast<const uint16_t*>(stage);
  uint16_t* dst = p.out_bf16 + (t * p.heads + h0) * kMmaDim;
  if (reinterpret_cast<uintptr_t>(p.out_bf16) % 16 == 0) {
    constexpr int kRowPieces = kMmaDim / 8;
#pragma unroll 4
    for (int i = threadIdx.x; i < heads * kRowPieces; i += kMmaThreads) {
      const int row = i / kRowPieces, e = 8 * (i % kRowPieces);
      *reinterpret_cast<uint4*>(dst + row * kMmaDim + e) =
          *reinterpret_cast<const uint4*>(src + row * kMmaLd + e);
    }
  } else {
    constexpr int kRowWords = kMmaDim / 2;
#pragma unroll 4
    for (int i = threadIdx.x; i < heads * kRowWords; i += kMmaThreads) {
      const int row = i / kRowWords, e = 2 * (i % kRowWords);
      *reinterpret_cast<uint32_t*>(dst + row * kMmaDim + e) =
          *reinterpret_cast<const uint32_t*>(src + row * kMmaLd + e);
    }
  }
}

// Token t's rows into rows_s, for the block after its next barrier (every thread calls it; two
// barriers with a selection, copied into sel_s). The rows stay in shared memory, not in every
// thread's registers through the tile loop.
__device__ __forceinline__ void StartRows(const SinkAttentionParams& p, int64_t t,
                                          const RowScalars& sc, TokenRows* rows_s, int32_t* sel_s,
                                          int32_t* scratch) {
  const TokenRows rows = LoadPrefillRows(p, t, sc, sel_s, scratch);
  if (threadIdx.x == 0) *rows_s = rows;
}

// Tokens blockIdx.x, blockIdx.x + gridDim.x, ... one after another: the next token's scalars
// (loaded before the last tile's scores), rows (after them), first tile and Q (from q_bf16) are
// loaded while the block computes the current token's last tile and writes its output (staged in
// the key buffer of its last tile); a Q from q (plain loads) after that output. A token's rope
// table is computed during its first tile (its epilogue reads it).
__device__ void PrefillBody(SinkAttentionParams p, int32_t /*num_splits: one*/) {
  using Shape = PrefillShape;
  constexpr int kRows = Shape::kRows, kPLd = Shape::kPLd;
  constexpr int kTile = kRows * kMmaLd;
  extern __shared__ __align__(16) unsigned char sink_smem[];
  __nv_bfloat16* qh = reinterpret_cast<__nv_bfloat16*>(sink_smem);
  __nv_bfloat16* kbuf = qh + kMmaHeads * kMmaLd;  // two tiles
  __nv_bfloat16* ps = kbuf + 2 * kTile;
  float* max_s = reinterpret_cast<float*>(ps + kMmaHeads * kPLd);  // [2 halves][64 heads]
  float* sum_s = max_s + 2 * kMmaHeads;                            // [2 halves][64 heads]
  float* alpha_s = sum_s + 2 * kMmaHeads;                          // [64 heads]
  float* l_s = alpha_s + kMmaHeads;                                // [64 heads]
  int32_t* sel_s = reinterpret_cast<int32_t*>(l_s + kMmaHeads);
  float2* rope = reinterpret_cast<float2*>(sel_s + kPrefillMaxSelected);
  TokenRows* rows_s = reinterpret_cast<TokenRows*>(rope + kMmaDim / 2);
  int32_t* scratch = reinterpret_cast<int32_t*>(rows_s + 1);

  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * kMmaHeads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tq = lane % 4, g = lane / 4;
  const int hg = warp % 4, rh = warp / 4;
  // The score role's heads: hl[r] = 16 hg + g + 8 r (both row halves keep the same m, l).
  const int hl[2] = {hg * 16 + g, hg * 16 + g + 8};
  const float scale2 = p.scale * kLog2e;

  int64_t t = blockIdx.x;
  int buf = 0;  // the key buffer of the next tile to compute
  // Q's copies first (they depend on nothing the rows' lookups return); the tile loop's first
  // wait takes them with the first tile's.
  if (p.q_bf16 != nullptr) IssueQueryBf16(p, t, h0, qh);
  {
    const TokenRows rows = LoadPrefillRows(p, t, LoadRowScalars(p, t), sel_s, scratch);
    if (threadIdx.x == 0) *rows_s = rows;
    if (rows.count > 0) IssuePrefillTile(p, rows, 0, rows.count, kbuf);
  }
  if (p.q_bf16 == nullptr) LoadQuery<false>(p, t, h0, qh, qh);
  __syncthreads();  // rows_s
#pragma unroll 1
  for (;;) {
    const int64_t next_t = t + gridDim.x;
    const bool has_next = next_t < p.tokens;
    const int32_t end = rows_s->count;
    float m[2], l[2];
    StartState(p, h0 + hl[0], 0, &m[0], &l[0]);
    StartState(p, h0 + hl[1], 0, &m[1], &l[1]);
    float o[4][Shape::kOutTiles][4] = {};

#pragma unroll 1
    for (int32_t row0 = 0; row0 < end; row0 += kRows) {
      const __nv_bfloat16* kb = kbuf + buf * kTile;
      sm80::CopyAsyncWait<0>();
      // The tile is complete (and Q); every warp is done with the other buffer, P and the
      // previous tile's maxima and sums.
      __syncthreads();
      buf ^= 1;
      const bool last = row0 + kRows >= end;
      RowScalars next_sc;  // loaded here, used after the scores
      if (!last) {
        IssuePrefillTile(p, *rows_s, row0 + kRows, end, kbuf + buf * kTile);
      } else if (has_next) {
        next_sc = LoadRowScalars(p, next_t);
      }

      float s[4][4];
      PrefillScores(qh, kb, hg, rh, lane, s);
      // Every tile of this token is issued: sel_s and rows_s are free.
      if (last && has_next) StartRows(p, next_t, next_sc, rows_s, sel_s, scratch);
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < 4; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const bool valid = row0 + rh * 32 + n * 8 + 2 * tq + (i & 1) < end;
          s[n][i] = valid ? s[n][i] * scale2 : -INFINITY;
          tile_max[i / 2] = fmaxf(tile_max[i / 2], s[n][i]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
        if (tq == 0) max_s[rh * kMmaHeads + hl[r]] = tile_max[r];
      }
      __syncthreads();  // both halves' maxima, the next token's rows; every warp done with Q
      // The token's rope table (read by its epilogue only), a warp's sincos here rather than
      // between two tokens.
      if (row0 == 0 && p.out_bf16 != nullptr) RopeTable(p, t, rope);
      if (last && has_next) {
        if (rows_s->count > 0) {
          IssuePrefillTile(p, *rows_s, 0, rows_s->count, kbuf + buf * kTile);
        }
        if (p.q_bf16 != nullptr) IssueQueryBf16(p, next_t, h0, qh);
      }

      float alpha[2], base[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        tile_max[r] = fmaxf(tile_max[r], max_s[(rh ^ 1) * kMmaHeads + hl[r]]);
        alpha[r] = Rescale(tile_max[r], &m[r], &base[r]);
      }
#pragma unroll
      for (int n = 0; n < 4; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[n][i] = exp2f(s[n][i] - base[i / 2]);
          sum[i / 2] += s[n][i];
        }
        // P[head][row]: this thread's pairs of rows 32 rh + 8 n + 2 tq, + 1.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          *reinterpret_cast<uint32_t*>(ps + hl[r] * kPLd + rh * 32 + n * 8 + 2 * tq) =
              sm80::PackBf16(s[n][2 * r], s[n][2 * r + 1]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
        if (tq == 0) {
          sum_s[rh * kMmaHeads + hl[r]] = sum[r];
          if (rh == 0) alpha_s[hl[r]] = alpha[r];
        }
      }
      __syncthreads();  // P, the sums and the rescale factors

#pragma unroll
      for (int r = 0; r < 2; ++r) {
        l[r] = l[r] * alpha[r] + sum_s[hl[r]] + sum_s[kMmaHeads + hl[r]];
      }
      // Rescale O unless no head's maximum moved (a factor of 1 changes no bit): a warp-wide
      // test, after the first tiles mostly true.
      float a[4][2];
      bool moved = false;
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        a[mt][0] = alpha_s[mt * 16 + g];
        a[mt][1] = alpha_s[mt * 16 + g + 8];
        moved = moved || a[mt][0] != 1.0f || a[mt][1] != 1.0f;
      }
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
          for (int nt = 0; nt < Shape::kOutTiles; ++nt) {
            o[mt][nt][0] *= a[mt][0];
            o[mt][nt][1] *= a[mt][0];
            o[mt][nt][2] *= a[mt][1];
            o[mt][nt][3] *= a[mt][1];
          }
        }
      }
      PrefillValues(ps, kb, warp, lane, o);
    }

    if (rh == 0 && tq == 0) {
      l_s[hl[0]] = l[0];
      l_s[hl[1]] = l[1];
    }
    // The buffer of this token's last tile (with no tile, the one the next token's first tile
    // does not use) stages its bf16 output.
    __nv_bfloat16* stage = kbuf + (buf ^ 1) * kTile;
    if (end == 0) {
      // No tile: nothing of the next token is started yet, and this token's Q copies (into the
      // region the next token's go to) and first-token loads may be in flight.
      if (p.out_bf16 != nullptr) RopeTable(p, t, rope);
      sm80::CopyAsyncWait<0>();
      __syncthreads();
      if (has_next) {
        StartRows(p, next_t, LoadRowScalars(p, next_t), rows_s, sel_s, scratch);
        __syncthreads();  // rows_s
        if (rows_s->count > 0) {
          IssuePrefillTile(p, *rows_s, 0, rows_s->count, kbuf + buf * kTile);
        }
        if (p.q_bf16 != nullptr) IssueQueryBf16(p, next_t, h0, qh);
      }
    }
    __syncthreads();  // the sums, the rope table; every warp done with the staging buffer
    StorePrefillOut(p, t, h0, o, l_s, rope, stage);  // its reads of rope precede a barrier
    if (!has_next) return;
    t = next_t;
    // Complete at the next tile's barrier (or the epilogue's, with no tile).
    if (p.q_bf16 == nullptr) LoadQuery<false>(p, t, h0, qh, qh);
  }
}

}  // namespace sink
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_V4_SINK_ATTENTION_PREFILL_CUH_
