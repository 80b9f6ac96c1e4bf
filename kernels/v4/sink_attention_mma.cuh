// SinkAttentionF32's tensor-core kernel (kTensorCoreExact, kTensorCoreBf16): dim 512, 64 heads
// per block. Included only by sink_attention.cu.
//
// One block of 8 warps per (token, 64 heads, split of the token's rows). Q [64 x 512] is
// converted once to bf16 (hi, and for the exact kernel lo = bf16(x - hi)) in shared memory. The
// token's rows go through in tiles of kRows (exact: 16, bf16: 32): each thread starts 16-byte
// cp.async copies of its pieces of the next tile's fp32 rows (gathered where they lie: window
// rows from this step's keys and the ring, then the entries from the paged stream) into a
// staging buffer while the block computes the current tile, and then
// converts its own pieces to bf16 (hi, lo) rows, so no thread waits for another's copies. Per
// tile, warp pair p (warps 2p, 2p + 1) owns heads 16p .. 16p + 15:
//   score  each warp of the pair computes S[16 heads x kRows] over its half of the 512 dims
//          (mma.sync m16n8k16, Q as the A operand, the key rows as B); the pair exchanges the
//          halves through shared memory and both add them in the same order (half 0 + half 1),
//          so both hold the same scores;
//   softmax both run the same online softmax (running max and sum per head, in log2 units);
//   value  each warp accumulates O[16 x 256] += P[16 x kRows] V[kRows x 256] for its half of
//          the output columns, P from the score registers (FlashAttention-2's register reuse),
//          V = the same key rows read transposed (ldmatrix.trans).
// The exact kernel takes every product as hi·hi + hi·lo + lo·hi (three MMAs); the bf16 kernel
// as hi·hi. The bf16 kernel reads q_bf16 as it is where given (the values LoadQuery would
// round), and with out_bf16 its epilogue rotates the output's rope slice back (rope_pair.cuh,
// ApplyRopeF32's arithmetic on the fp32 output values) and writes the values rounded to bf16:
// the token's cos / sin per rope pair are computed once per block while the first tile loads
// (a table in shared memory: one double-precision sincos per pair, not one per pair, head and
// output tile, whose inlined copies would bloat the kernel's code and serialise the epilogue),
// each warp writes its bf16 values into its own part of the query's shared rows (free after its
// last score MMA) and the warp pair then stores its 16 heads' rows as whole 16-byte pieces (512
// contiguous bytes per warp store).
#ifndef DEEPINFER_KERNELS_V4_SINK_ATTENTION_MMA_CUH_
#define DEEPINFER_KERNELS_V4_SINK_ATTENTION_MMA_CUH_

#include <cuda_bf16.h>
#include <math.h>

#include <cstdint>

#include "kernels/attention/mma_sm80.cuh"
#include "kernels/rope/rope_pair.cuh"
#include "kernels/v4/sink_attention.h"
#include "kernels/v4/sink_attention_rows.cuh"

