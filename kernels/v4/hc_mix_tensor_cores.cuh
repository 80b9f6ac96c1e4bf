// HcMixFromStreamsF32's partials on tensor cores (include only from hyper_connection.cu): the 24
// dot products of each flattened row with fn's rows as 3xTF32 mma.sync m16n8k8 (each fp32 operand
// split into a tf32 hi and a tf32 lo = tf32(x - hi); lo·hi + hi·lo + hi·hi summed in fp32
// accumulators: ~22 significant bits a product, the lo·lo term dropped), the row's sum of squares
// by fmaf on the CUDA cores. One block per (kTcRows rows, slice of `slice` floats of the flattened
// row: a chain group of hc_mix_partials.cuh, a fixed length for every row count): 4 warps of 32
// rows (2 m tiles x the 3 n tiles of the 24 products), 3 blocks an SM (168 registers a thread).
// Each 64-float stage's 24 MMAs into an output run into a zeroed accumulator that a
// round-to-nearest fp32 add then adds into the output's sum (the tensor cores' own additions are
// not round-to-nearest: one long chain of MMAs would drift). A lane loads its A fragments straight
// from the streams with the mma's k order permuted to match: of each 32-float chunk, lane (g, q)
// holds floats 8q ... 8q + 7 of rows g, g + 8, g + 16 and g + 24 of its warp (two 16-byte loads a
// row), and mma step s of the chunk's 4 takes its floats 8q + 2s and 8q + 2s + 1 as k = q and
// k = q + 4; each half of the next chunk is loaded into the registers of the current one once
// its MMAs have read them, and each lane prefetches one row of its warp kTcPrefetch stages ahead
// into L2.
// fn's slice is staged kTcStageK floats at a time, split into hi and lo once per block, through two
// shared buffers that the B fragments read in the same permuted order (8-byte reads, no bank
// conflicts). Each block's sums go to the workspace [slices, rows, 25] (the 24 products, then the
// sum of squares: each lane's fmaf chain over its floats, the row's 4 lanes added by shuffles) as
// the fp32 GEMM's groups do. A row's sums depend only on the row, fn and the slice length (the same
// at every row count from kTileMinRows on), not on the rows around it; they differ from the
// CUDA-core kernels' in rounding.
#ifndef DEEPINFER_KERNELS_V4_HC_MIX_TENSOR_CORES_CUH_
#define DEEPINFER_KERNELS_V4_HC_MIX_TENSOR_CORES_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/streaming_load.cuh"
#include "kernels/v4/hc_mix_partials.cuh"

