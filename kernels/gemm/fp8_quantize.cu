// Activation quantisation to e4m3 per 128-wide block: see fp8_quantize.h. One warp per row (a
// source row when scattered), four 128-wide blocks an iteration, eight lanes a block, sixteen
// contiguous values a lane: 16-byte read-only streaming loads of a (not kept in L1; four for
// fp32, two for bf16, four or eight for SwiGLU's bf16 or fp32 gate and up) and one 16-byte store
// of e4m3 bytes per lane and destination row. A block's sixteen divisions by its scale share one
// reciprocal (DivideByScale). A row's group (its scales' place) is looked up once per warp, a
// scattered row's destinations too (lane j holds destination j), after the warp's first loads of
// the row are issued: up to 287 groups from the offsets held in the warp's registers (one round
// of loads and ballots), else by a binary search. Fewer rows than kTargetWarps (decode): each
// row's iterations split over up to that many warps, so a few long rows still fill the GPU. More
// rows, not scattered, with a block count not a multiple of 4 (Moonlight's 1408 and 2816
// intermediates: 11 and 22): tiles of 4 or 2 rows a warp (QuantizeTileKernel).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <climits>

#include "kernels/common/launch.cuh"
#include "kernels/common/streaming_load.cuh"
#include "kernels/gemm/fp8_quantize.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;
constexpr int64_t kBlock = 128;
constexpr int kValues = 16;               // a lane's values of its block
constexpr int64_t kChunk = 32 * kValues;  // a warp's columns an iteration
constexpr int kMaxDests = 32;             // a lane per destination
constexpr int64_t kTargetWarps = 8192;    // about two waves of the H200's 132 SMs

// Where row `row`'s scales go: block kb's at base + kb * stride. The plain layout, or its group's
// packed one; false for a row past the last group.
__device__ __forceinline__ bool ScalePlace(const Fp8QuantizeParams& p, int64_t row,
                                           int64_t blocks_per_row, int64_t* base, int64_t* stride) {
  if (p.group_offsets == nullptr) {
    *base = row;
    *stride = p.m_pad;
    return true;
  }
  const int32_t* off = p.group_offsets;
  if (row >= __ldg(off + p.num_groups)) return false;
  int lo = 0, hi = p.num_groups - 1;  // the last group starting at or before row holds it
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (__ldg(off + mid) <= row) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int64_t first = __ldg(off + lo), count = __ldg(off + lo + 1) - first;
  *base = first * blocks_per_row + (row - first);
  *stride = count;
  return true;
}

// The group offsets [0, num_groups] in a warp's registers (lane l holds offsets[l + 32 r]) when
// there are few enough groups, so that a row's scale place is one round of loads for the warp
// (issued beside the row's data loads) instead of a binary search's chain of dependent loads.
constexpr int kOffsetRounds = 9;  // up to 287 groups (DeepSeek-V3's 256 experts and shared parts)

struct WarpOffsets {
  int32_t o[kOffsetRounds];
};

__device__ __forceinline__ bool OffsetsFitWarp(const Fp8QuantizeParams& p) {
  return p.num_groups + 1 <= 32 * kOffsetRounds;
}

__device__ __forceinline__ WarpOffsets LoadWarpOffsets(const Fp8QuantizeParams& p, int lane) {
  WarpOffsets w;
#pragma unroll
  for (int r = 0; r < kOffsetRounds; ++r) {
    const int g = lane + 32 * r;
    w.o[r] = g <= p.num_groups ? __ldg(p.group_offsets + g) : INT_MAX;
  }
  return w;
}

// offsets[g] (g warp-uniform, <= num_groups; every lane calls it).
__device__ __forceinline__ int64_t OffsetAt(const WarpOffsets& w, int g) {
  int32_t v = 0;
#pragma unroll
  for (int r = 0; r < kOffsetRounds; ++r) {
    const int32_t s = __shfl_sync(0xFFFFFFFFu, w.o[r], g & 31);
    if ((g >> 5) == r) v = s;
  }
  return v;
}