namespace deepinfer {
namespace kernels {
namespace sink {

constexpr int kMmaDim = static_cast<int>(kSinkAttentionMmaDim);
constexpr int kMmaHeads = 64;  // heads per block: 4 warp pairs of 16
constexpr int kMmaThreads = 256;
constexpr int kMmaLd = kMmaDim + 8;  // bf16 row stride: ldmatrix's 8 rows in distinct banks
constexpr int kMmaHalf = kMmaDim / 2;
constexpr int kMmaOutTiles = kMmaHalf / 8;  // n-tiles of a warp's output columns
constexpr int kMmaScoreSteps = kMmaHalf / 16;
static_assert(kMmaThreads == 4 * kMmaHeads, "4 warp pairs of 16 heads");

template <bool kExact>
struct MmaShape {
  static constexpr int kRows = kExact ? 16 : 32;  // key rows per tile
  static constexpr int kScoreTiles = kRows / 8;   // n-tiles of S
  static constexpr int kValueSteps = kRows / 16;  // k-steps of P·V
  static constexpr int kParts = kExact ? 2 : 1;   // bf16 hi (and lo)
  static constexpr int kRowsPerPass = kMmaThreads / 16;
  static constexpr size_t kQBytes = size_t{kMmaHeads} * kMmaLd * sizeof(__nv_bfloat16);
  static constexpr size_t kKBytes = size_t{kRows} * kMmaLd * sizeof(__nv_bfloat16);
  static constexpr size_t kStageBytes = size_t{kRows} * kMmaDim * sizeof(float);
  static constexpr size_t kExchangeBytes = size_t{kMmaThreads} * kScoreTiles * sizeof(float4);
  // out_bf16's rope table: (cos, sin) per pair of the output's rope slice (at most dim / 2).
  static constexpr size_t kRopeBytes = size_t{kMmaDim / 2} * sizeof(float2);
  static constexpr size_t kSmemBytes =
      kParts * (kQBytes + kKBytes) + kStageBytes + kExchangeBytes + kRopeBytes + 16;
};
static_assert(MmaShape<true>::kSmemBytes <= 227 * 1024, "fits sm_90's opt-in shared memory");
static_assert(MmaShape<false>::kSmemBytes <= 227 * 1024, "fits sm_90's opt-in shared memory");

__device__ __forceinline__ uint32_t Bf16x2Bits(__nv_bfloat162 v) {
  return *reinterpret_cast<const uint32_t*>(&v);
}

// (a, b) rounded to bf16 (nearest even) as hi, and the remainders (a - hi, b - hi) rounded to
// bf16 as lo; a in the low halves.
__device__ __forceinline__ void SplitPair(float a, float b, uint32_t* hi, uint32_t* lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 hf = __bfloat1622float2(h);
  *hi = Bf16x2Bits(h);
  *lo = Bf16x2Bits(__floats2bfloat162_rn(a - hf.x, b - hf.y));
}

// Output columns (c, c + 1) of a head, y0 and y1 (normalised), as the bf16 kernels' out_bf16
// holds them: rotated back by the rope table's (cos, sin) where c lies in the rope slice (from
// rope_begin), then rounded to a bf16 pair (y0 in the low half).
__device__ __forceinline__ uint32_t OutputPairBf16(float y0, float y1, int c, int rope_begin,
                                                   const float2* rope) {
  if (c >= rope_begin) {
    const float2 cs = rope[(c - rope_begin) / 2];
    const float r0 = rope::RotatedFirst(y0, y1, cs.x, cs.y);
    const float r1 = rope::RotatedSecond(y0, y1, cs.x, cs.y);
    y0 = r0;
    y1 = r1;
  }
  return sm80::PackBf16(y0, y1);
}

// Writes 4 floats as bf16 hi (and lo) at dst_hi[0..3] (dst_lo).
template <bool kExact>
__device__ __forceinline__ void StoreFour(float4 v, __nv_bfloat16* dst_hi, __nv_bfloat16* dst_lo) {
  uint2 hi, lo;
  if (kExact) {
    SplitPair(v.x, v.y, &hi.x, &lo.x);
    SplitPair(v.z, v.w, &hi.y, &lo.y);
    *reinterpret_cast<uint2*>(dst_lo) = lo;
  } else {
    hi.x = Bf16x2Bits(__floats2bfloat162_rn(v.x, v.y));
    hi.y = Bf16x2Bits(__floats2bfloat162_rn(v.z, v.w));
  }
  *reinterpret_cast<uint2*>(dst_hi) = hi;
}

// Q of heads h0 .. h0 + 63 of token t from q_bf16 (zero past the last head) into qh,
// [64][kMmaLd]: the bf16 kernel's operand as given.
__device__ __forceinline__ void LoadQueryBf16(const SinkAttentionParams& p, int64_t t, int64_t h0,
                                              __nv_bfloat16* qh) {
  constexpr int kU4 = kMmaDim / 8;  // 16-byte pieces per head
  constexpr int kLoads = kMmaHeads * kU4 / kMmaThreads;
  constexpr int kBatch = 8;  // loads in flight per thread
  static_assert(kLoads % kBatch == 0, "whole batches");
#pragma unroll 1
  for (int b = 0; b < kLoads; b += kBatch) {
    uint4 v[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int e = threadIdx.x + (b + i) * kMmaThreads, hl = e / kU4, f = e % kU4;
      const int64_t h = h0 + hl;
      v[i] = h < p.heads
                 ? *reinterpret_cast<const uint4*>(p.q_bf16 + (t * p.heads + h) * kMmaDim + 8 * f)
                 : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int e = threadIdx.x + (b + i) * kMmaThreads, hl = e / kU4, f = e % kU4;
      *reinterpret_cast<uint4*>(qh + hl * kMmaLd + 8 * f) = v[i];
    }
  }
}

// Q of heads h0 .. h0 + 63 of token t (zero past the last head) into qh (and ql), [64][kMmaLd].
template <bool kExact>
__device__ __forceinline__ void LoadQuery(const SinkAttentionParams& p, int64_t t, int64_t h0,
                                          __nv_bfloat16* qh, __nv_bfloat16* ql) {
  constexpr int kF4 = kMmaDim / 4;  // float4s per head
  constexpr int kLoads = kMmaHeads * kF4 / kMmaThreads;
  constexpr int kBatch = 8;  // loads in flight per thread
  static_assert(kLoads % kBatch == 0, "whole batches");
#pragma unroll 1
  for (int b = 0; b < kLoads; b += kBatch) {
    float4 v[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int e = threadIdx.x + (b + i) * kMmaThreads, hl = e / kF4, f = e % kF4;
      const int64_t h = h0 + hl;
      v[i] = h < p.heads
                 ? *reinterpret_cast<const float4*>(p.q + (t * p.heads + h) * kMmaDim + 4 * f)
                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int e = threadIdx.x + (b + i) * kMmaThreads, hl = e / kF4, f = e % kF4;
      StoreFour<kExact>(v[i], qh + hl * kMmaLd + 4 * f, ql + hl * kMmaLd + 4 * f);
    }
  }
}

// This thread's pieces of a tile: rows threadIdx / 16 + 16 i, 16-byte pieces threadIdx % 16 +
// 16 c of each (a row is 128 pieces).
constexpr int kPiecesPerRow = kMmaDim / 4;
constexpr int kPieceSteps = kPiecesPerRow / 16;

// Starts copying the tile of rows row0 .. row0 + kRows - 1 (zeros at and past `end`) into stage
// [kRows][kMmaDim] and commits the copies as one group.
template <bool kExact>
__device__ __forceinline__ void IssueTile(const SinkAttentionParams& p, const TokenRows& rows,
                                          int32_t row0, int32_t end, float* stage) {
  using Shape = MmaShape<kExact>;
  const int r0 = threadIdx.x / 16, c0 = threadIdx.x % 16;
#pragma unroll
  for (int i = 0; i < Shape::kRows / Shape::kRowsPerPass; ++i) {
    const int r = r0 + i * Shape::kRowsPerPass;
    const bool valid = row0 + r < end;
    // Null: an entry spread over blocks, each piece through its block.
    const float* src = valid ? rows.RowStart(row0 + r) : p.kv;
#pragma unroll
    for (int c = 0; c < kPieceSteps; ++c) {
      const int piece = c0 + 16 * c;
      const float* from = src != nullptr ? src + 4 * piece : rows.At(row0 + r, 4 * piece);
      sm80::CopyAsync16(sm80::SharedAddr(stage + r * kMmaDim + 4 * piece), from, valid);
    }
  }
  sm80::CopyAsyncCommit();
}

// Converts this thread's pieces of the staged tile (its own copies: no barrier needed first) to
// the bf16 rows kh (and kl), [kRows][kMmaLd].
template <bool kExact>
__device__ __forceinline__ void ConvertTile(const float* stage, __nv_bfloat16* kh,
                                            __nv_bfloat16* kl) {
  using Shape = MmaShape<kExact>;
  const int r0 = threadIdx.x / 16, c0 = threadIdx.x % 16;
#pragma unroll
  for (int i = 0; i < Shape::kRows / Shape::kRowsPerPass; ++i) {
    const int r = r0 + i * Shape::kRowsPerPass;
#pragma unroll
    for (int c = 0; c < kPieceSteps; ++c) {
      const int piece = c0 + 16 * c;
      const float4 v = *reinterpret_cast<const float4*>(stage + r * kMmaDim + 4 * piece);
      StoreFour<kExact>(v, kh + r * kMmaLd + 4 * piece, kl + r * kMmaLd + 4 * piece);
    }
  }
}

// The partial scores S[16 heads x kRows] of warp pair `pair` over dims half * 256 .. + 255, in
// the m16n8 accumulator layout (s[n]: rows n * 8 ..). Independent accumulators per k-step parity
// (and for the cross terms) keep several MMA chains in flight.
template <bool kExact>
__device__ __forceinline__ void PartialScores(const __nv_bfloat16* qh, const __nv_bfloat16* ql,
                                              const __nv_bfloat16* kh, const __nv_bfloat16* kl,
                                              int pair, int half, int lane,
                                              float (&s)[MmaShape<kExact>::kScoreTiles][4]) {
  constexpr int kNt = MmaShape<kExact>::kScoreTiles;
  float acc[2][kNt][4] = {};
  float cross[2][kNt][4] = {};
  const int q_off = (pair * 16 + (lane & 15)) * kMmaLd + half * kMmaHalf + (lane >> 4) * 8;
  const int k_off =
      ((lane & 7) + (lane >> 4) * 8) * kMmaLd + half * kMmaHalf + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int ks = 0; ks < kMmaScoreSteps; ++ks) {
    const int par = ks & 1;
    uint32_t a[4], al[4];
    sm80::LdMatrixX4<false>(a, qh + q_off + ks * 16);
    if (kExact) sm80::LdMatrixX4<false>(al, ql + q_off + ks * 16);
#pragma unroll
    for (int np = 0; np < kNt / 2; ++np) {
      const int off = k_off + np * 16 * kMmaLd + ks * 16;
      uint32_t b[4];
      sm80::LdMatrixX4<false>(b, kh + off);
      sm80::MmaBf16(acc[par][2 * np], a, b[0], b[1]);
      sm80::MmaBf16(acc[par][2 * np + 1], a, b[2], b[3]);
      if (kExact) {
        uint32_t bl[4];
        sm80::LdMatrixX4<false>(bl, kl + off);
        sm80::MmaBf16(cross[par][2 * np], a, bl[0], bl[1]);
        sm80::MmaBf16(cross[par][2 * np + 1], a, bl[2], bl[3]);
        sm80::MmaBf16(cross[par][2 * np], al, b[0], b[1]);
        sm80::MmaBf16(cross[par][2 * np + 1], al, b[2], b[3]);
      }
    }
  }
#pragma unroll
  for (int n = 0; n < kNt; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s[n][i] = acc[0][n][i] + acc[1][n][i];
      if (kExact) s[n][i] += cross[0][n][i] + cross[1][n][i];
    }
  }
}

// Waits for the other warp of the pair (named barrier 1 + pair; 0 is __syncthreads').
__device__ __forceinline__ void PairBarrier(int pair) {
  asm volatile("bar.sync %0, 64;\n" ::"r"(pair + 1) : "memory");
}

// The (cos, sin) of each pair j < out_rope_dim / 2 of token t's output rope slice into rope[j]:
// rope_pair.cuh's RopeCosSin, as ApplyRopeF32 computes them. Complete after a __syncthreads.
__device__ __forceinline__ void RopeTable(const SinkAttentionParams& p, int64_t t, float2* rope) {
  const int pairs = static_cast<int>(p.out_rope_dim) / 2;
  if (pairs == 0) return;
  const float pos = static_cast<float>(p.out_rope_positions[t]);
#pragma unroll 1
  for (int j = threadIdx.x; j < pairs; j += kMmaThreads) {
    float cs, sn;
    rope::RopeCosSin(pos, p.out_rope_inv_freq[j], p.out_rope_factor, &cs, &sn);
    rope[j] = make_float2(cs, sn);
  }
}

// The epilogue with out_bf16 (called by every thread; one split): each value o * inv as the fp32
// output has it, a pair in the rope slice rotated with ApplyRopeF32's arithmetic (the pair is a
// thread's two columns: col is even) and rounded to bf16 as RoundF32ToBf16 rounds it, written to
// rows pair * 16 .. + 15, columns half * 256 .. + 255 of qh (the region only this warp's score
// MMAs read); then the warp pair stores its 16 heads' rows to out_bf16 in 16-byte pieces.
__device__ __forceinline__ void StoreOutBf16(const SinkAttentionParams& p, int64_t t, int64_t h0,
                                             const float (&o)[kMmaOutTiles][4], const float (&l)[2],
                                             const float2* rope, __nv_bfloat16* qh) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int pair = warp / 2, half = warp % 2, g = lane / 4, tq = lane % 4;
  const int rope_begin = kMmaDim - static_cast<int>(p.out_rope_dim);
  const int col = half * kMmaHalf + 2 * tq;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    uint32_t* dst = reinterpret_cast<uint32_t*>(qh + (pair * 16 + g + 8 * r) * kMmaLd + col);
#pragma unroll
    for (int nt = 0; nt < kMmaOutTiles; ++nt) {
      dst[nt * 4] = OutputPairBf16(o[nt][2 * r] * inv, o[nt][2 * r + 1] * inv, col + nt * 8,
                                   rope_begin, rope);
    }
  }
  PairBarrier(pair);
  // The pair's 16 rows (each row 1 KiB from out_bf16's previous one) as 16-byte pieces where
  // out_bf16 is 16-byte aligned, else (4-byte aligned) as 4-byte words; the pair's 64 threads
  // take consecutive pieces (words), so a warp's store covers 512 (128) contiguous bytes.
  const int i0 = half * 32 + lane;
  const uint16_t* src = reinterpret_cast<const uint16_t*>(qh) + pair * 16 * kMmaLd;
  uint16_t* dst = p.out_bf16 + (t * p.heads + h0 + pair * 16) * kMmaDim;
  const int64_t left = p.heads - (h0 + pair * 16);  // heads of the pair's 16 that exist
  const int rows = left < 16 ? static_cast<int>(left) : 16;
  if (reinterpret_cast<uintptr_t>(p.out_bf16) % 16 == 0) {
    constexpr int kRowPieces = kMmaDim / 8;
#pragma unroll 4
    for (int i = i0; i < rows * kRowPieces; i += 64) {
      const int row = i / kRowPieces, e = 8 * (i % kRowPieces);
      *reinterpret_cast<uint4*>(dst + row * kMmaDim + e) =
          *reinterpret_cast<const uint4*>(src + row * kMmaLd + e);
    }
  } else {
    constexpr int kRowWords = kMmaDim / 2;
#pragma unroll 4
    for (int i = i0; i < rows * kRowWords; i += 64) {
      const int row = i / kRowWords, e = 2 * (i % kRowWords);
      *reinterpret_cast<uint32_t*>(dst + row * kMmaDim + e) =
          *reinterpret_cast<const uint32_t*>(src + row * kMmaLd + e);
    }
  }
}

