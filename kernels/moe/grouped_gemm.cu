// Two kernels, both with this grid (the CUDA-core one strides over its x when the grid is capped
// at one resident wave), and a tensor-core variant further down for slots with many rows. Grid: x =
// tiles of kRowsPerBlock weight rows (output features), y = the j-th NON-EMPTY slot, j <
// min(num_slots, max_rows) (a slot is found from the device offsets by warp 0; blocks past the last
// non-empty slot exit). So with one token and top-6, only 6 columns of blocks do work, whatever
// num_slots is.
//
// CUDA cores: inside a block each warp owns kRowsPerWarp weight rows and streams them once per row
// tile: every lane loads 16 bytes (8 bf16) of each row per step, converts them to fp32 (a shift)
// and multiplies them with the matching 8 floats of each x row of the tile (x rows come through L1,
// shared by the block's warps). Rows of a slot are processed in tiles of 8/4/2/1 so that a slot
// with m rows streams its weights ceil(m / 8) times (later passes hit L2), and the accumulators
// stay in registers.
#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "kernels/common/cp_async.cuh"
#include "kernels/common/nonempty_group.cuh"
#include "kernels/moe/grouped_gemm.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 2;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
// 16-byte weight loads in flight per lane and weight row: more for one row, whose registers
// are otherwise idle, so a decode warp has most of its weight bytes requested at once.
template <int MT>
constexpr int kUnroll = MT == 1 ? 4 : 2;
// kAuto: the CUDA-core kernel up to this many rows per slot (decode), tensor cores above.
constexpr int kCudaCoreMaxRowsPerSlot = 2;

__device__ __forceinline__ void Bf16x8ToFloat(const uint4& v, float f[8]) {
  const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}

