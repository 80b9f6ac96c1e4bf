// Grid-stride elementwise kernels; 64-bit indices because expert activations can exceed 2^31.
// SiLU-mul has a vectorised form where the shape and pointers allow it: groups of 4 columns, two
// 16-byte loads (gate, up) and one 16- or 8-byte store per thread, and the row / column split of
// the index with one 32-bit division per group where the index fits, where the scalar form paid a
// 64-bit division and modulo per element (~46% of bandwidth at prefill sizes). Same arithmetic per
// element, so the same bits.
#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "kernels/activation/elementwise.h"
#include "kernels/common/launch.cuh"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;

unsigned GridFor(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
}

__device__ void AddBody(int64_t n, const float* a, const float* b, float* out) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    out[i] = a[i] + b[i];
  }
}

__device__ void SiluMulBody(int64_t rows, int64_t inter, const float* x, float* out) {
  const int64_t n = rows * inter;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t r = i / inter, c = i % inter;
    const float g = x[r * 2 * inter + c];
    const float u = x[r * 2 * inter + inter + c];
    // expf (not __expf): the fast intrinsic is off by several ulp for large |g|.
    out[i] = g / (1.0f + expf(-g)) * u;
  }
}

__device__ void SiluMulToBf16Body(int64_t rows, int64_t inter, const float* x, uint16_t* out) {
  const int64_t n = rows * inter;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t r = i / inter, c = i % inter;
    const float g = x[r * 2 * inter + c];
    const float u = x[r * 2 * inter + inter + c];
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(g / (1.0f + expf(-g)) * u));
  }
}

__device__ __forceinline__ float SiluMulOf(float g, float u) {
  // expf (not __expf): the fast intrinsic is off by several ulp for large |g|.
  return g / (1.0f + expf(-g)) * u;
}

__device__ __forceinline__ unsigned Bf16x2(float lo, float hi) {
  return static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

// Groups of 4 columns (inter % 4 == 0, x 16-byte aligned, out 16- (fp32) or 8-byte (bf16)
// aligned); Index: uint32_t when every index below groups + the grid's stride fits, else int64_t.
// (x's offsets are 64-bit: twice the groups.)
template <typename Out, typename Index>
__device__ void SiluMulX4Body(Index groups, Index inter4, const float* x, Out* out) {
  const Index stride = static_cast<Index>(gridDim.x) * kThreads;
  for (Index i = static_cast<Index>(blockIdx.x) * kThreads + threadIdx.x; i < groups; i += stride) {
    const Index r = i / inter4, c = i - r * inter4;
    const float4* row = reinterpret_cast<const float4*>(x) + int64_t{r} * 2 * inter4;
    const float4 g = row[c], u = row[inter4 + c];
    const float o0 = SiluMulOf(g.x, u.x), o1 = SiluMulOf(g.y, u.y);
    const float o2 = SiluMulOf(g.z, u.z), o3 = SiluMulOf(g.w, u.w);
    if constexpr (std::is_same_v<Out, float>) {
      reinterpret_cast<float4*>(out)[i] = make_float4(o0, o1, o2, o3);
    } else {
      reinterpret_cast<uint2*>(out)[i] = make_uint2(Bf16x2(o0, o1), Bf16x2(o2, o3));
    }
  }
}

// The vectorised launch when the shape and pointers allow it (returns true, err set).
template <typename Out>
bool LaunchSiluMulX4(int64_t rows, int64_t inter, const float* x, Out* out, cudaStream_t stream,
                     cudaError_t* err) {
  if (inter % 4 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(out) % (4 * sizeof(Out)) != 0) {
    return false;
  }
  const int64_t groups = rows * (inter / 4);
  // Enough blocks for one group per thread up to ~1M blocks, grid-stride beyond.
  const int64_t blocks = std::min<int64_t>((groups + kThreads - 1) / kThreads, int64_t{1} << 20);
  const unsigned grid = static_cast<unsigned>(blocks);
  if (groups + blocks * kThreads < (int64_t{1} << 32)) {
    *err = LaunchAfterPrecedingGrids<SiluMulX4Body<Out, uint32_t>, kThreads>(
        grid, 0, stream, static_cast<uint32_t>(groups), static_cast<uint32_t>(inter / 4), x, out);
  } else {
    *err = LaunchAfterPrecedingGrids<SiluMulX4Body<Out, int64_t>, kThreads>(grid, 0, stream, groups,
                                                                            inter / 4, x, out);
  }
  return true;
}

__device__ void RoundToBf16Body(int64_t n, const float* x, uint16_t* out) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
  }
}