// The online softmax's start (StartState) of this thread's accumulator rows r: head g (r = 0) or
// g + 8 (r = 1) of its warp pair's 16, g = lane / 4.
__device__ __forceinline__ void StartHeads(const SinkAttentionParams& p, int64_t h0, int split,
                                           float (&m)[2], float (&l)[2]) {
  const int pair = threadIdx.x / 64, g = (threadIdx.x % 32) / 4;
  StartState(p, h0 + pair * 16 + g, split, &m[0], &l[0]);
  StartState(p, h0 + pair * 16 + g + 8, split, &m[1], &l[1]);
}

// The fp32 epilogue (called by every thread): with one split out[t, h] = o / l, else the split's
// unnormalised o and its (m, l) to the workspace.
__device__ __forceinline__ void StoreOutF32(const SinkAttentionParams& p, int64_t t, int64_t h0,
                                            int32_t num_splits, int split, const float (&m)[2],
                                            const float (&l)[2],
                                            const float (&o)[kMmaOutTiles][4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int pair = warp / 2, half = warp % 2, g = lane / 4, tq = lane % 4;
  const int64_t head[2] = {h0 + pair * 16 + g, h0 + pair * 16 + g + 8};
  // Columns half * 256 + nt * 8 + 2 tq, + 1 of heads g, g + 8.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (head[r] >= p.heads) continue;
    const int64_t th = t * p.heads + head[r];
    const int col = half * kMmaHalf + 2 * tq;
    if (num_splits == 1) {
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
      float* dst = p.out + th * kMmaDim + col;
#pragma unroll
      for (int nt = 0; nt < kMmaOutTiles; ++nt) {
        *reinterpret_cast<float2*>(dst + nt * 8) =
            make_float2(o[nt][2 * r] * inv, o[nt][2 * r + 1] * inv);
      }
    } else {
      float* dst = PartialOut(p, num_splits, th, split) + col;
#pragma unroll
      for (int nt = 0; nt < kMmaOutTiles; ++nt) {
        *reinterpret_cast<float2*>(dst + nt * 8) = make_float2(o[nt][2 * r], o[nt][2 * r + 1]);
      }
      if (half == 0 && tq == 0) {
        *reinterpret_cast<float2*>(PartialState(p, num_splits, th, split)) =
            make_float2(m[r], l[r]);
      }
    }
  }
}

