// The tile loop shared by the GEMMs that stream weights into registers, make them bf16 A fragments
// and multiply on bf16 tensor cores (mma.sync m16n8k16, sm_80+): FP8 e4m3 with 128 x 128 block
// scales (fp8_mma_gemm.cu) and MXFP4 e2m1 with one UE8M0 scale per 32 values along k
// (mxfp4_mma_gemm.cu), both widened in registers, and bf16 used as it is (bf16_mma_gemm.cu). The
// formats differ only in how a thread loads its weights of a 128-wide k block, which k its two
// 16-value chunks of that block cover (each two halves of 8 contiguous k), how a chunk's bytes
// become A fragments, and whether the block's MMA sum is multiplied by a scale afterwards (FP8) or
// the scale is applied while widening (MXFP4). Include only from .cu files.
//
// Warp tile: MT (1 or 2) x 16 weight rows (output features) x 8 * NT activation rows, over a
// range of the 128-wide k blocks; with MT = 2 each activation fragment feeds two MMAs.
// mma.m16n8k16: A = 16 features x 16 k, B = 16 k x 8 activation rows, C fp32.
// k order: a sum over k does not care in which order its terms come, so each thread of a quad
// takes 16 k values of its rows per chunk (two halves of 8 contiguous k, kHalfStride apart: the
// chunk contiguous where that is 8), and the fragment registers are filled so that thread t's
// MMA-logical k {2t, 2t+1 | 2t+8, 2t+9} of sub-step s are the chunk's values 4s + {0, 2 | 1, 3}
// (values 0-7 the first half, 8-15 the second) for A and B alike.
//
// Block: 8 warps = fb feature tiles x ks k-slices (fb * ks = 8, ks chosen per launch so the grid
// has about two blocks per SM); the k-slices' partial sums meet in shared memory in warp order
// (deterministic). The activation fragments come from global memory per warp (WarpTile) or, built
// once per block, from shared memory (WarpTileSharedB, WarpTileAllRows); the weights one block
// ahead in registers. All of these give every output the same MMAs in the same order: the same
// sums bit for bit at the same k split. The grouped kernels on this loop and their launches:
// mma_grouped_kernel.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/common/kernel_facts.h"

namespace deepinfer {
namespace kernels {
namespace mma_tile {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kTile = 16;               // weight rows per warp tile (the MMA's M)
constexpr int64_t kKBlock = 128;        // k per loop step: two chunks of 16 per thread
constexpr int64_t kTargetBlocks = 264;  // two per SM of the H200 (132 SMs)

__device__ __forceinline__ void MmaBf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// bf16x2 a * m (m a bf16x2 power of two), exact while the product is a bf16 value: fma with -0
// keeps the sign of a zero product. bf16 arithmetic keeps subnormal inputs and results (PTX has no
// .ftz for it).
__device__ __forceinline__ uint32_t TimesPow2(uint32_t a, uint32_t m) {
  uint32_t d = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(m), "r"(0x80008000u));
#endif
  return d;
}

__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);  // nearest even, lo in the low half
  return *reinterpret_cast<const uint32_t*>(&h);
}

// The e4m3 bytes b0..b3 of w (b0 the lowest) as the bf16 pairs (b0, b2) and (b1, b3), low half
// first. e4m3's 7 magnitude bits moved to a bf16's bits 10..4 make its exponent field the e4m3
// one (bias 7 read as bias 127) and its top mantissa bits the e4m3 ones: the value times 2^-120
// (e4m3 subnormals become bf16 subnormals with the same mantissa), which 2^120 restores (exact:
// every such product is a normal bf16 number).
__device__ __forceinline__ void WidenFp8x4(uint32_t w, uint32_t* even, uint32_t* odd) {
  constexpr uint32_t kTwoTo120 = 0x7B807B80u;
  const uint32_t v = w << 8;
  *even = TimesPow2((v & 0x80008000u) | ((v & 0x7F007F00u) >> 4), kTwoTo120);
  *odd = TimesPow2((w & 0x80008000u) | ((w & 0x7F007F00u) >> 4), kTwoTo120);
}