// ScalePlace for a warp-uniform row (every lane calls it) from the offsets in registers: the
// same place, since for non-decreasing offsets the binary search's group is the number of groups
// starting at or before the row, minus one.
__device__ __forceinline__ bool WarpScalePlace(const Fp8QuantizeParams& p, const WarpOffsets& w,
                                               int lane, int64_t row, int64_t blocks_per_row,
                                               int64_t* base, int64_t* stride) {
  int count = 0;
#pragma unroll
  for (int r = 0; r < kOffsetRounds; ++r) {
    const int g = lane + 32 * r;
    if (32 * r < p.num_groups) {  // uniform
      count += __popc(__ballot_sync(0xFFFFFFFFu, g < p.num_groups && w.o[r] <= row));
    }
  }
  if (row >= OffsetAt(w, p.num_groups)) return false;
  const int g = max(count - 1, 0);
  const int64_t first = OffsetAt(w, g), count_g = OffsetAt(w, g + 1) - first;
  *base = first * blocks_per_row + (row - first);
  *stride = count_g;
  return true;
}

__device__ __forceinline__ void Widen8(uint4 v, float* x) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = __uint_as_float(w[i] << 16);
    x[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

// kernels::SiluMulBf16's and SiluMulF32ToBf16's value: expf (not __expf), the product rounded to
// bf16.
__device__ __forceinline__ float SiluMulRounded(float g, float u) {
  return __bfloat162float(__float2bfloat16_rn(g / (1.0f + expf(-g)) * u));
}

// Where a row's values come from (the params' a_bf16, round_bf16 and silu_mul).
enum class Source { kF32, kF32RoundBf16, kBf16, kSiluMulBf16, kSiluMulF32 };

__device__ __forceinline__ void LoadF32x16(const float* r, float x[kValues]) {
  const float4* r4 = reinterpret_cast<const float4*>(r);
  float4 v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = LoadStreamingFloat4(r4 + i);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[4 * i] = v[i].x;
    x[4 * i + 1] = v[i].y;
    x[4 * i + 2] = v[i].z;
    x[4 * i + 3] = v[i].w;
  }
}

// Values col .. col + 15 of source row `row` (col + 16 <= k).
template <Source kSource>
__device__ __forceinline__ void Load16(const Fp8QuantizeParams& p, int64_t row, int64_t col,
                                       float x[kValues]) {
  if constexpr (kSource == Source::kSiluMulF32) {
    const float* r = static_cast<const float*>(p.a) + row * p.lda;
    float gf[kValues], uf[kValues];
    LoadF32x16(r + col, gf);
    LoadF32x16(r + p.k + col, uf);
#pragma unroll
    for (int i = 0; i < kValues; ++i) x[i] = SiluMulRounded(gf[i], uf[i]);
  } else if constexpr (kSource == Source::kSiluMulBf16) {
    const uint4* g =
        reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.a) + row * p.lda + col);
    const uint4* u =
        reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.a) + row * p.lda + p.k + col);
    const uint4 g0 = LoadStreaming16(g), g1 = LoadStreaming16(g + 1);
    const uint4 u0 = LoadStreaming16(u), u1 = LoadStreaming16(u + 1);
    float gf[kValues], uf[kValues];
    Widen8(g0, gf);
    Widen8(g1, gf + 8);
    Widen8(u0, uf);
    Widen8(u1, uf + 8);
#pragma unroll
    for (int i = 0; i < kValues; ++i) x[i] = SiluMulRounded(gf[i], uf[i]);
  } else if constexpr (kSource == Source::kBf16) {
    const uint4* r =
        reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.a) + row * p.lda + col);
    const uint4 v0 = LoadStreaming16(r), v1 = LoadStreaming16(r + 1);
    Widen8(v0, x);
    Widen8(v1, x + 8);
  } else {
    LoadF32x16(static_cast<const float*>(p.a) + row * p.lda + col, x);
    if constexpr (kSource == Source::kF32RoundBf16) {
#pragma unroll
      for (int i = 0; i < kValues; ++i) x[i] = __bfloat162float(__float2bfloat16_rn(x[i]));
    }
  }
}