// One tile of key rows row0 .. row0 + kRows - 1 (rows at and past `end` masked) in kh (and kl)
// folded into this thread's running max m, sum l (log2 units) and output accumulators o: the
// scores of its warp pair's 16 heads (halves exchanged through `exchange`), the online softmax,
// P·V (see the top of this file). Every warp of the block calls it once per tile; the caller's
// block barrier between two calls keeps a warp's exchange slots from being overwritten before
// its pair partner has read them.
template <bool kExact>
__device__ __forceinline__ void TileStep(const __nv_bfloat16* qh, const __nv_bfloat16* ql,
                                         const __nv_bfloat16* kh, const __nv_bfloat16* kl,
                                         float4* exchange, int32_t row0, int32_t end, float scale2,
                                         float (&m)[2], float (&l)[2],
                                         float (&o)[kMmaOutTiles][4]) {
  constexpr int kNt = MmaShape<kExact>::kScoreTiles, kKs = MmaShape<kExact>::kValueSteps;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int pair = warp / 2, half = warp % 2, tq = lane % 4;
  float s[kNt][4];
  PartialScores<kExact>(qh, ql, kh, kl, pair, half, lane, s);
#pragma unroll
  for (int n = 0; n < kNt; ++n) {
    exchange[(warp * kNt + n) * 32 + lane] = make_float4(s[n][0], s[n][1], s[n][2], s[n][3]);
  }
  PairBarrier(pair);
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < kNt; ++n) {
    const float4 other = exchange[((warp ^ 1) * kNt + n) * 32 + lane];
    const float ov[4] = {other.x, other.y, other.z, other.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float full = half == 0 ? s[n][i] + ov[i] : ov[i] + s[n][i];
      const bool valid = row0 + n * 8 + 2 * tq + (i & 1) < end;
      s[n][i] = valid ? full * scale2 : -INFINITY;
      tile_max[i / 2] = fmaxf(tile_max[i / 2], s[n][i]);
    }
  }
  float alpha[2], base[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
    alpha[r] = Rescale(tile_max[r], &m[r], &base[r]);
  }
