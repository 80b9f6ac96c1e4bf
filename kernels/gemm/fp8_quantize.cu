// Activation quantisation to e4m3 per 128-wide block: see fp8_quantize.h. One warp per (row, k
// block), four values a lane.
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

template <bool kBf16A>
__global__ void __launch_bounds__(kThreads)
    QuantizeKernel(Fp8QuantizeParams p, int64_t blocks_per_row) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t row = warp / blocks_per_row, kb = warp % blocks_per_row;
  if (row >= p.m_pad) return;  // whole warps
  // Where this row's scale goes: the plain layout, or its group's packed one.
  int64_t scale_at = kb * p.m_pad + row;
  if (p.group_offsets != nullptr) {
    if (row >= p.group_offsets[p.num_groups]) return;
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
    scale_at = base * blocks_per_row + kb * count + (row - base);
  }
  const int64_t col = kb * kBlock + 4 * lane;
  const bool real = row < p.m;
  float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (real && col < p.k) {
    if constexpr (kBf16A) {
      const uint2 v =
          *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p.a) + row * p.lda + col);
      x[0] = __uint_as_float(v.x << 16);
      x[1] = __uint_as_float(v.x & 0xFFFF0000u);
      x[2] = __uint_as_float(v.y << 16);
      x[3] = __uint_as_float(v.y & 0xFFFF0000u);
    } else {
      const float4 v =
          *reinterpret_cast<const float4*>(static_cast<const float*>(p.a) + row * p.lda + col);
      x[0] = v.x;
      x[1] = v.y;
      x[2] = v.z;
      x[3] = v.w;
    }
  }
  float amax = fmaxf(fmaxf(fabsf(x[0]), fabsf(x[1])), fmaxf(fabsf(x[2]), fabsf(x[3])));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  const float s = real ? fmaxf(__fdiv_rn(amax, 448.0f), FLT_MIN) : 1.0f;
  uint32_t packed = 0;
  if (real) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_fp8_storage_t q =
          __nv_cvt_float_to_fp8(__fdiv_rn(x[i], s), __NV_SATFINITE, __NV_E4M3);
      packed |= static_cast<uint32_t>(q) << (8 * i);
    }
  }
  if (col < p.k) *reinterpret_cast<uint32_t*>(p.q + row * p.ldq + col) = packed;
  if (lane == 0) p.scales[scale_at] = s;
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
  if (p.m < 0 || p.k < 1 || p.k % 16 != 0 || p.m_pad < p.m || p.lda < p.k ||
      (p.lda * a_elem) % 16 != 0 || p.ldq < p.k || p.ldq % 16 != 0 || p.q == nullptr ||
      p.scales == nullptr || !Aligned16(p.q) || (p.m > 0 && (p.a == nullptr || !Aligned16(p.a))) ||
      (p.group_offsets != nullptr && p.num_groups < 1)) {
    return cudaErrorInvalidValue;
  }
  Fp8QuantizeParams q = p;
  if (q.group_offsets != nullptr) q.m_pad = q.m;  // only the groups' rows
  if (q.m_pad == 0) return cudaSuccess;
  const int64_t blocks_per_row = (p.k + kBlock - 1) / kBlock;
  const int64_t warps = q.m_pad * blocks_per_row;
  const int64_t grid = (warps * 32 + kThreads - 1) / kThreads;
  if (grid > 0x7FFFFFFF) return cudaErrorInvalidValue;
  if (q.a_bf16) {
    QuantizeKernel<true><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(q, blocks_per_row);
  } else {
    QuantizeKernel<false><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(q, blocks_per_row);
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
