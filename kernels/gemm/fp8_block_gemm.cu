// FP8 block-scaled weight GEMMs: see fp8_block_gemm.h.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>

#include "kernels/common/launch.cuh"
#include "kernels/common/streaming_load.cuh"
#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/gemm/fp8_block_gemm_vec.h"
#include "kernels/gemm/fp8_widen.cuh"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kLaneElems = 16;              // one 16-byte load of FP8 weights per lane
constexpr int kWarpSpan = 32 * kLaneElems;  // weights a warp reads per step
// Blocks a launch should have before the small-m kernel splits rows over warps: two per SM of
// the H200 (132 SMs), so that short matrices (kv_a: 576 rows) still keep every SM streaming.
constexpr int64_t kTargetBlocks = 264;
constexpr int64_t kIntMax = std::numeric_limits<int>::max();

// bf16 rounding (nearest even) of x, as a float; NaN stays NaN.
__device__ __forceinline__ float RoundToBf16(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7F800000u) == 0x7F800000u) {
    if ((u & 0x007FFFFFu) != 0) u |= 0x00400000u;  // quiet NaN survives the truncation
    return __uint_as_float(u & 0xFFFF0000u);
  }
  u += 0x7FFFu + ((u >> 16) & 1u);
  return __uint_as_float(u & 0xFFFF0000u);
}

__device__ __forceinline__ uint16_t Bf16Bits(float x) {
  return static_cast<uint16_t>(__float_as_uint(RoundToBf16(x)) >> 16);
}

__device__ __forceinline__ float Bf16ToFloat(uint32_t bits) { return __uint_as_float(bits << 16); }

__device__ __forceinline__ float Fp8ToFloat(uint8_t b) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
  return __half2float(__half(h));
}

// 16 activations of row `row` from column col, rounded to bf16 (vector path: 16-byte aligned).
template <bool kBf16A>
__device__ __forceinline__ void LoadAct16(const void* a, int64_t lda, int64_t row, int64_t col,
                                          float* x) {
  if constexpr (kBf16A) {
    const uint4* p =
        reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a) + row * lda + col);
    const uint4 v0 = __ldg(p), v1 = __ldg(p + 1);
    const uint32_t words[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      x[2 * q] = Bf16ToFloat(words[q] & 0xFFFFu);
      x[2 * q + 1] = Bf16ToFloat(words[q] >> 16);
    }
  } else {
    const float4* p =
        reinterpret_cast<const float4*>(static_cast<const float*>(a) + row * lda + col);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 v = __ldg(p + q);
      x[4 * q] = RoundToBf16(v.x);
      x[4 * q + 1] = RoundToBf16(v.y);
      x[4 * q + 2] = RoundToBf16(v.z);
      x[4 * q + 3] = RoundToBf16(v.w);
    }
  }
}

template <bool kBf16A>
__device__ __forceinline__ float LoadAct1(const void* a, int64_t lda, int64_t row, int64_t col) {
  if constexpr (kBf16A) {
    return Bf16ToFloat(static_cast<const uint16_t*>(a)[row * lda + col]);
  } else {
    return RoundToBf16(static_cast<const float*>(a)[row * lda + col]);
  }
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

// acc[i] += the products of weight row wrow (scale row srow) with activation rows row0 + i,
// i < rows (<= M), over this lane's share of k: chunks of 16 from first_chunk, every `stride`.
template <int M, bool kBf16A, bool kVec>
__device__ __forceinline__ void DotRows(const uint8_t* wrow, const float* srow, const void* a,
                                        int64_t lda, int64_t row0, int rows, int64_t k,
                                        int64_t lane_first, int64_t lane_stride, float* acc) {
  if constexpr (kVec) {
    for (int64_t q = lane_first * kLaneElems; q < k; q += lane_stride * kLaneElems) {
      float w[kLaneElems];
      DecodeFp8x16(LoadStreaming16(wrow + q), w);
      const float s = __ldg(srow + q / kFp8BlockSize);
#pragma unroll
      for (int i = 0; i < M; ++i) {
        if (i < rows) {
          float x[kLaneElems];
          LoadAct16<kBf16A>(a, lda, row0 + i, q, x);
          float sum = 0.0f;
#pragma unroll
          for (int e = 0; e < kLaneElems; ++e) sum = fmaf(x[e], w[e], sum);
          acc[i] = fmaf(sum, s, acc[i]);
        }
      }
    }
  } else {
    for (int64_t q = lane_first; q < k; q += lane_stride) {
      const float w = Fp8ToFloat(wrow[q]);
      const float s = __ldg(srow + q / kFp8BlockSize);
#pragma unroll
      for (int i = 0; i < M; ++i) {
        if (i < rows) acc[i] = fmaf(LoadAct1<kBf16A>(a, lda, row0 + i, q) * w, s, acc[i]);
      }
    }
  }
}

// One output column j per group of `ksplit` warps (the row's k chunks split over them, their
// partial sums added in warp order through shared memory: deterministic).
template <int M, bool kBf16A, bool kVec>
__global__ void __launch_bounds__(kThreads)
    Fp8SmallMKernel(Fp8SmallMGemmParams p, int64_t row0, int rows, int ksplit) {
  __shared__ float partial[kWarps][M];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int cols_per_block = kWarps / ksplit;
  const int col_in_block = warp / ksplit, part = warp % ksplit;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * cols_per_block + col_in_block;
  float acc[M];
#pragma unroll
  for (int i = 0; i < M; ++i) acc[i] = 0.0f;
  if (j < p.n) {
    const uint8_t* wrow = p.w.data + j * p.w.ldw;
    const float* srow = p.w.scales + Fp8ScaleRow(j, p.w.split_rows) * p.w.scale_ld;
    DotRows<M, kBf16A, kVec>(wrow, srow, p.a, p.lda, row0, rows, p.k,
                             static_cast<int64_t>(part) * 32 + lane,
                             static_cast<int64_t>(ksplit) * 32, acc);
  }
#pragma unroll
  for (int i = 0; i < M; ++i) acc[i] = WarpSum(acc[i]);
  if (ksplit > 1) {
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < M; ++i) partial[warp][i] = acc[i];
    }
    __syncthreads();
    if (lane == 0 && part == 0) {
#pragma unroll
      for (int i = 0; i < M; ++i) {
        float s = partial[warp][i];
        for (int w = 1; w < ksplit; ++w) s += partial[warp + w][i];
        acc[i] = s;
      }
    }
  }
  if (lane != 0 || part != 0 || j >= p.n) return;