#pragma unroll
  for (int n = 0; n < kNt; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s[n][i] = exp2f(s[n][i] - base[i / 2]);
      sum[i / 2] += s[n][i];
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
    l[r] = l[r] * alpha[r] + sum[r];
  }
#pragma unroll
  for (int nt = 0; nt < kMmaOutTiles; ++nt) {
    o[nt][0] *= alpha[0];
    o[nt][1] *= alpha[0];
    o[nt][2] *= alpha[1];
    o[nt][3] *= alpha[1];
  }

  // P as the A fragments of P·V: k-step kk covers score n-tiles 2 kk and 2 kk + 1.
  uint32_t pa[kKs][4], pl[kKs][4];
#pragma unroll
  for (int kk = 0; kk < kKs; ++kk) {
    if (kExact) {
      SplitPair(s[2 * kk][0], s[2 * kk][1], &pa[kk][0], &pl[kk][0]);
      SplitPair(s[2 * kk][2], s[2 * kk][3], &pa[kk][1], &pl[kk][1]);
      SplitPair(s[2 * kk + 1][0], s[2 * kk + 1][1], &pa[kk][2], &pl[kk][2]);
      SplitPair(s[2 * kk + 1][2], s[2 * kk + 1][3], &pa[kk][3], &pl[kk][3]);
    } else {
      pa[kk][0] = sm80::PackBf16(s[2 * kk][0], s[2 * kk][1]);
      pa[kk][1] = sm80::PackBf16(s[2 * kk][2], s[2 * kk][3]);
      pa[kk][2] = sm80::PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[kk][3] = sm80::PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
  }
  const int v_off =
      ((lane & 7) + ((lane >> 3) & 1) * 8) * kMmaLd + half * kMmaHalf + (lane >> 4) * 8;
#pragma unroll
  for (int kk = 0; kk < kKs; ++kk) {
#pragma unroll
    for (int np = 0; np < kMmaOutTiles / 2; ++np) {
      const int off = v_off + kk * 16 * kMmaLd + np * 16;
      uint32_t b[4];
      sm80::LdMatrixX4<true>(b, kh + off);
      sm80::MmaBf16(o[2 * np], pa[kk], b[0], b[1]);
      sm80::MmaBf16(o[2 * np + 1], pa[kk], b[2], b[3]);
      if (kExact) {
        uint32_t bl[4];
        sm80::LdMatrixX4<true>(bl, kl + off);
        sm80::MmaBf16(o[2 * np], pa[kk], bl[0], bl[1]);
        sm80::MmaBf16(o[2 * np + 1], pa[kk], bl[2], bl[3]);
        sm80::MmaBf16(o[2 * np], pl[kk], b[0], b[1]);
        sm80::MmaBf16(o[2 * np + 1], pl[kk], b[2], b[3]);
      }
    }
  }
}