// x / s rounded to nearest even, as __fdiv_rn(x, s), from r = 1 / s rounded to nearest even: the
// quotient x * r corrected twice by its exact residual (an FMA). Markstein's theorem: a quotient
// within 1 ulp corrected with the correctly rounded reciprocal is the correctly rounded quotient;
// the first correction brings x * r (within 1.5 ulp) within 1 ulp. Exact residuals need no
// underflow: callers keep s in [kFastScaleMin, kFastScaleMax], where every quotient e4m3 can tell
// apart from zero (|x / s| >= 2^-11) has normal operands and residuals. A zero x keeps its sign.
constexpr float kFastScaleMin = 0x1p-80f, kFastScaleMax = 0x1p100f;

__device__ __forceinline__ float DivideByScale(float x, float s, float r) {
  float q = __fmul_rn(x, r);
  q = __fmaf_rn(__fmaf_rn(-s, q, x), r, q);
  q = __fmaf_rn(__fmaf_rn(-s, q, x), r, q);
  return x == 0.0f ? x : q;
}

__device__ __forceinline__ uint32_t PackE4m3x4(float a, float b, float c, float d) {
  const __nv_fp8x2_storage_t lo =
      __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t hi =
      __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// The eight lanes' 128-wide block (sixteen values a lane; the lanes of a block are 8-aligned in
// the warp, every lane of the warp calls it): its scale (1 for a padding row) and the lane's
// sixteen e4m3 bytes (zeros for a padding row). The sixteen divisions by the scale share one
// reciprocal (DivideByScale) unless the scale is outside its range (an all-zero or tiny block:
// IEEE divisions, the same quotients).
__device__ __forceinline__ float QuantizeBlock(float x[kValues], bool real, uint4* packed) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kValues; ++i) amax = fmaxf(amax, fabsf(x[i]));
#pragma unroll
  for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  const float s = real ? fmaxf(__fdiv_rn(amax, 448.0f), FLT_MIN) : 1.0f;
  uint32_t w[4] = {0, 0, 0, 0};
  if (real) {
    if (s >= kFastScaleMin && s <= kFastScaleMax) {
      const float r = __frcp_rn(s);
#pragma unroll
      for (int i = 0; i < kValues; ++i) x[i] = DivideByScale(x[i], s, r);
    } else {
#pragma unroll
      for (int i = 0; i < kValues; ++i) x[i] = __fdiv_rn(x[i], s);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = PackE4m3x4(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]);
  }
  *packed = make_uint4(w[0], w[1], w[2], w[3]);
  return s;
}

// One warp per (row of q, part): iterations part, part + splits, ... of the row quantised in
// place, scales at the row's place. The first iteration's loads are issued before the row's
// scale place is looked up.
template <Source kSource>
__global__ void __launch_bounds__(kThreads)
    QuantizeKernel(Fp8QuantizeParams p, int64_t blocks_per_row, int64_t splits) {
  // Launched with PDL (Launch below): every thread waits before it reads anything.
  WaitForPrecedingGrids();
  AllowDependentGridsToLaunch();
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int64_t row = warp / splits, part = warp % splits;
  const int lane = threadIdx.x & 31;
  int64_t c0 = part * kChunk;
  if (row >= p.m_pad || c0 >= p.k) return;  // whole warps
  const bool real = row < p.m;
  float x[kValues] = {};
  if (real && c0 + kValues * lane < p.k) Load16<kSource>(p, row, c0 + kValues * lane, x);
  int64_t scale_base, scale_stride;
  if (p.group_offsets != nullptr && OffsetsFitWarp(p)) {
    const WarpOffsets w = LoadWarpOffsets(p, lane);
    if (!WarpScalePlace(p, w, lane, row, blocks_per_row, &scale_base, &scale_stride)) return;
  } else if (!ScalePlace(p, row, blocks_per_row, &scale_base, &scale_stride)) {
    return;
  }
  uint8_t* const q_row = p.q + row * p.ldq;
  for (;;) {
    const int64_t col = c0 + kValues * lane;
    uint4 packed;
    const float s = QuantizeBlock(x, real, &packed);
    if (col < p.k) {
      *reinterpret_cast<uint4*>(q_row + col) = packed;
      if (lane % 8 == 0) p.scales[scale_base + (col / kBlock) * scale_stride] = s;
    }
    c0 += splits * kChunk;
    if (c0 >= p.k) break;
#pragma unroll
    for (int i = 0; i < kValues; ++i) x[i] = 0.0f;
    if (real && c0 + kValues * lane < p.k) Load16<kSource>(p, row, c0 + kValues * lane, x);
  }
}