#pragma unroll
  for (int i = 0; i < M; ++i) {
    if (i < rows) {
      float* c = p.c + (row0 + i) * p.ldc + j;
      *c = p.accumulate ? *c + acc[i] : acc[i];
    }
  }
}

// Block (x, y): output columns x * kWarps .. + kWarps - 1 (one warp each) of one group: group y
// when the grid has a block row per group, else the group whose first row is y (rows that are
// not a group's first leave their block idle), so a decode step with few busy experts launches
// few blocks.
template <bool kVec>
__global__ void __launch_bounds__(kThreads) Fp8GroupedKernel(Fp8GroupedGemmParams p) {
  int g;
  int64_t r0, r1;
  if (static_cast<int>(gridDim.y) == p.num_groups) {
    g = blockIdx.y;
    r0 = p.offsets[g];
    r1 = p.offsets[g + 1];
  } else {
    const int y = blockIdx.y;
    if (y >= p.offsets[p.num_groups]) return;
    int lo = 0, hi = p.num_groups - 1;  // the last group starting at or before y holds it
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (p.offsets[mid] <= y) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    g = lo;
    r0 = p.offsets[g];
    if (r0 != y) return;
    r1 = p.offsets[g + 1];
  }
  r1 = min(r1, static_cast<int64_t>(p.max_rows));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (j >= p.n || r0 >= r1) return;
  const uint8_t* wrow = p.weights[g] + j * p.k;
  const float* srow = p.scales[g] + Fp8ScaleRow(j, p.split_rows) * p.scale_ld;
  constexpr int M = kFp8SmallMGemmRowsPerLaunch;
  for (int64_t rb = r0; rb < r1; rb += M) {
    const int rows = static_cast<int>(min(static_cast<int64_t>(M), r1 - rb));
    float acc[M];
#pragma unroll
    for (int i = 0; i < M; ++i) acc[i] = 0.0f;
    DotRows<M, false, kVec>(wrow, srow, p.a, p.k, rb, rows, p.k, lane, 32, acc);
#pragma unroll
    for (int i = 0; i < M; ++i) acc[i] = WarpSum(acc[i]);
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < M; ++i) {
        if (i < rows) p.c[(rb + i) * p.n + j] = acc[i];
      }
    }
  }
}

__global__ void Fp8DequantKernel(Fp8BlockWeight w, int64_t n, int64_t k, uint16_t* out) {
  const int64_t total = n * k;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = e / k, q = e % k;
    const float s = w.scales[Fp8ScaleRow(j, w.split_rows) * w.scale_ld + q / kFp8BlockSize];
    out[e] = Bf16Bits(Fp8ToFloat(w.data[j * w.ldw + q]) * s);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int M, bool kBf16A, bool kVec>
cudaError_t LaunchSmallM(const Fp8SmallMGemmParams& p, int64_t row0, int rows, int ksplit,
                         cudaStream_t stream) {
  const int cols_per_block = kWarps / ksplit;
  const int64_t blocks = (p.n + cols_per_block - 1) / cols_per_block;
  Fp8SmallMKernel<M, kBf16A, kVec>
      <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, row0, rows, ksplit);
  return cudaGetLastError();
}

