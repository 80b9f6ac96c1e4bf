// Activation quantisation to e4m3 per 128-wide block: see fp8_quantize.h. One warp per (row, k
// block), four values a lane.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>

#include "kernels/gemm/fp8_quantize.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kBlock = 128;

// Where row `row`'s block kb's scale goes: the plain layout, or its group's packed one (-1: a
// row past the last group).
__device__ __forceinline__ int64_t ScaleAt(const Fp8QuantizeParams& p, int64_t row, int64_t kb,
                                           int64_t blocks_per_row) {
  if (p.group_offsets == nullptr) return kb * p.m_pad + row;
  if (row >= p.group_offsets[p.num_groups]) return -1;
  int lo = 0, hi = p.num_groups - 1;  // the last group starting at or before row holds it
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.group_offsets[mid] <= row) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int64_t base = p.group_offsets[lo], count = p.group_offsets[lo + 1] - base;
  return base * blocks_per_row + kb * count + (row - base);
}

__device__ __forceinline__ void Widen4(uint2 v, float x[4]) {
  x[0] = __uint_as_float(v.x << 16);
  x[1] = __uint_as_float(v.x & 0xFFFF0000u);
  x[2] = __uint_as_float(v.y << 16);
  x[3] = __uint_as_float(v.y & 0xFFFF0000u);
}

// kernels::SiluMulBf16's value: expf (not __expf), the product rounded to bf16.
__device__ __forceinline__ float SiluMulRounded(float g, float u) {
  return __bfloat162float(__float2bfloat16_rn(g / (1.0f + expf(-g)) * u));
}

// Values col .. col + 3 of source row `row` (col < k).
template <bool kBf16A, bool kSiluMul>
__device__ __forceinline__ void Load4(const Fp8QuantizeParams& p, int64_t row, int64_t col,
                                      float x[4]) {
  if constexpr (kSiluMul) {
    const uint16_t* r = static_cast<const uint16_t*>(p.a) + row * p.lda;
    float g[4], u[4];
    Widen4(*reinterpret_cast<const uint2*>(r + col), g);
    Widen4(*reinterpret_cast<const uint2*>(r + p.k + col), u);
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = SiluMulRounded(g[i], u[i]);
  } else if constexpr (kBf16A) {
    Widen4(*reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p.a) + row * p.lda + col),
           x);
  } else {
    const float4 v =
        *reinterpret_cast<const float4*>(static_cast<const float*>(p.a) + row * p.lda + col);
    x[0] = v.x;
    x[1] = v.y;
    x[2] = v.z;
    x[3] = v.w;
  }
}

// The warp's 128-wide block (four values a lane): its scale (1 for a padding row) and the lane's
// four e4m3 bytes (zeros for a padding row).
__device__ __forceinline__ float QuantizeBlock(const float x[4], bool real, uint32_t* packed) {
  float amax = fmaxf(fmaxf(fabsf(x[0]), fabsf(x[1])), fmaxf(fabsf(x[2]), fabsf(x[3])));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  const float s = real ? fmaxf(__fdiv_rn(amax, 448.0f), FLT_MIN) : 1.0f;
  *packed = 0;
  if (real) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_fp8_storage_t q =
          __nv_cvt_float_to_fp8(__fdiv_rn(x[i], s), __NV_SATFINITE, __NV_E4M3);
      *packed |= static_cast<uint32_t>(q) << (8 * i);
    }
  }
  return s;
}

// One warp per (row of q, k block).
template <bool kBf16A, bool kSiluMul>
__global__ void __launch_bounds__(kThreads)
    QuantizeKernel(Fp8QuantizeParams p, int64_t blocks_per_row) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t row = warp / blocks_per_row, kb = warp % blocks_per_row;
  if (row >= p.m_pad) return;  // whole warps
  const int64_t scale_at = ScaleAt(p, row, kb, blocks_per_row);
  if (scale_at < 0) return;
  const int64_t col = kb * kBlock + 4 * lane;
  const bool real = row < p.m;
  float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (real && col < p.k) Load4<kBf16A, kSiluMul>(p, row, col, x);
  uint32_t packed;
  const float s = QuantizeBlock(x, real, &packed);
  if (col < p.k) *reinterpret_cast<uint32_t*>(p.q + row * p.ldq + col) = packed;
  if (lane == 0) p.scales[scale_at] = s;
}

// One warp per (source row, k block): quantised once, written to each of its destination rows.
template <bool kBf16A, bool kSiluMul>
__global__ void __launch_bounds__(kThreads)
    QuantizeScatterKernel(Fp8QuantizeParams p, int64_t blocks_per_row) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t row = warp / blocks_per_row, kb = warp % blocks_per_row;
  if (row >= p.m) return;  // whole warps
  const int64_t col = kb * kBlock + 4 * lane;
  float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (col < p.k) Load4<kBf16A, kSiluMul>(p, row, col, x);
  uint32_t packed;
  const float s = QuantizeBlock(x, true, &packed);
  for (int32_t j = 0; j < p.dests_per_row; ++j) {
    const int64_t dest = p.dest_rows[row * p.dests_per_row + j];
    if (dest < 0) continue;
    const int64_t scale_at = ScaleAt(p, dest, kb, blocks_per_row);
    if (scale_at < 0) continue;
    if (col < p.k) *reinterpret_cast<uint32_t*>(p.q + dest * p.ldq + col) = packed;
    if (lane == 0) p.scales[scale_at] = s;
  }
}

template <bool kBf16A, bool kSiluMul>
void Launch(const Fp8QuantizeParams& q, int64_t blocks_per_row, unsigned grid,
            cudaStream_t stream) {
  if (q.dest_rows != nullptr) {
    QuantizeScatterKernel<kBf16A, kSiluMul><<<grid, kThreads, 0, stream>>>(q, blocks_per_row);
  } else {
    QuantizeKernel<kBf16A, kSiluMul><<<grid, kThreads, 0, stream>>>(q, blocks_per_row);
  }
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
      (p.group_offsets != nullptr && p.num_groups < 1) || (p.silu_mul && !p.a_bf16) ||
      (p.dest_rows != nullptr && (p.group_offsets == nullptr || p.dests_per_row < 1))) {
    return cudaErrorInvalidValue;
  }
  Fp8QuantizeParams q = p;
  if (q.group_offsets != nullptr) q.m_pad = q.m;  // only the groups' rows
  // Scattered: one warp per source row and block; otherwise per row of q.
  const int64_t launch_rows = q.dest_rows != nullptr ? q.m : q.m_pad;
  if (launch_rows == 0) return cudaSuccess;
  const int64_t blocks_per_row = (p.k + kBlock - 1) / kBlock;
  const int64_t warps = launch_rows * blocks_per_row;
  const int64_t grid = (warps * 32 + kThreads - 1) / kThreads;
  if (grid > 0x7FFFFFFF) return cudaErrorInvalidValue;
  const unsigned g = static_cast<unsigned>(grid);
  if (q.silu_mul) {
    Launch<true, true>(q, blocks_per_row, g, stream);
  } else if (q.a_bf16) {
    Launch<true, false>(q, blocks_per_row, g, stream);
  } else {
    Launch<false, false>(q, blocks_per_row, g, stream);
  }
  return cudaGetLastError();
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