// Rows in tiles of rows_per_warp (2 or 4) a warp, not split (many rows), where a row's block
// count is not a multiple of 4: the tile's rows_per_warp * blocks_per_row blocks (a multiple of
// 4) in order, four an iteration, so no iteration leaves a lane idle. Lane r < rows_per_warp
// holds row r's scale place; a block's lanes take theirs with a shuffle. Registers capped for
// four blocks an SM (32 warps), QuantizeKernel's occupancy.
constexpr int kTileBlocksPerSm = 4;
template <Source kSource>
__global__ void __launch_bounds__(kThreads, kTileBlocksPerSm)
    QuantizeTileKernel(Fp8QuantizeParams p, int blocks_per_row, int rows_per_warp) {
  // Launched with PDL (Launch below): every thread waits before it reads anything.
  WaitForPrecedingGrids();
  AllowDependentGridsToLaunch();
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int64_t row0 = warp * rows_per_warp;
  const int lane = threadIdx.x & 31;
  if (row0 >= p.m_pad) return;  // whole warps
  int64_t lane_base = 0, lane_stride = 0;
  int lane_found = 0;
  if (lane < rows_per_warp && row0 + lane < p.m_pad) {
    lane_found = ScalePlace(p, row0 + lane, blocks_per_row, &lane_base, &lane_stride) ? 1 : 0;
  }
  const int group = lane / 8, sub = lane % 8;
  const int tasks = rows_per_warp * blocks_per_row;
  for (int t0 = 0; t0 < tasks; t0 += 4) {
    const int t = t0 + group;
    const int r = (t >= blocks_per_row) + (t >= 2 * blocks_per_row) + (t >= 3 * blocks_per_row);
    const int kb = t - r * blocks_per_row;
    const int64_t row = row0 + r;
    const int64_t base = __shfl_sync(0xFFFFFFFFu, lane_base, r);
    const int64_t stride = __shfl_sync(0xFFFFFFFFu, lane_stride, r);
    const bool found = __shfl_sync(0xFFFFFFFFu, lane_found, r) != 0;
    const bool real = found && row < p.m;
    const int64_t col = static_cast<int64_t>(kb) * kBlock + kValues * sub;
    float x[kValues] = {};
    if (real && col < p.k) Load16<kSource>(p, row, col, x);
    uint4 packed;
    const float s = QuantizeBlock(x, real, &packed);
    if (found && col < p.k) {
      *reinterpret_cast<uint4*>(p.q + row * p.ldq + col) = packed;
      if (sub == 0) p.scales[base + kb * stride] = s;
    }
  }
}

