// HcMixFromStreamsF32's first launch on the CUDA cores (include only from hyper_connection.cu;
// the tensor-core kernel from 2048 rows is hc_mix_tensor_cores.cuh): for 4 streams the 24 dot
// products of each flattened row with fn's rows and the row's sum of squares (25 "mixes",
// the last with the row itself in place of fn), in one fixed order for every row count, so a
// row's results do not depend on the batch around it:
//   - a chain is one (row, mix) over one slice of `chain` consecutive floats of the flattened
//     row (512, or 128 where 512 does not divide the width): fmaf from 0, in the slice's order;
//   - a group is `group` consecutive chains (4 where they divide the chain count, else 1),
//     added in order from 0 with __fadd_rn;
//   - the row kernel adds the groups in order from 0 (RowMixes).
// Three kernels compute this order:
//   - HcMixChainsBody (up to kChainRows rows): one block per (tile of up to kChainRows rows,
//     chain slice, fifth of the mixes): the block stages the slice of its 5 rows of fn
//     (prefetched into registers before the PDL wait: fn is a weight) and of its rows in shared
//     memory, then one thread per (row, mix) runs the chain; each chain to the workspace
//     [chains, rows, 25], which the row kernel adds in groups. A decode row's fn read is spread
//     over chains x 5 blocks.
//   - HcMixPairsBody (more rows, fewer than kTileMinRows): one block per (tile of kPairRows
//     rows, chain slice) over all 25 sums, a thread 2 rows x 2 sums (fn read once per tile of
//     rows rather than of kChainRows rows and fifth); the same workspace.
//   - HcMixTileKernel (kTileMinRows rows and more): a register-tiled fp32 GEMM, one block per
//     (256 rows, group): 8 warps of 32 rows, a lane 4 rows (8 apart) x 6 of the 24 dot products
//     (lanes 8 o ... 8 o + 7 take products 6 o ... 6 o + 5) plus the sum of squares of the
//     o-th of its rows, so a lane's 4 loads of its rows, 6 of fn and 1 of that row from shared
//     memory (16 bytes each; 8, 4 and 32 distinct addresses a warp) feed 100 FFMAs. The rows and fn
//     are staged kTileK floats at a time through two shared buffers (the next stage loaded to
//     registers during the current one's FFMAs); chains fold into the group's sums in registers
//     and each group's sums go to the workspace [groups, rows, 25]. From kTileMinRows rows
//     hyper_connection.cu takes it only with HcMixGemm::kFp32 or where the device has no sm_80
//     code; otherwise HcMixTcKernel (hc_mix_tensor_cores.cuh), in another order.
#ifndef DEEPINFER_KERNELS_V4_HC_MIX_PARTIALS_CUH_
#define DEEPINFER_KERNELS_V4_HC_MIX_PARTIALS_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {
namespace hc_mix {

constexpr int kMixes = 24, kStride = kMixes + 1;  // the dot products, then the sum of squares
constexpr int kMaxChain = 512;

// Floats of the flattened row per chain.
inline int64_t ChainLength(int64_t width) { return width % kMaxChain == 0 ? kMaxChain : 128; }
// Chains per group (RowMixes takes 1 or 4).
inline int64_t ChainGroup(int64_t chains) { return chains % 4 == 0 ? 4 : 1; }

// From this many rows HcMixTileKernel computes the partials.
constexpr int64_t kTileMinRows = 2048;

struct PartialsParams {
  int64_t rows = 0, width = 0;
  int chain = 0;      // floats per chain
  int group = 0;      // chains per group (HcMixTileKernel)
  int tile_rows = 0;  // rows per block (HcMixChainsBody)
  int slice = 0;      // floats per block along the row (HcMixTcKernel)
  const float* streams = nullptr;
  const float* fn = nullptr;
  float* partials = nullptr;
};

__device__ __forceinline__ float Dot4(float acc, float4 a, float4 b) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

// HcMixChainsBody: block (row tile, chain, fifth) of kChainThreads.
constexpr int kChainThreads = 128, kChainRows = 8, kFifths = 5, kFifthMixes = kStride / kFifths;
constexpr int kChainPad = kMaxChain + 4;  // a staged row's floats (16-byte rows 4 banks apart)
constexpr int kFnPerThread = kFifthMixes * kMaxChain / 4 / kChainThreads;

struct FnSlice {
  float4 v[kFnPerThread];
};

// This block's fn rows (mixes 5 z ... 5 z + 4 below 24) over its chain, float4 i of the slice at
// thread i % kChainThreads, register i / kChainThreads.
__device__ FnSlice HcMixChainsPrefetch(PartialsParams p) {
  FnSlice s;
  const int quads = p.chain / 4;
  const int64_t k0 = int64_t{blockIdx.y} * p.chain;
#pragma unroll
  for (int u = 0; u < kFnPerThread; ++u) {
    const int i = static_cast<int>(threadIdx.x) + u * kChainThreads;
    const int m = static_cast<int>(blockIdx.z) * kFifthMixes + i / quads;
    s.v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < kFifthMixes * quads && m < kMixes) {
      s.v[u] = __ldg(reinterpret_cast<const float4*>(p.fn + m * p.width + k0) + i % quads);
    }
  }
  return s;
}