// Rows [row0, row0 + valid) of x (valid <= MT; missing rows re-read the last valid one and are
// not stored) times the warp's weight rows w[j] (j < kRowsPerWarp; store only if n_ok[j]).
template <int MT>
__device__ __forceinline__ void RowTile(const float* x, int64_t row0, int valid, int k,
                                        const uint4* const w[kRowsPerWarp],
                                        const bool n_ok[kRowsPerWarp], int64_t n_first, int n,
                                        float* y) {
  const int lane = threadIdx.x % 32;
  const int kv = k / 8;
  const float4* xr[MT];
#pragma unroll
  for (int r = 0; r < MT; ++r) {
    xr[r] = reinterpret_cast<const float4*>(x + (row0 + min(r, valid - 1)) * int64_t{k});
  }
  float acc[MT][kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < MT; ++r)
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; ++j) acc[r][j] = 0.0f;

  for (int v0 = lane; v0 < kv; v0 += 32 * kUnroll<MT>) {
    uint4 wv[kUnroll<MT>][kRowsPerWarp];
#pragma unroll
    for (int u = 0; u < kUnroll<MT>; ++u) {
      const int v = v0 + u * 32;
#pragma unroll
      for (int j = 0; j < kRowsPerWarp; ++j) {
        wv[u][j] = v < kv ? __ldg(w[j] + v) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll<MT>; ++u) {
      const int v = v0 + u * 32;
      if (v >= kv) break;
      float wf[kRowsPerWarp][8];
#pragma unroll
      for (int j = 0; j < kRowsPerWarp; ++j) Bf16x8ToFloat(wv[u][j], wf[j]);
#pragma unroll
      for (int r = 0; r < MT; ++r) {
        const float4 a = __ldg(xr[r] + 2 * v), b = __ldg(xr[r] + 2 * v + 1);
#pragma unroll
        for (int j = 0; j < kRowsPerWarp; ++j) {
          float s = acc[r][j];
          s = fmaf(a.x, wf[j][0], s);
          s = fmaf(a.y, wf[j][1], s);
          s = fmaf(a.z, wf[j][2], s);
          s = fmaf(a.w, wf[j][3], s);
          s = fmaf(b.x, wf[j][4], s);
          s = fmaf(b.y, wf[j][5], s);
          s = fmaf(b.z, wf[j][6], s);
          s = fmaf(b.w, wf[j][7], s);
          acc[r][j] = s;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < MT; ++r) {
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; ++j) {
      float s = acc[r][j];
#pragma unroll
      for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
      // Every lane holds the sum; spread the stores over lanes.
      if (r < valid && n_ok[j] && lane == (r * kRowsPerWarp + j) % 32) {
        y[(row0 + r) * int64_t{n} + n_first + j] = s;
      }
    }
  }
}

// kMaxTile bounds the row tile: larger tiles re-stream the weights less often for big slots but
// need more registers (fewer resident warps), so decode with one row per slot uses kMaxTile 1.
template <int kMaxTile>
__global__ void __launch_bounds__(kThreads) GroupedGemmBf16Kernel(GroupedGemmBf16Params p) {
  __shared__ int work[3];
  FindNonEmptyGroup(p.num_slots, p.max_rows, p.slot_offsets, work);
  const int slot = work[0], row_begin = work[1], row_end = work[2];
  if (row_begin >= row_end) return;

  const int warp = threadIdx.x / 32;
  const uint16_t* weights = p.weights[slot];
  // Blocks stride over the weight-row tiles: the grid holds about one resident wave, so there
  // is no tail wave (decode runs only a few tens of microseconds).
  for (int64_t n_first = int64_t{blockIdx.x} * kRowsPerBlock + warp * kRowsPerWarp; n_first < p.n;
       n_first += int64_t{gridDim.x} * kRowsPerBlock) {
    const uint4* w[kRowsPerWarp];
    bool n_ok[kRowsPerWarp];
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; ++j) {
      n_ok[j] = n_first + j < p.n;
      // A row past n re-reads the last row (in bounds) and is not stored.
      const int64_t row = min(n_first + j, int64_t{p.n} - 1);
      w[j] = reinterpret_cast<const uint4*>(weights + row * p.k);
    }
    for (int row0 = row_begin; row0 < row_end;) {
      const int rest = row_end - row0;
      if (kMaxTile >= 8 && rest >= 5) {
        RowTile<kMaxTile >= 8 ? 8 : 1>(p.x, row0, min(rest, 8), p.k, w, n_ok, n_first, p.n, p.y);
        row0 += min(rest, 8);
      } else if (kMaxTile >= 4 && rest >= 3) {
        RowTile<kMaxTile >= 4 ? 4 : 1>(p.x, row0, min(rest, 4), p.k, w, n_ok, n_first, p.n, p.y);
        row0 += min(rest, 4);
      } else if (kMaxTile >= 2 && rest >= 2) {
        RowTile<kMaxTile >= 2 ? 2 : 1>(p.x, row0, 2, p.k, w, n_ok, n_first, p.n, p.y);
        row0 += 2;
      } else {
        RowTile<1>(p.x, row0, 1, p.k, w, n_ok, n_first, p.n, p.y);
        row0 += 1;
      }
    }
  }
}

// ---- Tensor-core variant (sm_80+): mma.sync m16n8k16, bf16 in, fp32 accumulate. ------------
// A = 16 weight rows x 16 k (bf16 as stored), B = 16 k x 8 x rows. x is fp32: it is split into
// hi = bf16(x) and lo = bf16(x - hi) and both are multiplied (two MMAs), so x keeps about 16
// significant bits (relative error <= 2^-17) while the weights are exact: close to the fp32
// CUDA-core path at a fraction of its instruction count when slots have many rows.
//
// k order: the sum over k does not care about order, so each thread loads 8 CONTIGUOUS k values
// (one 16-byte load of a weight row, two float4 of an x row) and the fragment registers are
// filled so that MMA-logical k (2t, 2t+1 | 2t+8, 2t+9) of half h maps to physical
// 8t + 4h + (0, 1 | 2, 3) inside a 32-wide k block, for A and B alike.
constexpr int kTcWarps = 4;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kTcFeatureTiles = 2;  // 16-row weight tiles per warp
constexpr int kTcFeaturesPerBlock = kTcWarps * kTcFeatureTiles * 16;

__device__ __forceinline__ void MmaBf16(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Packs (f0, f1) as bf16x2 hi (f0 in the low half) and, with kSplitX, the rounding residual as
// lo (without it, lo is left alone: x is used rounded to bf16, one MMA per product).
template <bool kSplitX>
__device__ __forceinline__ void SplitBf16x2(float f0, float f1, unsigned* hi, unsigned* lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(f0, f1);
  *hi = *reinterpret_cast<const unsigned*>(&h);
  if (kSplitX) {
    const __nv_bfloat162 l = __floats2bfloat162_rn(f0 - __low2float(h), f1 - __high2float(h));
    *lo = *reinterpret_cast<const unsigned*>(&l);
  }
}

// One pass: the warp's 16 * kTcFeatureTiles weight rows times x rows [row0, row0 + 8 * NT)
// (rows >= row_end are read as a clamped valid row and not stored). kSplitX: x as hi + lo (two
// MMAs per product), else x rounded to bf16 (kTensorCoreBf16X: the hi MMA alone); kBf16In: x
// read as bf16 from p.x_bf16 (the same values as rounding p.x, so the same bits).
template <int NT, bool kSplitX, bool kBf16In>
__device__ __forceinline__ void TcRowPass(const GroupedGemmBf16Params& p, const uint16_t* weights,
                                          int64_t feature0, int row0, int row_end) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint4* w[kTcFeatureTiles][2];
#pragma unroll
  for (int f = 0; f < kTcFeatureTiles; ++f) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t feature = min(feature0 + f * 16 + half * 8 + g, int64_t{p.n} - 1);
      w[f][half] = reinterpret_cast<const uint4*>(weights + feature * p.k);
    }
  }
  static_assert(!(kSplitX && kBf16In), "bf16 x has no lo term");
  const float4* x[NT];
  const uint4* xb[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int row = min(row0 + j * 8 + g, row_end - 1);
    if (kBf16In) {
      xb[j] = reinterpret_cast<const uint4*>(p.x_bf16 + int64_t{row} * p.k);
    } else {
      x[j] = reinterpret_cast<const float4*>(p.x + int64_t{row} * p.k);
    }
  }
  float acc[kTcFeatureTiles][NT][4];