// B fragments of activation row `row` for the thread's 16 k of a chunk, x[0..7] from kk and
// x[8..15] from kk + kHalfStride (half h zeros if !ok[h]; a contiguous chunk, kHalfStride 8, is
// wholly below k or past it: ok[0] for both): b[s] = {(x[4s], x[4s + 2]), (x[4s + 1], x[4s + 3])}.
template <bool kBf16A, int kHalfStride>
__device__ __forceinline__ void LoadActivations(const void* a, int64_t lda, int64_t row, int64_t kk,
                                                const bool ok[2], uint32_t b[4][2]) {
  if constexpr (kBf16A) {
    uint4 v0 = make_uint4(0, 0, 0, 0), v1 = v0;
    if constexpr (kHalfStride == 8) {
      if (ok[0]) {
        const uint4* p =
            reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a) + row * lda + kk);
        v0 = __ldg(p);
        v1 = __ldg(p + 1);
      }
    } else {
      const uint4* p =
          reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a) + row * lda + kk);
      if (ok[0]) v0 = __ldg(p);
      if (ok[1]) v1 = __ldg(p + kHalfStride / 8);
    }
    const uint32_t x[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      b[s][0] = __byte_perm(x[2 * s], x[2 * s + 1], 0x5410);
      b[s][1] = __byte_perm(x[2 * s], x[2 * s + 1], 0x7632);
    }
  } else {
    float f[16];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (ok[kHalfStride == 8 ? 0 : q >> 1])
        v = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(a) + row * lda + kk) +
                  (q >> 1) * (kHalfStride / 4) + (q & 1));
      f[4 * q] = v.x;
      f[4 * q + 1] = v.y;
      f[4 * q + 2] = v.z;
      f[4 * q + 3] = v.w;
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      b[s][0] = PackBf16x2(f[4 * s], f[4 * s + 2]);
      b[s][1] = PackBf16x2(f[4 * s + 1], f[4 * s + 3]);
    }
  }
}

// A weight format is a class constructed per thread from its Matrix (the format's pointers and
// strides), the two weight rows fa (row g of the tile) and fb (row g + 8) and the thread's index
// t in its quad, with:
//   struct Raw;                                     the thread's weights of one k block
//   void Load(int64_t kb, int64_t k, Raw*) const;   zeros past k
//   static int64_t ChunkK(int64_t kb, int c, int t) first k of the thread's chunk c (c < 2)
//   static constexpr int kHalfStride;               k from the chunk's first half (8 contiguous
//                                                   k) to its second; 8: a contiguous chunk,
//                                                   wholly below k or past it (the format's k
//                                                   multiple)
//   static bool HalfOk(int64_t kb, int c, int t, int h, int64_t k)   half h of the chunk below k
//   void Fragment(const Raw&, int c, int s, uint32_t af[4]) const
//       A fragment of sub-step s of chunk c: rows g, g + 8 at logical k (2t, 2t+1), then
//       (2t+8, 2t+9), i.e. af = {even pair of fa, even pair of fb, odd pair of fa, odd of fb}
//   static constexpr bool kBlockScaled;             whether the block sums are scaled, by
//   void BlockScales(int64_t kb, float* sa, float* sb) const   rows fa, fb of block kb

// The B fragments of the thread's activation rows for one chunk of a k block: from global memory
// (each warp loads and permutes its own) or from the block's shared-memory copy (SharedB).
template <int NT, bool kBf16A, typename Format>
struct GlobalB {
  const void* a;
  int64_t lda;
  const int64_t* arow;  // [NT]
  __device__ __forceinline__ void Load(int64_t kb, int c, int64_t k, uint32_t bf[NT][4][2]) const {
    const int t = threadIdx.x & 3;
    const int64_t kk = Format::ChunkK(kb, c, t);
    const bool ok[2] = {Format::HalfOk(kb, c, t, 0, k), Format::HalfOk(kb, c, t, 1, k)};
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      LoadActivations<kBf16A, Format::kHalfStride>(a, lda, arow[j], kk, ok, bf[j]);
    }
  }
};

// acc += the products of k block kb: the MT 16-row tiles' weights cur[i] (w[i]'s Load) times the
// activation fragments from `b`, each tile's block sums scaled by its rows' block scales where the
// format has them. Every accumulator takes its MMAs in the same order (chunk 0 then 1, sub-steps
// 0..3) whatever MT, NT and the fragments' source, so those give the same sums bit for bit.
template <int NT, int MT, typename Format, typename BSource>
__device__ __forceinline__ void AccumulateBlock(const Format (&w)[MT],
                                                const typename Format::Raw (&cur)[MT],
                                                const BSource& b, int64_t kb, int64_t k,
                                                float acc[MT][NT][4]) {
  float part[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) part[i][j][r] = 0.0f;
    }
  }
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    uint32_t bf[NT][4][2];
    b.Load(kb, c, k, bf);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        uint32_t af[4];
        w[i].Fragment(cur[i], c, s, af);