__device__ void HcMixChainsBody(const FnSlice& s, PartialsParams p) {
  __shared__ __align__(16) float fn[kFifthMixes][kChainPad];
  __shared__ __align__(16) float x[kChainRows][kChainPad];
  const int quads = p.chain / 4, t = static_cast<int>(threadIdx.x);
  const int64_t r0 = int64_t{blockIdx.x} * p.tile_rows;
  const int64_t k0 = int64_t{blockIdx.y} * p.chain;
#pragma unroll
  for (int u = 0; u < kFnPerThread; ++u) {
    const int i = t + u * kChainThreads;
    if (i < kFifthMixes * quads) reinterpret_cast<float4*>(&fn[i / quads][0])[i % quads] = s.v[u];
  }
  // Rows past the end stage the tile's first row and are not written.
  for (int i = t; i < p.tile_rows * quads; i += kChainThreads) {
    const int64_t r = r0 + i / quads < p.rows ? r0 + i / quads : r0;
    reinterpret_cast<float4*>(&x[i / quads][0])[i % quads] =
        *(reinterpret_cast<const float4*>(p.streams + r * p.width + k0) + i % quads);
  }
  __syncthreads();
  if (t >= p.tile_rows * kFifthMixes) return;
  const int row = t % p.tile_rows, j = t / p.tile_rows;
  const int m = static_cast<int>(blockIdx.z) * kFifthMixes + j;
  const float4* a = reinterpret_cast<const float4*>(&x[row][0]);
  const float4* f = reinterpret_cast<const float4*>(m == kMixes ? &x[row][0] : &fn[j][0]);
  float acc = 0.0f;
#pragma unroll 8
  for (int q = 0; q < quads; ++q) acc = Dot4(acc, a[q], f[q]);
  if (r0 + row < p.rows) p.partials[(int64_t{blockIdx.y} * p.rows + r0 + row) * kStride + m] = acc;
}

// HcMixPairsBody: block (tile of kPairRows rows, chain) of kChainThreads over all 25 sums, the
// chain staged kPairK floats at a time (the next part loaded to registers during the current
// one's FFMAs; fn's first part before the PDL wait). Thread t < 96 takes rows t % 8 and t % 8 + 8
// of the tile x products 2 (t / 8) and 2 (t / 8) + 1, threads 96 ... 103 rows t % 8 and t % 8 + 8's
// sums of squares: a lane's 2 loads of the rows (8 distinct a warp) and 2 of fn (4 distinct) from
// shared memory feed 16 FFMAs.
constexpr int kPairRows = 16, kPairK = 128, kPairPad = kPairK + 4;
constexpr int kPairRowLoads = kPairRows * kPairK / 4 / kChainThreads;  // 4
constexpr int kPairFnLoads = kMixes * kPairK / 4 / kChainThreads;      // 6

struct FnPart {
  float4 v[kPairFnLoads];
};

// fn's floats k ... k + kPairK - 1 of every dot product, float4 i at thread i % kChainThreads,
// register i / kChainThreads.
__device__ __forceinline__ FnPart LoadFnPart(const PartialsParams& p, int64_t k) {
  constexpr int kQuads = kPairK / 4;
  FnPart f;
#pragma unroll
  for (int u = 0; u < kPairFnLoads; ++u) {
    const int i = static_cast<int>(threadIdx.x) + u * kChainThreads;
    f.v[u] = __ldg(reinterpret_cast<const float4*>(p.fn + (i / kQuads) * p.width + k) + i % kQuads);
  }
  return f;
}

// The chain's first part of fn, before the PDL wait (fn is a weight).
__device__ FnPart HcMixPairsPrefetch(PartialsParams p) {
  return LoadFnPart(p, int64_t{blockIdx.y} * p.chain);
}