template <bool kExact>
__device__ void MmaBody(SinkAttentionParams p, int32_t num_splits) {
  using Shape = MmaShape<kExact>;
  constexpr int kRows = Shape::kRows, kNt = Shape::kScoreTiles;
  extern __shared__ __align__(16) unsigned char sink_smem[];
  __nv_bfloat16* qh = reinterpret_cast<__nv_bfloat16*>(sink_smem);
  __nv_bfloat16* ql = qh + (kExact ? kMmaHeads * kMmaLd : 0);
  __nv_bfloat16* kh = qh + Shape::kParts * kMmaHeads * kMmaLd;
  __nv_bfloat16* kl = kh + (kExact ? kRows * kMmaLd : 0);
  float* stage = reinterpret_cast<float*>(kh + Shape::kParts * kRows * kMmaLd);
  float4* exchange = reinterpret_cast<float4*>(stage + kRows * kMmaDim);
  float2* rope = reinterpret_cast<float2*>(exchange + kMmaThreads * kNt);
  int32_t* scratch = reinterpret_cast<int32_t*>(rope + kMmaDim / 2);

  const int64_t t = blockIdx.x, h0 = static_cast<int64_t>(blockIdx.y) * kMmaHeads;
  const int split = blockIdx.z;
  const TokenRows rows = LoadTokenRows(p, t, scratch);
  int32_t begin, end;
  SplitRows<kRows>(rows.count, split, num_splits, &begin, &end);
  if (begin < end) IssueTile<kExact>(p, rows, begin, end, stage);
  if (!kExact && p.q_bf16 != nullptr) {
    LoadQueryBf16(p, t, h0, qh);
  } else {
    LoadQuery<kExact>(p, t, h0, qh, ql);
  }
  // The rope table's latency passes while the first tile arrives (the tile loop's first
  // barrier completes it).
  const bool out_bf16 = !kExact && p.out_bf16 != nullptr;  // one split (SinkAttentionF32 checks)
  if (out_bf16) RopeTable(p, t, rope);

  float m[2], l[2];
  StartHeads(p, h0, split, m, l);
  float o[kMmaOutTiles][4] = {};
  const float scale2 = p.scale * kLog2e;

#pragma unroll 1
  for (int32_t row0 = begin; row0 < end; row0 += kRows) {
    sm80::CopyAsyncWait<0>();
    __syncthreads();  // every warp is done with the previous tile's bf16 rows (and Q is stored)
    ConvertTile<kExact>(stage, kh, kl);
    if (row0 + kRows < end) IssueTile<kExact>(p, rows, row0 + kRows, end, stage);
    __syncthreads();  // the tile's bf16 rows are complete

    TileStep<kExact>(qh, ql, kh, kl, exchange, row0, end, scale2, m, l, o);
  }

  if (out_bf16) {
    if (begin >= end) __syncthreads();  // no tile: the rope table and Q's stores are complete
    StoreOutBf16(p, t, h0, o, l, rope, qh);
    return;
  }
  StoreOutF32(p, t, h0, num_splits, split, m, l, o);
}

}  // namespace sink
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_V4_SINK_ATTENTION_MMA_CUH_