#pragma unroll
  for (int f = 0; f < kTcFeatureTiles; ++f)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[f][j][i] = 0.0f;

  const int chunks = p.k / 8;  // 16-byte weight chunks per row; thread t takes chunk 4*step + t
  // Two steps' weight loads in flight (the sums keep their order).
#pragma unroll 2
  for (int c = t; c - t < chunks; c += 4) {
    const bool ok = c < chunks;
    uint4 a[kTcFeatureTiles][2];
#pragma unroll
    for (int f = 0; f < kTcFeatureTiles; ++f)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        a[f][half] = ok ? __ldg(w[f][half] + c) : make_uint4(0, 0, 0, 0);
    unsigned bhi[NT][4], blo[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if (kBf16In) {
        // 8 bf16 values, value 2i in the low half of word i: what SplitBf16x2 packs.
        const uint4 v = ok ? __ldg(xb[j] + c) : make_uint4(0, 0, 0, 0);
        bhi[j][0] = v.x, bhi[j][1] = v.y, bhi[j][2] = v.z, bhi[j][3] = v.w;
        continue;
      }
      float4 v0 = make_float4(0, 0, 0, 0), v1 = v0;
      if (ok) {
        v0 = __ldg(x[j] + 2 * c);
        v1 = __ldg(x[j] + 2 * c + 1);
      }
      SplitBf16x2<kSplitX>(v0.x, v0.y, &bhi[j][0], &blo[j][0]);
      SplitBf16x2<kSplitX>(v0.z, v0.w, &bhi[j][1], &blo[j][1]);
      SplitBf16x2<kSplitX>(v1.x, v1.y, &bhi[j][2], &blo[j][2]);
      SplitBf16x2<kSplitX>(v1.z, v1.w, &bhi[j][3], &blo[j][3]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int f = 0; f < kTcFeatureTiles; ++f) {
        const unsigned frag[4] = {h ? a[f][0].z : a[f][0].x, h ? a[f][1].z : a[f][1].x,
                                  h ? a[f][0].w : a[f][0].y, h ? a[f][1].w : a[f][1].y};
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          MmaBf16(acc[f][j], frag, bhi[j][2 * h], bhi[j][2 * h + 1]);
          if (kSplitX) MmaBf16(acc[f][j], frag, blo[j][2 * h], blo[j][2 * h + 1]);
        }
      }
    }
  }
  // C fragment: c0, c1 = (feature g, rows 2t, 2t+1); c2, c3 = (feature g + 8, same rows).