template <bool kBf16A, bool kVec>
cudaError_t LaunchSmallMRows(const Fp8SmallMGemmParams& p, int64_t row0, int rows, int ksplit,
                             cudaStream_t stream) {
  if constexpr (kVec) {
    if (rows <= 2) {
      const bool one_chunk = p.gemv_form == Fp8GemvForm::kPipelined1 ||
                             (p.gemv_form == Fp8GemvForm::kAuto && rows == 2);
      return Fp8PipelinedGemv(p, row0, rows, one_chunk ? 1 : 2, stream);
    }
  } else {
    if (rows <= 1) return LaunchSmallM<1, kBf16A, kVec>(p, row0, rows, ksplit, stream);
    if (rows <= 2) return LaunchSmallM<2, kBf16A, kVec>(p, row0, rows, ksplit, stream);
  }
  if (rows <= 4) return LaunchSmallM<4, kBf16A, kVec>(p, row0, rows, ksplit, stream);
  return LaunchSmallM<8, kBf16A, kVec>(p, row0, rows, ksplit, stream);
}

}  // namespace

bool Fp8SmallMGemmSupports(const Fp8SmallMGemmParams& p) {
  return p.m >= 1 && p.n >= 1 && p.k >= 1 && p.n <= kIntMax * int64_t{kWarps} && p.a != nullptr &&
         p.w.data != nullptr && p.w.scales != nullptr && p.c != nullptr && p.lda >= p.k &&
         p.w.ldw >= p.k && p.ldc >= p.n && p.w.scale_ld >= Fp8ScaleCols(p.k) && p.w.split_rows >= 0;
}

cudaError_t Fp8SmallMGemm(const Fp8SmallMGemmParams& p, cudaStream_t stream) {
  if (!Fp8SmallMGemmSupports(p)) return cudaErrorInvalidValue;
  const size_t a_elem = p.a_bf16 ? 2 : 4;
  const bool vec = p.k % kLaneElems == 0 && p.w.ldw % 16 == 0 && Aligned16(p.w.data) &&
                   Aligned16(p.a) && (p.lda * a_elem) % 16 == 0;
  // Split a row's k over more warps while the grid is short and each warp keeps whole chunks.
  const int64_t chunks = vec ? (p.k + kWarpSpan - 1) / kWarpSpan : (p.k + 31) / 32;
  int ksplit = 1;
  while (ksplit < kWarps && (p.n * ksplit + kWarps - 1) / kWarps < kTargetBlocks &&
         2 * ksplit <= chunks) {
    ksplit *= 2;
  }
  for (int64_t row0 = 0; row0 < p.m; row0 += kFp8SmallMGemmRowsPerLaunch) {
    const int rows = static_cast<int>(std::min(kFp8SmallMGemmRowsPerLaunch, p.m - row0));
    cudaError_t e;
    if (p.a_bf16) {
      e = vec ? LaunchSmallMRows<true, true>(p, row0, rows, ksplit, stream)
              : LaunchSmallMRows<true, false>(p, row0, rows, ksplit, stream);
    } else {
      e = vec ? LaunchSmallMRows<false, true>(p, row0, rows, ksplit, stream)
              : LaunchSmallMRows<false, false>(p, row0, rows, ksplit, stream);
    }
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

bool Fp8GroupedGemmSupports(const Fp8GroupedGemmParams& p) {
  return p.num_groups >= 1 && p.max_rows >= 0 && p.n >= 1 && p.k >= 1 &&
         p.n <= kIntMax * int64_t{kWarps} && p.offsets != nullptr && p.a != nullptr &&
         p.weights != nullptr && p.scales != nullptr && p.c != nullptr &&
         p.scale_ld >= Fp8ScaleCols(p.k) && p.split_rows >= 0;
}

cudaError_t Fp8GroupedGemm(const Fp8GroupedGemmParams& p, cudaStream_t stream) {
  if (!Fp8GroupedGemmSupports(p)) return cudaErrorInvalidValue;
  if (p.max_rows == 0) return cudaSuccess;
  const int grid_y = std::min(p.num_groups, p.max_rows);
  if (grid_y > 65535) return cudaErrorInvalidValue;
  // Weight rows of a group are contiguous (ldw = k): aligned when k is a multiple of 16 and
  // the group's pointer is (every DeviceBuffer is).
  const bool vec = p.k % kLaneElems == 0 && Aligned16(p.a);
  const dim3 grid(static_cast<unsigned>((p.n + kWarps - 1) / kWarps), grid_y);
  if (vec) {
    Fp8GroupedKernel<true><<<grid, kThreads, 0, stream>>>(p);
  } else {
    Fp8GroupedKernel<false><<<grid, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t Fp8DequantToBf16(const Fp8BlockWeight& w, int64_t n, int64_t k, uint16_t* out,
                             cudaStream_t stream) {
  if (n < 0 || k < 0 ||
      (n * k > 0 && (w.data == nullptr || w.scales == nullptr || out == nullptr || w.ldw < k ||
                     w.scale_ld < Fp8ScaleCols(k)))) {
    return cudaErrorInvalidValue;
  }
  if (n * k == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((n * k + kThreads - 1) / kThreads, 4096);
  Fp8DequantKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(w, n, k, out);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace deepinfer