// One warp per (source row, part): each of the part's blocks quantised once, written to each of
// the row's destination rows (lane j < dests_per_row holds destination j's row and scale place).
// The first iteration's loads are issued before the destinations' scale places are looked up.
template <Source kSource>
__global__ void __launch_bounds__(kThreads)
    QuantizeScatterKernel(Fp8QuantizeParams p, int64_t blocks_per_row, int64_t splits) {
  // Launched with PDL (Launch below): every thread waits before it reads anything.
  WaitForPrecedingGrids();
  AllowDependentGridsToLaunch();
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int64_t row = warp / splits, part = warp % splits;
  const int lane = threadIdx.x & 31;
  int64_t c0 = part * kChunk;
  if (row >= p.m || c0 >= p.k) return;  // whole warps
  const int dests = p.dests_per_row;
  int64_t dest = lane < dests ? __ldg(p.dest_rows + row * dests + lane) : -1;
  float x[kValues] = {};
  if (c0 + kValues * lane < p.k) Load16<kSource>(p, row, c0 + kValues * lane, x);
  int64_t scale_base = 0, scale_stride = 0;
  if (OffsetsFitWarp(p)) {
    const WarpOffsets w = LoadWarpOffsets(p, lane);
    for (int j = 0; j < dests; ++j) {
      const int64_t d = __shfl_sync(0xFFFFFFFFu, dest, j);
      if (d < 0) continue;  // warp-uniform
      int64_t base, stride;
      const bool placed = WarpScalePlace(p, w, lane, d, blocks_per_row, &base, &stride);
      if (lane == j) {
        dest = placed ? d : -1;
        scale_base = base;
        scale_stride = stride;
      }
    }
  } else if (dest >= 0 && !ScalePlace(p, dest, blocks_per_row, &scale_base, &scale_stride)) {
    dest = -1;
  }
  for (;;) {
    const int64_t col = c0 + kValues * lane;
    uint4 packed;
    const float s = QuantizeBlock(x, true, &packed);
    const int64_t kb = col / kBlock;
    for (int j = 0; j < dests; ++j) {
      const int64_t d = __shfl_sync(0xFFFFFFFFu, dest, j);
      const int64_t base = __shfl_sync(0xFFFFFFFFu, scale_base, j);
      const int64_t stride = __shfl_sync(0xFFFFFFFFu, scale_stride, j);
      if (d < 0 || col >= p.k) continue;
      *reinterpret_cast<uint4*>(p.q + d * p.ldq + col) = packed;
      if (lane % 8 == 0) p.scales[base + kb * stride] = s;
    }
    c0 += splits * kChunk;
    if (c0 >= p.k) break;
#pragma unroll
    for (int i = 0; i < kValues; ++i) x[i] = 0.0f;
    if (c0 + kValues * lane < p.k) Load16<kSource>(p, row, c0 + kValues * lane, x);
  }
}

// rows_per_warp > 1: QuantizeTileKernel (not scattered, splits 1). Each kernel is launched with
// programmatic dependent launch (kernels/common/launch.cuh): its launch overlaps the end of the
// kernel before it, and the kernel after it (the swap-AB expert GEMM) may launch once its blocks
// have passed their wait.
template <Source kSource>
cudaError_t Launch(const Fp8QuantizeParams& q, int64_t blocks_per_row, int64_t splits,
                   int rows_per_warp, unsigned grid, cudaStream_t stream) {
  if (q.dest_rows != nullptr) {
    return LaunchKernelThatWaits(QuantizeScatterKernel<kSource>, dim3(grid), kThreads, 0, stream,
                                 /*programmatic=*/true, q, blocks_per_row, splits);
  }
  if (rows_per_warp > 1) {
    return LaunchKernelThatWaits(QuantizeTileKernel<kSource>, dim3(grid), kThreads, 0, stream,
                                 /*programmatic=*/true, q, static_cast<int>(blocks_per_row),
                                 rows_per_warp);
  }
  return LaunchKernelThatWaits(QuantizeKernel<kSource>, dim3(grid), kThreads, 0, stream,
                               /*programmatic=*/true, q, blocks_per_row, splits);
}