#pragma unroll
  for (int f = 0; f < kTcFeatureTiles; ++f) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t feature = feature0 + f * 16 + g + (i >= 2 ? 8 : 0);
        const int row = row0 + j * 8 + 2 * t + (i % 2);
        if (feature < p.n && row < row_end) p.y[int64_t{row} * p.n + feature] = acc[f][j][i];
      }
    }
  }
}

template <int kMaxNT, bool kSplitX, bool kBf16In>
__global__ void __launch_bounds__(kTcThreads) GroupedGemmBf16TcKernel(GroupedGemmBf16Params p) {
  __shared__ int work[3];
  FindNonEmptyGroup(p.num_slots, p.max_rows, p.slot_offsets, work);
  const int slot = work[0], row_begin = work[1], row_end = work[2];
  if (row_begin >= row_end) return;
  const int warp = threadIdx.x / 32;
  const int64_t feature0 = int64_t{blockIdx.x} * kTcFeaturesPerBlock + warp * kTcFeatureTiles * 16;
  if (feature0 >= p.n) return;
  const uint16_t* weights = p.weights[slot];
  for (int row0 = row_begin; row0 < row_end;) {
    const int rest = row_end - row0;
    if (kMaxNT >= 4 && rest > 16) {
      TcRowPass<kMaxNT >= 4 ? 4 : 1, kSplitX, kBf16In>(p, weights, feature0, row0, row_end);
      row0 += 32;
    } else if (kMaxNT >= 2 && rest > 8) {
      TcRowPass<kMaxNT >= 2 ? 2 : 1, kSplitX, kBf16In>(p, weights, feature0, row0, row_end);
      row0 += 16;
    } else {
      TcRowPass<1, kSplitX, kBf16In>(p, weights, feature0, row0, row_end);
      row0 += 8;
    }
  }
}

// The tensor-core variant for many rows: a block owns 128 rows of one slot x 64 features (8 warps,
// each 32 rows x 32 features), its k steps staged in shared memory by cp.async. Each output is
// the same sum as TcRowPass's, bit for bit: the 32-wide k steps in order, per step the halves
// h = 0, 1, per half the MMA of x's hi then of its lo term (kSplitX; without it the hi MMA alone,
// as TcRowPass<NT, false, false>), the same fragment permutation. So the two are picked by the row
// count alone. Grid: x = feature tiles, y = the j-th row tile over the slots in slot order (a
// bound: blocks past the last tile exit).
constexpr int kTiledRows = 128;
constexpr int kTiledFeatures = 64;
constexpr int kTiledStages = 3;
constexpr int kTiledThreads = 256;
constexpr int kTiledXRowBytes = 32 * sizeof(float);  // one k step of an x row
constexpr int kTiledWBytes = kTiledFeatures * 64;
constexpr int kTiledStageBytes = kTiledWBytes + kTiledRows * kTiledXRowBytes;
constexpr int kTiledSmemBytes = kTiledStages * kTiledStageBytes;
// The tiled kernel from kGroupedGemmTiledMinRows rows (about 128 rows a slot at 64 slots): below,
// most of its tiles would be mostly empty.
constexpr int kTiledMinRows = kGroupedGemmTiledMinRows;