#pragma unroll
        for (int j = 0; j < NT; ++j) MmaBf16(part[i][j], af, bf[j][s][0], bf[j][s][1]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    if constexpr (Format::kBlockScaled) {
      float s0, s1;
      w[i].BlockScales(kb, &s0, &s1);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        acc[i][j][0] = fmaf(part[i][j][0], s0, acc[i][j][0]);
        acc[i][j][1] = fmaf(part[i][j][1], s0, acc[i][j][1]);
        acc[i][j][2] = fmaf(part[i][j][2], s1, acc[i][j][2]);
        acc[i][j][3] = fmaf(part[i][j][3], s1, acc[i][j][3]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[i][j][r] += part[i][j][r];
      }
    }
  }
}

template <int NT, int MT>
__device__ __forceinline__ void ZeroAcc(float acc[MT][NT][4]) {
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;
    }
  }
}

// The formats of the warp's MT tiles from f0: tile i has rows f0 + 16 i + g and + 8 (clamped to
// n - 1).
template <int MT, typename Format>
__device__ __forceinline__ void TileFormats(const typename Format::Matrix& m, int64_t n, int64_t f0,
                                            Format (&w)[MT]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    w[i] = Format(m, min(f0 + kTile * i + g, n - 1), min(f0 + kTile * i + g + 8, n - 1), t);
  }
}

// acc (C fragments of MT x NT tiles) = the warp's 16 MT weight rows from f0 times activation rows
// row0 .. row0 + 8 NT - 1 (rows at or past row_end read row_end - 1, their sums unused) over k
// blocks [kb0, kb1).
template <int NT, int MT, bool kBf16A, typename Format>
__device__ __forceinline__ void WarpTile(const typename Format::Matrix& m, int64_t n, int64_t f0,
                                         const void* a, int64_t lda, int64_t row0, int64_t row_end,
                                         int64_t k, int64_t kb0, int64_t kb1,
                                         float acc[MT][NT][4]) {
  const int g = (threadIdx.x & 31) >> 2;
  ZeroAcc<NT, MT>(acc);
  if (f0 >= n || kb0 >= kb1) return;
  Format w[MT];
  TileFormats<MT>(m, n, f0, w);
  int64_t arow[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) arow[j] = min(row0 + 8 * j + g, row_end - 1);
  const GlobalB<NT, kBf16A, Format> b{a, lda, arow};

  // Weights are loaded one block ahead of their MMAs.
  typename Format::Raw cur[MT], next[MT];
#pragma unroll
  for (int i = 0; i < MT; ++i) w[i].Load(kb0, k, &cur[i]);
  for (int64_t kb = kb0; kb < kb1; ++kb) {
    if (kb + 1 < kb1) {
#pragma unroll
      for (int i = 0; i < MT; ++i) w[i].Load(kb + 1, k, &next[i]);
    }
    AccumulateBlock<NT, MT, Format>(w, cur, b, kb, k, acc);
#pragma unroll
    for (int i = 0; i < MT; ++i) cur[i] = next[i];
  }
}

// Shared activation fragments: the block's 8 NT activation rows, for the current k block of each
// of its ks_count k-slices, built once (loaded and permuted into B-fragment order) in shared
// memory and read by every warp, instead of each warp loading and permuting its own. A phase
// stages `steps` consecutive k blocks of every slice (kSharedBUnits 2 KiB units: steps * ks_count
// * NT <= kSharedBUnits), between two barriers. Layout: [step][slice][j][q][lane] uint4, q = 2 c +
// h: the B fragments of sub-steps 2h, 2h + 1 of chunk c for lane's rows of tile j.
constexpr int kSharedBUnits = 16;
constexpr size_t kSharedBBytes = size_t{2048} * kSharedBUnits;
// The units of MmaGroupedKernel's kByRows (64 KiB: a pass of up to 16 rows stages 16 k blocks,
// Moonlight's whole hidden size, between one pair of barriers).
constexpr int kSharedBUnitsByRows = 2 * kSharedBUnits;

// Whether the shared fragments fit a launch (else the kernels read activations per warp).
inline bool SharedBFits(int nt, int ks) { return nt * ks <= kSharedBUnits; }