// Groups of 8 values (x 16-byte and out 16-byte aligned): two 16-byte loads and one 16-byte store
// a thread; Index as for SiluMulX4Body. The scalar body's rounding per value.
template <typename Index>
__device__ void RoundToBf16X8Body(Index groups, const float* x, uint16_t* out) {
  const Index stride = static_cast<Index>(gridDim.x) * kThreads;
  for (Index i = static_cast<Index>(blockIdx.x) * kThreads + threadIdx.x; i < groups; i += stride) {
    const float4 a = reinterpret_cast<const float4*>(x)[2 * int64_t{i}];
    const float4 b = reinterpret_cast<const float4*>(x)[2 * int64_t{i} + 1];
    reinterpret_cast<uint4*>(out)[i] =
        make_uint4(Bf16x2(a.x, a.y), Bf16x2(a.z, a.w), Bf16x2(b.x, b.y), Bf16x2(b.z, b.w));
  }
}

}  // namespace

cudaError_t RoundF32ToBf16(int64_t n, const float* x, uint16_t* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  // The scalar kernel wrote ~1.2 TB/s on DeepSeek-V3's attention output (128 tokens x 128 heads x
  // 512, Nsight Compute on the H200); 16-byte accesses where the pointers allow.
  if (n % 8 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(out) % 16 != 0) {
    return LaunchAfterPrecedingGrids<RoundToBf16Body, kThreads>(GridFor(n), 0, stream, n, x, out);
  }
  const int64_t groups = n / 8;
  const int64_t blocks = std::min<int64_t>((groups + kThreads - 1) / kThreads, int64_t{1} << 20);
  const unsigned grid = static_cast<unsigned>(blocks);
  if (groups + blocks * kThreads < (int64_t{1} << 32)) {
    return LaunchAfterPrecedingGrids<RoundToBf16X8Body<uint32_t>, kThreads>(
        grid, 0, stream, static_cast<uint32_t>(groups), x, out);
  }
  return LaunchAfterPrecedingGrids<RoundToBf16X8Body<int64_t>, kThreads>(grid, 0, stream, groups,
                                                                          x, out);
}

cudaError_t AddF32(int64_t n, const float* a, const float* b, float* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return LaunchAfterPrecedingGrids<AddBody, kThreads>(GridFor(n), 0, stream, n, a, b, out);
}

cudaError_t SiluMulF32(int64_t rows, int64_t inter, const float* x, float* out,
                       cudaStream_t stream) {
  if (rows <= 0 || inter <= 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  if (LaunchSiluMulX4(rows, inter, x, out, stream, &err)) return err;
  return LaunchAfterPrecedingGrids<SiluMulBody, kThreads>(GridFor(rows * inter), 0, stream, rows,
                                                          inter, x, out);
}

cudaError_t SiluMulF32ToBf16(int64_t rows, int64_t inter, const float* x, uint16_t* out,
                             cudaStream_t stream) {
  if (rows <= 0 || inter <= 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  if (LaunchSiluMulX4(rows, inter, x, out, stream, &err)) return err;
  return LaunchAfterPrecedingGrids<SiluMulToBf16Body, kThreads>(GridFor(rows * inter), 0, stream,
                                                                rows, inter, x, out);
}

}  // namespace kernels
}  // namespace deepinfer