// work = (slot, first row, end row) of the blockIdx.y-th 128-row tile over the slots in slot
// order, or an empty range past the last tile.
__device__ void FindRowTile(const GroupedGemmBf16Params& p, int work[3]) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const int target = static_cast<int>(blockIdx.y);
    int seen = 0;  // tiles of the slots before base
    bool found = false;
    for (int base = 0; base < p.num_slots && !found; base += 32) {
      const int s = base + lane;
      int b = 0, e = 0;
      if (s < p.num_slots) {
        b = min(p.slot_offsets[s], p.max_rows);
        e = min(p.slot_offsets[s + 1], p.max_rows);
      }
      const int tiles = e > b ? (e - b + kTiledRows - 1) / kTiledRows : 0;
      int incl = tiles;  // inclusive prefix sum over the lanes
#pragma unroll
      for (int off = 1; off < 32; off *= 2) {
        const int v = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += v;
      }
      const int rank = target - seen;
      const int total = __shfl_sync(0xffffffffu, incl, 31);
      if (rank < total) {
        found = true;
        if (rank >= incl - tiles && rank < incl) {
          const int first = b + (rank - (incl - tiles)) * kTiledRows;
          work[0] = s;
          work[1] = first;
          work[2] = min(first + kTiledRows, e);
        }
      }
      seen += total;
    }
    if (!found && lane == 0) work[1] = work[2] = 0;
  }
  __syncthreads();
}

template <bool kSplitX>
__global__ void __launch_bounds__(kTiledThreads, 2)
    GroupedGemmBf16TiledKernel(GroupedGemmBf16Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int work[3];
  FindRowTile(p, work);
  const int slot = work[0], row0 = work[1], row_end = work[2];
  if (row0 >= row_end) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int64_t feature0 = int64_t{blockIdx.x} * kTiledFeatures;
  const uint16_t* weights = p.weights[slot];
  const int chunks = p.k / 8;
  const int steps = (chunks + 3) / 4;

  // This thread's cp.async sources: one 16-byte piece of a weight row and 4 of x rows per stage
  // (rows past the tile's end read a clamped valid row, not stored).
  const int w_row = tid / 4, w_chunk = tid % 4;
  const uint16_t* w_src = weights + min(feature0 + w_row, int64_t{p.n} - 1) * p.k;
  const float* x_src[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x_src[i] = p.x + int64_t{min(row0 + (tid + i * kTiledThreads) / 8, row_end - 1)} * p.k;
  }
  auto load = [&](int stage, int step) {
    unsigned char* base = smem + stage * kTiledStageBytes;
    const int wch = 4 * step + w_chunk;
    CpAsync16(base + w_row * 64 + w_chunk * 16, w_src + (wch < chunks ? wch * 8 : 0), wch < chunks);
    unsigned char* xbase = base + kTiledWBytes;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = tid + i * kTiledThreads, row = e / 8, piece = e % 8;
      const int ch = 4 * step + piece / 2;  // a piece is half of an 8-value chunk
      CpAsync16(xbase + row * kTiledXRowBytes + piece * 16,
                x_src[i] + (ch < chunks ? ch * 8 + (piece % 2) * 4 : 0), ch < chunks);
    }
  };

  float acc[2][4][4];  // [16-feature tile][8-row tile][C fragment]
#pragma unroll
  for (int f = 0; f < 2; ++f)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[f][j][i] = 0.0f;