__global__ void AddRowsKernel(int64_t m, int64_t n, const float* d, int64_t ldd, float* c,
                              int64_t ldc, bool accumulate) {
  const int64_t total = m * n;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / n, j = e % n;
    const float v = d[i * ldd + j];
    float* out = c + i * ldc + j;
    *out = accumulate ? *out + v : v;
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t Fp8QuantizeRows(const Fp8QuantizeParams& p, cudaStream_t stream) {
  const int64_t a_elem = p.a_bf16 ? 2 : 4;
  const int64_t a_width = p.silu_mul ? 2 * p.k : p.k;
  if (p.m < 0 || p.k < 1 || p.k % 16 != 0 || p.m_pad < p.m || p.lda < a_width ||
      (p.lda * a_elem) % 16 != 0 || p.ldq < p.k || p.ldq % 16 != 0 || p.q == nullptr ||
      p.scales == nullptr || !Aligned16(p.q) || (p.m > 0 && (p.a == nullptr || !Aligned16(p.a))) ||
      (p.group_offsets != nullptr && p.num_groups < 1) ||
      (p.round_bf16 && (p.a_bf16 || p.silu_mul)) ||
      (p.dest_rows != nullptr &&
       (p.group_offsets == nullptr || p.dests_per_row < 1 || p.dests_per_row > kMaxDests))) {
    return cudaErrorInvalidValue;
  }
  Fp8QuantizeParams q = p;
  if (q.group_offsets != nullptr) q.m_pad = q.m;  // only the groups' rows
  // Scattered: warps per source row; otherwise per row of q.
  const int64_t launch_rows = q.dest_rows != nullptr ? q.m : q.m_pad;
  if (launch_rows == 0) return cudaSuccess;
  const int64_t blocks_per_row = (p.k + kBlock - 1) / kBlock;
  const int64_t chunks = (p.k + kChunk - 1) / kChunk;
  const int64_t splits =
      std::min(chunks, std::max<int64_t>(1, (kTargetWarps + launch_rows - 1) / launch_rows));
  // Many rows (prefill), whole rows a warp, a block count not a multiple of 4: tiles of 2 or 4
  // rows a warp, a multiple of 4 blocks (QuantizeTileKernel). Decode's few rows keep one a warp.
  int rows_per_warp = 1;
  if (q.dest_rows == nullptr && launch_rows >= kTargetWarps && splits == 1 &&
      blocks_per_row % 4 != 0 && blocks_per_row < (int64_t{1} << 28)) {
    rows_per_warp = blocks_per_row % 2 != 0 ? 4 : 2;
  }
  const int64_t warps =
      rows_per_warp > 1 ? (launch_rows + rows_per_warp - 1) / rows_per_warp : launch_rows * splits;
  const int64_t grid = (warps + kRowsPerBlock - 1) / kRowsPerBlock;
  if (grid > 0x7FFFFFFF) return cudaErrorInvalidValue;
  const unsigned g = static_cast<unsigned>(grid);
  if (q.silu_mul && q.a_bf16) {
    return Launch<Source::kSiluMulBf16>(q, blocks_per_row, splits, rows_per_warp, g, stream);
  }
  if (q.silu_mul) {
    return Launch<Source::kSiluMulF32>(q, blocks_per_row, splits, rows_per_warp, g, stream);
  }
  if (q.a_bf16) return Launch<Source::kBf16>(q, blocks_per_row, splits, rows_per_warp, g, stream);
  if (q.round_bf16) {
    return Launch<Source::kF32RoundBf16>(q, blocks_per_row, splits, rows_per_warp, g, stream);
  }
  return Launch<Source::kF32>(q, blocks_per_row, splits, rows_per_warp, g, stream);
}

cudaError_t AddRowsF32(int64_t m, int64_t n, const float* d, int64_t ldd, float* c, int64_t ldc,
                       bool accumulate, cudaStream_t stream) {
  if (m < 0 || n < 0 || ldd < n || ldc < n) return cudaErrorInvalidValue;
  if (m == 0 || n == 0) return cudaSuccess;
  if (d == nullptr || c == nullptr) return cudaErrorInvalidValue;
  const int64_t blocks = std::min<int64_t>((m * n + kThreads - 1) / kThreads, 4096);
  AddRowsKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(m, n, d, ldd, c, ldc,
                                                                        accumulate);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace deepinfer