// The 8 activations of row `row` from kk (zeros if !ok) as the B fragments of two sub-steps:
// {(x0, x2), (x1, x3), (x4, x6), (x5, x7)}, as LoadActivations.
template <bool kBf16A>
__device__ __forceinline__ uint4 LoadActivationHalf(const void* a, int64_t lda, int64_t row,
                                                    int64_t kk, bool ok) {
  if constexpr (kBf16A) {
    uint4 v = make_uint4(0, 0, 0, 0);
    if (ok)
      v = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a) + row * lda + kk));
    return make_uint4(__byte_perm(v.x, v.y, 0x5410), __byte_perm(v.x, v.y, 0x7632),
                      __byte_perm(v.z, v.w, 0x5410), __byte_perm(v.z, v.w, 0x7632));
  } else {
    float4 v0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), v1 = v0;
    if (ok) {
      const float4* p =
          reinterpret_cast<const float4*>(static_cast<const float*>(a) + row * lda + kk);
      v0 = __ldg(p);
      v1 = __ldg(p + 1);
    }
    return make_uint4(PackBf16x2(v0.x, v0.z), PackBf16x2(v0.y, v0.w), PackBf16x2(v1.x, v1.z),
                      PackBf16x2(v1.y, v1.w));
  }
}

// Stages steps [step0, step0 + steps) of every k-slice (slice q's step p is k block q * per + p,
// none past its slice's end) into frag, kBatch loads in flight per thread before their stores.
// All the block's threads call it.
template <int NT, bool kBf16A, typename Format, int kBatch = 4>
__device__ __forceinline__ void StageActivations(uint4* frag, const void* a, int64_t lda,
                                                 int64_t row0, int64_t row_end, int64_t k,
                                                 int ks_count, int64_t blocks, int64_t per,
                                                 int64_t step0, int steps) {
  const int items = steps * ks_count * NT * 128;
  for (int e0 = threadIdx.x; e0 < items; e0 += kBatch * kThreads) {
    uint4 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int e = e0 + u * kThreads;
      const int lane = e & 31, q = (e >> 5) & 3, j = (e >> 7) % NT, r = (e >> 7) / NT;
      const int slice = r % ks_count, step = r / ks_count;
      const int g = lane >> 2, t = lane & 3, c = q >> 1;
      const int64_t kb = slice * per + step0 + step;
      const bool ok =
          e < items && kb < min(blocks, (slice + 1) * per) && Format::HalfOk(kb, c, t, q & 1, k);
      const int64_t row = min(row0 + 8 * j + g, row_end - 1);
      v[u] = LoadActivationHalf<kBf16A>(
          a, lda, row, Format::ChunkK(kb, c, t) + Format::kHalfStride * (q & 1), ok);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (e0 + u * kThreads < items) frag[e0 + u * kThreads] = v[u];
    }
  }
}

// GlobalB's fragments from the warp's unit of a staged step.
template <int NT>
struct SharedB {
  const uint4* unit;  // [j][q][lane] of the warp's slice and step
  __device__ __forceinline__ void Load(int64_t, int c, int64_t, uint32_t bf[NT][4][2]) const {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 v = unit[(j * 4 + 2 * c + h) * 32 + lane];
        bf[j][2 * h][0] = v.x;
        bf[j][2 * h][1] = v.y;
        bf[j][2 * h + 1][0] = v.z;
        bf[j][2 * h + 1][1] = v.w;
      }
    }
  }
};

// WarpTile with the activation fragments staged in shared memory (frag: kUnits 2 KiB units), for
// warp slice ks of ks_count: the same sums. Every thread of the block calls it (it has barriers),
// the warps past n or with an empty slice too.
template <int NT, int MT, bool kBf16A, typename Format, int kUnits = kSharedBUnits>
__device__ __forceinline__ void WarpTileSharedB(const typename Format::Matrix& m, int64_t n,
                                                int64_t f0, const void* a, int64_t lda,
                                                int64_t row0, int64_t row_end, int64_t k, int ks,
                                                int ks_count, uint4* frag, float acc[MT][NT][4]) {
  ZeroAcc<NT, MT>(acc);
  const int64_t blocks = (k + kKBlock - 1) / kKBlock;
  const int64_t per = (blocks + ks_count - 1) / ks_count;
  const int64_t kb0 = min(blocks, ks * per), kb1 = min(blocks, kb0 + per);
  const bool active = f0 < n && kb0 < kb1;
  const int steps = kUnits / (ks_count * NT);
  Format w[MT];
  TileFormats<MT>(m, n, f0, w);
  typename Format::Raw cur[MT], next[MT];
  if (active) {
#pragma unroll
    for (int i = 0; i < MT; ++i) w[i].Load(kb0, k, &cur[i]);
  }
  for (int64_t s0 = 0; s0 < per; s0 += steps) {
    const int now = static_cast<int>(min(static_cast<int64_t>(steps), per - s0));
    __syncthreads();  // the previous phase's fragments have been read
    StageActivations<NT, kBf16A, Format>(frag, a, lda, row0, row_end, k, ks_count, blocks, per, s0,
                                         now);
    __syncthreads();
    if (!active) continue;
    for (int p = 0; p < now && kb0 + s0 + p < kb1; ++p) {
      const int64_t kb = kb0 + s0 + p;
      if (kb + 1 < kb1) {
#pragma unroll
        for (int i = 0; i < MT; ++i) w[i].Load(kb + 1, k, &next[i]);
      }
      const SharedB<NT> b{frag + (p * ks_count + ks) * NT * 128};
      AccumulateBlock<NT, MT, Format>(w, cur, b, kb, k, acc);
#pragma unroll
      for (int i = 0; i < MT; ++i) cur[i] = next[i];
    }
  }
}