#pragma unroll
  for (int s = 0; s < kTiledStages - 1; ++s) {
    if (s < steps) load(s, s);
    CpAsyncCommit();
  }
  const int warp_rows = (warp % 4) * 32, warp_features = (warp / 4) * 32;
  for (int step = 0; step < steps; ++step) {
    CpAsyncWait<kTiledStages - 2>();
    __syncthreads();
    const int next = step + kTiledStages - 1;
    if (next < steps) load(next % kTiledStages, next);
    CpAsyncCommit();
    const unsigned char* base = smem + (step % kTiledStages) * kTiledStageBytes;
    uint4 a[2][2];
#pragma unroll
    for (int f = 0; f < 2; ++f)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        a[f][half] = *reinterpret_cast<const uint4*>(
            base + (warp_features + 16 * f + 8 * half + g) * 64 + t * 16);
    unsigned bhi[4][4], blo[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const unsigned char* row = base + kTiledWBytes + (warp_rows + 8 * j + g) * kTiledXRowBytes;
      const float4 v0 = *reinterpret_cast<const float4*>(row + t * 32);
      const float4 v1 = *reinterpret_cast<const float4*>(row + t * 32 + 16);
      SplitBf16x2<kSplitX>(v0.x, v0.y, &bhi[j][0], &blo[j][0]);
      SplitBf16x2<kSplitX>(v0.z, v0.w, &bhi[j][1], &blo[j][1]);
      SplitBf16x2<kSplitX>(v1.x, v1.y, &bhi[j][2], &blo[j][2]);
      SplitBf16x2<kSplitX>(v1.z, v1.w, &bhi[j][3], &blo[j][3]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int f = 0; f < 2; ++f) {
        const unsigned frag[4] = {h ? a[f][0].z : a[f][0].x, h ? a[f][1].z : a[f][1].x,
                                  h ? a[f][0].w : a[f][0].y, h ? a[f][1].w : a[f][1].y};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          MmaBf16(acc[f][j], frag, bhi[j][2 * h], bhi[j][2 * h + 1]);
          if (kSplitX) MmaBf16(acc[f][j], frag, blo[j][2 * h], blo[j][2 * h + 1]);
        }
      }
    }
  }
  // C fragment: i = 0, 1: (feature g, rows 2t, 2t + 1); i = 2, 3: (feature g + 8, same rows).
#pragma unroll
  for (int f = 0; f < 2; ++f)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t feature = feature0 + warp_features + 16 * f + g + (i >= 2 ? 8 : 0);
        const int row = row0 + warp_rows + 8 * j + 2 * t + (i % 2);
        if (feature < p.n && row < row_end) p.y[int64_t{row} * p.n + feature] = acc[f][j][i];
      }
}

// True if the tensor-core kernel was compiled for this device (SASS or PTX of sm_80+); the
// compute_75 PTX fallback has no MMA.
bool TensorCoresAvailable() {
  static const bool available = [] {
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, GroupedGemmBf16TcKernel<1, true, false>) != cudaSuccess) {
      return false;
    }
    return attr.binaryVersion >= 80 && attr.ptxVersion >= 80;
  }();
  return available;
}
// Blocks of `kernel` resident on the whole current device at once (0 if unknown). Cached per
// kernel; assumes every device the process uses is of one kind.
template <typename Kernel>
int64_t ResidentBlocks(Kernel kernel, int threads) {
  static const int64_t blocks = [&] {
    int device = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != cudaSuccess) {
      return int64_t{0};
    }
    return int64_t{sms} * per_sm;
  }();
  return blocks;
}

}  // namespace