__device__ void HcMixPairsBody(const FnPart& first, PartialsParams p) {
  __shared__ __align__(16) float x[kPairRows][kPairPad];
  __shared__ __align__(16) float fn[kMixes][kPairPad];
  const int t = static_cast<int>(threadIdx.x), rp = t % 8, mp = t / 8;
  const int64_t r0 = int64_t{blockIdx.x} * kPairRows;
  const int64_t k0 = int64_t{blockIdx.y} * p.chain;
  constexpr int kQuads = kPairK / 4;
  float4 nx[kPairRowLoads];
  FnPart nf = first;
  auto load = [&](int part, bool with_fn) {
    const int64_t k = k0 + int64_t{part} * kPairK;
#pragma unroll
    for (int u = 0; u < kPairRowLoads; ++u) {
      const int i = t + u * kChainThreads;
      // Rows past the end read the last row and are not written.
      const int64_t r = min(r0 + i / kQuads, p.rows - 1);
      nx[u] = *(reinterpret_cast<const float4*>(p.streams + r * p.width + k) + i % kQuads);
    }
    if (with_fn) nf = LoadFnPart(p, k);
  };
  auto store = [&] {
#pragma unroll
    for (int u = 0; u < kPairRowLoads; ++u) {
      const int i = t + u * kChainThreads;
      reinterpret_cast<float4*>(&x[i / kQuads][0])[i % kQuads] = nx[u];
    }
#pragma unroll
    for (int u = 0; u < kPairFnLoads; ++u) {
      const int i = t + u * kChainThreads;
      reinterpret_cast<float4*>(&fn[i / kQuads][0])[i % kQuads] = nf.v[u];
    }
  };
  float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
  const int parts = p.chain / kPairK;
  load(0, false);
  for (int part = 0; part < parts; ++part) {
    store();
    __syncthreads();
    if (part + 1 < parts) load(part + 1, true);
    if (mp < kMixes / 2) {
#pragma unroll 4
      for (int q = 0; q < kPairK; q += 4) {
        const float4 a0 = *reinterpret_cast<const float4*>(&x[rp][q]);
        const float4 a1 = *reinterpret_cast<const float4*>(&x[rp + 8][q]);
        const float4 f0 = *reinterpret_cast<const float4*>(&fn[2 * mp][q]);
        const float4 f1 = *reinterpret_cast<const float4*>(&fn[2 * mp + 1][q]);
        acc[0][0] = Dot4(acc[0][0], a0, f0);
        acc[0][1] = Dot4(acc[0][1], a0, f1);
        acc[1][0] = Dot4(acc[1][0], a1, f0);
        acc[1][1] = Dot4(acc[1][1], a1, f1);
      }
    } else if (mp == kMixes / 2) {
#pragma unroll 4
      for (int q = 0; q < kPairK; q += 4) {
        const float4 a0 = *reinterpret_cast<const float4*>(&x[rp][q]);
        const float4 a1 = *reinterpret_cast<const float4*>(&x[rp + 8][q]);
        acc[0][0] = Dot4(acc[0][0], a0, a0);
        acc[1][0] = Dot4(acc[1][0], a1, a1);
      }
    }
    __syncthreads();
  }
  if (mp > kMixes / 2) return;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t r = r0 + rp + 8 * i;
    if (r >= p.rows) continue;
    float* q = p.partials + (int64_t{blockIdx.y} * p.rows + r) * kStride + 2 * mp;
    q[0] = acc[i][0];
    if (mp < kMixes / 2) q[1] = acc[i][1];
  }
}

// HcMixTileKernel: block (256 rows, group) of kTileThreads.
constexpr int kTileThreads = 256, kTileK = 16, kTilePad = kTileK + 4;
constexpr int kLaneRows = 4, kLaneMixes = 6;
constexpr int kTileRows = (kTileThreads / 32) * 8 * kLaneRows;    // 256
constexpr int kRowLoads = kTileRows * kTileK / 4 / kTileThreads;  // float4s per thread and stage

struct TileSmem {
  float x[2][kTileRows][kTilePad];
  float fn[2][kMixes][kTilePad];
};