// The all-rows tile loop, for many activation rows: the warp widens its 16 weight rows' A
// fragments of a k block once (all 8 sub-steps, 32 registers) and applies them to all its 8 NT
// activation rows (NT up to 16), reading their B fragments from the block's shared-memory copy
// (StageActivations, kAllRowsUnits(NT) 2 KiB units a phase, 8 loads in flight per thread: a phase
// is not overlapped with the MMAs). Each 8-row tile's block sum takes the same MMAs in the same
// order as AccumulateBlock's, then is scaled and added the same way: the sums of WarpTile /
// WarpTileSharedB at the same k split, bit for bit. Every thread of the block calls it (it has
// barriers), the warps past n or with an empty slice too.
__host__ __device__ constexpr int kAllRowsUnits(int nt) { return nt >= 16 ? 64 : 32; }

template <int NT, bool kBf16A, typename Format>
__device__ __forceinline__ void WarpTileAllRows(const typename Format::Matrix& m, int64_t n,
                                                int64_t f0, const void* a, int64_t lda,
                                                int64_t row0, int64_t row_end, int64_t k, int ks,
                                                int ks_count, uint4* frag, float acc[1][NT][4]) {
  const int lane = threadIdx.x & 31;
  ZeroAcc<NT, 1>(acc);
  const int64_t blocks = (k + kKBlock - 1) / kKBlock;
  const int64_t per = (blocks + ks_count - 1) / ks_count;
  const int64_t kb0 = min(blocks, ks * per), kb1 = min(blocks, kb0 + per);
  const bool active = f0 < n && kb0 < kb1;
  const int steps = kAllRowsUnits(NT) / (ks_count * NT);
  Format w[1];
  TileFormats<1>(m, n, f0, w);
  typename Format::Raw cur;
  if (active) w[0].Load(kb0, k, &cur);
  for (int64_t s0 = 0; s0 < per; s0 += steps) {
    const int now = static_cast<int>(min(static_cast<int64_t>(steps), per - s0));
    __syncthreads();  // the previous phase's fragments have been read
    StageActivations<NT, kBf16A, Format, 8>(frag, a, lda, row0, row_end, k, ks_count, blocks, per,
                                            s0, now);
    __syncthreads();
    if (!active) continue;
    for (int p = 0; p < now && kb0 + s0 + p < kb1; ++p) {
      const int64_t kb = kb0 + s0 + p;
      uint32_t af[2][4][4];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
#pragma unroll
        for (int s = 0; s < 4; ++s) w[0].Fragment(cur, c, s, af[c][s]);
      }
      if (kb + 1 < kb1) w[0].Load(kb + 1, k, &cur);  // the next block's, once these are widened
      float sc0 = 1.0f, sc1 = 1.0f;
      if constexpr (Format::kBlockScaled) w[0].BlockScales(kb, &sc0, &sc1);
      const uint4* unit = frag + (p * ks_count + ks) * NT * 128 + lane;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int c = 0; c < 2; ++c) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint4 v = unit[(j * 4 + 2 * c + h) * 32];
            MmaBf16(part, af[c][2 * h], v.x, v.y);
            MmaBf16(part, af[c][2 * h + 1], v.z, v.w);
          }
        }
        if constexpr (Format::kBlockScaled) {
          acc[0][j][0] = fmaf(part[0], sc0, acc[0][j][0]);
          acc[0][j][1] = fmaf(part[1], sc0, acc[0][j][1]);
          acc[0][j][2] = fmaf(part[2], sc1, acc[0][j][2]);
          acc[0][j][3] = fmaf(part[3], sc1, acc[0][j][3]);
        } else {
#pragma unroll
          for (int r = 0; r < 4; ++r) acc[0][j][r] += part[r];
        }
      }
    }
  }
}