namespace deepinfer {
namespace kernels {
namespace hc_mix {

constexpr int kTcWarps = 4, kTcThreads = 32 * kTcWarps;
constexpr int kTcLaneRows = 4;                      // rows g + 8 i of the warp's 32
constexpr int kTcRows = kTcWarps * 8 * kTcLaneRows;  // 128
constexpr int kTcChunk = 32;                        // floats of a row per load round
constexpr int kTcStageK = 64;                       // fn floats staged per stage
constexpr int kTcPrefetch = 1;                      // stages of a row prefetched into L2 ahead
constexpr int kTcFnPad = kTcStageK + 2;             // 8-byte reads of 16 lanes: no bank conflict
constexpr int kTcFnLoads = kMixes * kTcStageK / 4 / kTcThreads;  // float4s per thread: 3
static_assert(kMixes * kTcStageK / 4 % kTcThreads == 0, "fn stage split over the threads");

struct TcSmem {
  float hi[2][kMixes][kTcFnPad];
  float lo[2][kMixes][kTcFnPad];
};

// x rounded to tf32 (round to nearest, ties away), as its fp32 bit pattern.
__device__ __forceinline__ uint32_t Tf32(float x) {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
#endif
  return r;
}

// c += A (16x8 tf32, fragment a) * B (8x8 tf32, fragment b0, b1), fp32 sums.
__device__ __forceinline__ void MmaTf32(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// A warp's accumulators: 2 m tiles x 3 n tiles x 4 values.
__device__ __forceinline__ void ZeroTiles(float (&x)[2][3][4]) {
#pragma unroll
  for (int m = 0; m < 2; ++m) {
#pragma unroll
    for (int n = 0; n < 3; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[m][n][e] = 0.0f;
    }
  }
}

__device__ __forceinline__ float Component(const float4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Launched plainly (full stream order, no PDL), like HcMixTileKernel. p.slice floats a block
// along the row (a multiple of kTcStageK); grid (row blocks, width / slice). Only launched where
// the device runs sm_80 code.
__global__ void __launch_bounds__(kTcThreads, 3) HcMixTcKernel(PartialsParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  __shared__ __align__(16) TcSmem sm;
  const int t = static_cast<int>(threadIdx.x), lane = t & 31, warp = t >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int64_t r0 = int64_t{blockIdx.x} * kTcRows + warp * 32;
  const int64_t k0 = int64_t{blockIdx.y} * p.slice;
  const int stages = p.slice / kTcStageK, chunks = p.slice / kTcChunk;
  // Lane rows r0 + g + 8 i; rows past the end read the last row and are not written.
  const float* x[kTcLaneRows];
#pragma unroll
  for (int i = 0; i < kTcLaneRows; ++i) {
    const int64_t r = min(r0 + g + 8 * i, p.rows - 1);
    x[i] = p.streams + r * p.width + k0 + 8 * q;
  }
  constexpr uint32_t kStageBytes = kTcStageK * sizeof(float);
  const float* ahead = p.streams + min(r0 + lane, p.rows - 1) * p.width + k0;
  // Thread t stages float4 t + kTcThreads u of the stage's fn block (16 float4s a mix).
  constexpr int kRowQuads = kTcStageK / 4;
  float4 nf[kTcFnLoads];
  auto load_fn = [&](int s) {
#pragma unroll
    for (int u = 0; u < kTcFnLoads; ++u) {
      const int i = t + u * kTcThreads;
      nf[u] = __ldg(reinterpret_cast<const float4*>(p.fn + (i / kRowQuads) * p.width + k0 +
                                                    s * kTcStageK) +
                    i % kRowQuads);
    }
  };
  auto store_fn = [&](int b) {
#pragma unroll
    for (int u = 0; u < kTcFnLoads; ++u) {
      const int i = t + u * kTcThreads;
      float4 hi, lo;
      hi.x = __uint_as_float(Tf32(nf[u].x));
      hi.y = __uint_as_float(Tf32(nf[u].y));
      hi.z = __uint_as_float(Tf32(nf[u].z));
      hi.w = __uint_as_float(Tf32(nf[u].w));
      lo.x = __uint_as_float(Tf32(nf[u].x - hi.x));
      lo.y = __uint_as_float(Tf32(nf[u].y - hi.y));
      lo.z = __uint_as_float(Tf32(nf[u].z - hi.z));
      lo.w = __uint_as_float(Tf32(nf[u].w - hi.w));
      float* h = &sm.hi[b][i / kRowQuads][(i % kRowQuads) * 4];
      float* l = &sm.lo[b][i / kRowQuads][(i % kRowQuads) * 4];
      reinterpret_cast<float2*>(h)[0] = make_float2(hi.x, hi.y);
      reinterpret_cast<float2*>(h)[1] = make_float2(hi.z, hi.w);
      reinterpret_cast<float2*>(l)[0] = make_float2(lo.x, lo.y);
      reinterpret_cast<float2*>(l)[1] = make_float2(lo.z, lo.w);
    }
  };
  // Half j of chunk c of the lane's rows: floats 8q + 4j ... 8q + 4j + 3.
  float4 cur[kTcLaneRows][2];
  auto load_x = [&](int c, int j) {
#pragma unroll
    for (int i = 0; i < kTcLaneRows; ++i) {
      cur[i][j] = LoadStreamingFloat4(reinterpret_cast<const float4*>(x[i] + c * kTcChunk) + j);
    }
  };
  float acc[2][3][4], square[kTcLaneRows];
  ZeroTiles(acc);
#pragma unroll
  for (int i = 0; i < kTcLaneRows; ++i) square[i] = 0.0f;
  load_x(0, 0);
  load_x(0, 1);
  load_fn(0);
  store_fn(0);
  __syncthreads();
  for (int s = 0; s < stages; ++s) {
    const int b = s & 1;
    // The stage's sums (24 MMAs into each), added into acc by round-to-nearest fp32 adds.
    float sub[2][3][4];
    ZeroTiles(sub);
    // The lane's row `lane` of the warp, kTcPrefetch stages ahead, into L2.
    if (s + kTcPrefetch < stages) PrefetchL2(ahead + (s + kTcPrefetch) * kTcStageK, kStageBytes);
#pragma unroll
    for (int h = 0; h < kTcStageK / kTcChunk; ++h) {
      const int c = s * (kTcStageK / kTcChunk) + h;
      if (h == 1 && s + 1 < stages) load_fn(s + 1);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int i = 0; i < kTcLaneRows; ++i) {
          square[i] = fmaf(cur[i][j].x, cur[i][j].x, square[i]);
          square[i] = fmaf(cur[i][j].y, cur[i][j].y, square[i]);
          square[i] = fmaf(cur[i][j].z, cur[i][j].z, square[i]);
          square[i] = fmaf(cur[i][j].w, cur[i][j].w, square[i]);
        }
        // fn floats 8q + 4j ... 8q + 4j + 3 of the chunk, each of the lane's mix g of n tiles.
        const int col = h * kTcChunk + 8 * q + 4 * j;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float2 bh[3], bl[3];
#pragma unroll
          for (int n = 0; n < 3; ++n) {
            bh[n] = *reinterpret_cast<const float2*>(&sm.hi[b][n * 8 + g][col + 2 * e]);
            bl[n] = *reinterpret_cast<const float2*>(&sm.lo[b][n * 8 + g][col + 2 * e]);
          }
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            // a0 (row g, k), a1 (row g + 8, k), a2 (row g, k + 4), a3 (row g + 8, k + 4): k the
            // float 2e of the pair, k + 4 the float 2e + 1.
            const float raw[4] = {Component(cur[2 * m][j], 2 * e),
                                  Component(cur[2 * m + 1][j], 2 * e),
                                  Component(cur[2 * m][j], 2 * e + 1),
                                  Component(cur[2 * m + 1][j], 2 * e + 1)};
            uint32_t ah[4], al[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              ah[r] = Tf32(raw[r]);
              al[r] = Tf32(raw[r] - __uint_as_float(ah[r]));
            }
#pragma unroll
            for (int n = 0; n < 3; ++n) {
              const uint32_t bh0 = __float_as_uint(bh[n].x), bh1 = __float_as_uint(bh[n].y);
              const uint32_t bl0 = __float_as_uint(bl[n].x), bl1 = __float_as_uint(bl[n].y);
              MmaTf32(sub[m][n], al, bh0, bh1);
              MmaTf32(sub[m][n], ah, bl0, bl1);
              MmaTf32(sub[m][n], ah, bh0, bh1);
            }
          }
        }
        // This half of the next chunk, into the registers just used.
        if (c + 1 < chunks) load_x(c + 1, j);
      }
    }
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
      for (int n = 0; n < 3; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[m][n][e] = __fadd_rn(acc[m][n][e], sub[m][n][e]);
      }
    }
    if (s + 1 < stages) store_fn(b ^ 1);
    __syncthreads();
  }
  // The 4 lanes of a row add their squares (lanes q and q ^ 1, then pairs 2 apart).
#pragma unroll
  for (int i = 0; i < kTcLaneRows; ++i) {
    square[i] = __fadd_rn(square[i], __shfl_xor_sync(0xffffffffu, square[i], 1));
    square[i] = __fadd_rn(square[i], __shfl_xor_sync(0xffffffffu, square[i], 2));
  }
  float* out = p.partials + int64_t{blockIdx.y} * p.rows * kStride;
#pragma unroll
  for (int m = 0; m < 2; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t r = r0 + 16 * m + 8 * half + g;
      if (r >= p.rows) continue;
#pragma unroll
      for (int n = 0; n < 3; ++n) {
        out[r * kStride + n * 8 + 2 * q] = acc[m][n][2 * half];
        out[r * kStride + n * 8 + 2 * q + 1] = acc[m][n][2 * half + 1];
      }
      if (q == 0) out[r * kStride + kMixes] = square[2 * m + half];
    }
  }
#endif
}

}  // namespace hc_mix
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_V4_HC_MIX_TENSOR_CORES_CUH_