// Launched plainly (full stream order, no PDL) so that its launch bounds can ask for 2 blocks an
// SM (at most 128 registers a thread).
__global__ void __launch_bounds__(kTileThreads, 2) HcMixTileKernel(PartialsParams p) {
  __shared__ __align__(16) TileSmem sm;
  const int t = static_cast<int>(threadIdx.x), lane = t & 31, warp = t >> 5;
  const int rg = lane & 7, og = lane >> 3;
  const int64_t r0 = int64_t{blockIdx.x} * kTileRows;
  const int64_t k0 = int64_t{blockIdx.y} * p.group * p.chain;
  const int stages = p.group * p.chain / kTileK, chain_stages = p.chain / kTileK;
  // Thread t stages float4 t + kTileThreads u of the rows (row t / 4 + 64 u) and, below 96,
  // float4 t of fn (row t / 4): 4 float4s per staged row.
  const float* xs = p.streams + k0 + (t % 4) * 4;
  const bool loads_fn = t < kMixes * kTileK / 4;
  const float* fs = p.fn + (loads_fn ? t / 4 : 0) * p.width + k0 + (t % 4) * 4;
  float4 nx[kRowLoads], nf = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  auto load = [&](int s) {
#pragma unroll
    for (int u = 0; u < kRowLoads; ++u) {
      // Rows past the end read the last row and are not written.
      const int64_t r = min(r0 + t / 4 + u * (kTileThreads / 4), p.rows - 1);
      nx[u] = *reinterpret_cast<const float4*>(xs + r * p.width + s * kTileK);
    }
    if (loads_fn) nf = __ldg(reinterpret_cast<const float4*>(fs + s * kTileK));
  };
  auto store = [&](int b) {
#pragma unroll
    for (int u = 0; u < kRowLoads; ++u) {
      const int i = t + u * kTileThreads;
      *reinterpret_cast<float4*>(&sm.x[b][i / 4][(i % 4) * 4]) = nx[u];
    }
    if (loads_fn) *reinterpret_cast<float4*>(&sm.fn[b][t / 4][(t % 4) * 4]) = nf;
  };
  float chain[kLaneRows][kLaneMixes], sum[kLaneRows][kLaneMixes], square = 0.0f, squares = 0.0f;
#pragma unroll
  for (int i = 0; i < kLaneRows; ++i) {
#pragma unroll
    for (int j = 0; j < kLaneMixes; ++j) chain[i][j] = 0.0f, sum[i][j] = 0.0f;
  }
  load(0);
  store(0);
  __syncthreads();
  const int base_row = warp * 8 * kLaneRows + rg;  // the lane's rows: base_row + 8 i
  const int square_row = base_row + 8 * og;        // the row whose sum of squares it takes
  for (int s = 0; s < stages; ++s) {
    const int b = s & 1;
    if (s + 1 < stages) load(s + 1);
#pragma unroll 1
    for (int kq = 0; kq < kTileK; kq += 4) {
      float4 a[kLaneRows];
#pragma unroll
      for (int i = 0; i < kLaneRows; ++i)
        a[i] = *reinterpret_cast<const float4*>(&sm.x[b][base_row + 8 * i][kq]);
#pragma unroll
      for (int j = 0; j < kLaneMixes; ++j) {
        const float4 f = *reinterpret_cast<const float4*>(&sm.fn[b][og * kLaneMixes + j][kq]);
#pragma unroll
        for (int i = 0; i < kLaneRows; ++i) chain[i][j] = Dot4(chain[i][j], a[i], f);
      }
      const float4 own = *reinterpret_cast<const float4*>(&sm.x[b][square_row][kq]);
      square = Dot4(square, own, own);
    }
    if ((s + 1) % chain_stages == 0) {
#pragma unroll
      for (int i = 0; i < kLaneRows; ++i) {
#pragma unroll
        for (int j = 0; j < kLaneMixes; ++j) {
          sum[i][j] = __fadd_rn(sum[i][j], chain[i][j]);
          chain[i][j] = 0.0f;
        }
      }
      squares = __fadd_rn(squares, square);
      square = 0.0f;
    }
    if (s + 1 < stages) store(b ^ 1);
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kLaneRows; ++i) {
    const int64_t r = r0 + base_row + 8 * i;
    if (r >= p.rows) continue;
    float* q = p.partials + (int64_t{blockIdx.y} * p.rows + r) * kStride;
#pragma unroll
    for (int j = 0; j < kLaneMixes; ++j) q[og * kLaneMixes + j] = sum[i][j];
  }
  if (r0 + square_row < p.rows)
    p.partials[(int64_t{blockIdx.y} * p.rows + r0 + square_row) * kStride + kMixes] = squares;
}

}  // namespace hc_mix
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_V4_HC_MIX_PARTIALS_CUH_