// C fragments (tile i: features 16 i + g / + 8, rows 2t, 2t + 1 of row tile j) into
// red[feature][row].
template <int NT, int MT>
__device__ __forceinline__ void StoreFragments(const float acc[MT][NT][4], float (*red)[8 * NT]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        red[kTile * i + g + (r >= 2 ? 8 : 0)][8 * j + 2 * t + (r & 1)] = acc[i][j][r];
      }
    }
  }
}

// The k-slice of warp `ks` of ks_count over ceil(k / 128) blocks: [*kb0, *kb1).
__device__ __forceinline__ void KSlice(int64_t k, int ks, int ks_count, int64_t* kb0,
                                       int64_t* kb1) {
  const int64_t blocks = (k + kKBlock - 1) / kKBlock;
  const int64_t per = (blocks + ks_count - 1) / ks_count;
  *kb0 = min(blocks, ks * per);
  *kb1 = min(blocks, *kb0 + per);
}

// c[i, j] (rows i in [row0, row_end), features j < n, c's row stride ldc) = the sum over the
// k-slices of warps' red tiles, in warp order; with accumulate, c + the sum. The block's fb_count
// feature tiles of 16 MT rows start at feature tile0 * 16 MT.
template <int NT, int MT>
__device__ __forceinline__ void ReduceAndStore(float (*red)[kTile * MT][8 * NT], int fb_count,
                                               int ks_count, int64_t tile0, int64_t row0,
                                               int64_t row_end, int64_t n, float* c, int64_t ldc,
                                               bool accumulate) {
  constexpr int kRows = 8 * NT, kTileRows = kTile * MT;
  for (int e = threadIdx.x; e < fb_count * kRows * kTileRows; e += kThreads) {
    const int f = e % kTileRows, r = (e / kTileRows) % kRows, tile = e / (kTileRows * kRows);
    const int64_t j = (tile0 + tile) * kTileRows + f, i = row0 + r;
    if (j >= n || i >= row_end) continue;
    float s = red[tile * ks_count][f][r];
    for (int q = 1; q < ks_count; ++q) s += red[tile * ks_count + q][f][r];
    float* out = c + i * ldc + j;
    *out = accumulate ? *out + s : s;
  }
}

// k-slices per feature tile: the fewest that give the grid kTargetBlocks blocks of
// (8 / ks) feature tiles of tile_rows each, without slices left with no k block.
inline int KSplit(int64_t n, int64_t k, int64_t other_blocks, int tile_rows = kTile) {
  const int64_t tiles = (n + tile_rows - 1) / tile_rows, kblocks = (k + kKBlock - 1) / kKBlock;
  int ks = 1;
  while (ks < kWarps && 2 * ks <= kblocks &&
         (tiles + kWarps / ks - 1) / (kWarps / ks) * other_blocks < kTargetBlocks) {
    ks *= 2;
  }
  return ks;
}

// Activation-row tiles of 8 per pass: 1, 2 or 4.
inline int RowTiles(int64_t rows) { return rows <= 8 ? 1 : rows <= 16 ? 2 : 4; }

// Lets `kernel` take `bytes` of dynamic shared memory on the calling thread's device. `allowed_on`
// is the launch site's bitmask of devices where that is done, so a launch costs a cudaGetDevice
// and an atomic load; the first launch on a device asks KernelFactsForCurrentDevice (in relaxed
// capture mode for this thread, so that the call cannot invalidate a capture in progress).
// cudaErrorInvalidValue where the device has less shared memory than that.
inline cudaError_t AllowDynamicSmem(const void* kernel, size_t bytes,
                                    std::atomic<uint64_t>* allowed_on) {
  int device = 0;
  const cudaError_t dev_err = cudaGetDevice(&device);
  if (dev_err != cudaSuccess) return dev_err;
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if ((allowed_on->load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  const KernelFacts f = KernelFactsForCurrentDevice(kernel, static_cast<int>(bytes));
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  if (f.error != cudaSuccess) return f.error;
  if (f.max_smem < static_cast<int>(bytes)) return cudaErrorInvalidValue;
  allowed_on->fetch_or(bit, std::memory_order_acq_rel);
  return cudaSuccess;
}

}  // namespace mma_tile
}  // namespace kernels
}  // namespace deepinfer