cudaError_t GroupedGemmBf16(const GroupedGemmBf16Params& p, cudaStream_t stream) {
  const bool x_bf16_in = p.x_bf16 != nullptr;
  if (p.num_slots <= 0 || p.n <= 0 || p.k <= 0 || p.k % 8 != 0 || p.max_rows < 0 ||
      reinterpret_cast<uintptr_t>(p.x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(p.x_bf16) % 16 != 0 ||
      (x_bf16_in && (p.x != nullptr || p.algo != GroupedGemmAlgo::kTensorCoreBf16X))) {
    return cudaErrorInvalidValue;
  }
  if (p.max_rows == 0) return cudaSuccess;
  const int hint = p.rows_per_slot_hint > 0 ? p.rows_per_slot_hint : p.max_rows;
  const int64_t slot_blocks = std::min<int64_t>(p.num_slots, p.max_rows);
  if (slot_blocks > 65535) return cudaErrorInvalidValue;
  const bool bf16_x = p.algo == GroupedGemmAlgo::kTensorCoreBf16X;
  bool tensor_cores = p.algo == GroupedGemmAlgo::kTensorCore || bf16_x ||
                      (p.algo == GroupedGemmAlgo::kAuto && hint > kCudaCoreMaxRowsPerSlot);
  if (tensor_cores && !TensorCoresAvailable()) {
    if (p.algo != GroupedGemmAlgo::kAuto) return cudaErrorNotSupported;
    tensor_cores = false;
  }
  // Row tiles over the slots: at most one partial tile a non-empty slot beyond max_rows / 128.
  const int64_t row_tiles = (p.max_rows + kTiledRows - 1) / kTiledRows + slot_blocks;
  if (tensor_cores && !x_bf16_in && p.max_rows >= kTiledMinRows && row_tiles <= 65535) {
    const dim3 grid(static_cast<unsigned>((int64_t{p.n} + kTiledFeatures - 1) / kTiledFeatures),
                    static_cast<unsigned>(row_tiles));
    auto launch_tiled = [&](auto kernel) {
      // Every call: the attribute belongs to the current device.
      const cudaError_t attr = cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kTiledSmemBytes);
      if (attr != cudaSuccess) return attr;
      kernel<<<grid, kTiledThreads, kTiledSmemBytes, stream>>>(p);
      return cudaGetLastError();
    };
    return bf16_x ? launch_tiled(GroupedGemmBf16TiledKernel<false>)
                  : launch_tiled(GroupedGemmBf16TiledKernel<true>);
  }
  if (tensor_cores) {
    const dim3 grid(
        static_cast<unsigned>((int64_t{p.n} + kTcFeaturesPerBlock - 1) / kTcFeaturesPerBlock),
        static_cast<unsigned>(slot_blocks));
    auto launch_tc = [&](auto split_x, auto bf16_in) {
      constexpr bool kSplitX = decltype(split_x)::value, kBf16In = decltype(bf16_in)::value;
      if (hint <= 8) {
        GroupedGemmBf16TcKernel<1, kSplitX, kBf16In><<<grid, kTcThreads, 0, stream>>>(p);
      } else if (hint <= 16) {
        GroupedGemmBf16TcKernel<2, kSplitX, kBf16In><<<grid, kTcThreads, 0, stream>>>(p);
      } else {
        GroupedGemmBf16TcKernel<4, kSplitX, kBf16In><<<grid, kTcThreads, 0, stream>>>(p);
      }
    };
    if (x_bf16_in) {
      launch_tc(std::false_type(), std::true_type());
    } else if (bf16_x) {
      launch_tc(std::false_type(), std::false_type());
    } else {
      launch_tc(std::true_type(), std::false_type());
    }
    return cudaGetLastError();
  }
  const int64_t n_tiles = (int64_t{p.n} + kRowsPerBlock - 1) / kRowsPerBlock;
  auto launch = [&](auto kernel) {
    const int64_t wave = ResidentBlocks(kernel, kThreads);
    const int64_t x =
        std::max<int64_t>(1, std::min(n_tiles, wave > 0 ? wave / slot_blocks : n_tiles));
    kernel<<<dim3(static_cast<unsigned>(x), static_cast<unsigned>(slot_blocks)), kThreads, 0,
             stream>>>(p);
  };
  if (hint <= 1) {
    launch(GroupedGemmBf16Kernel<1>);
  } else if (hint <= 2) {
    launch(GroupedGemmBf16Kernel<2>);
  } else if (hint <= 4) {
    launch(GroupedGemmBf16Kernel<4>);
  } else {
    launch(GroupedGemmBf16Kernel<8>);
  }
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace deepinfer
