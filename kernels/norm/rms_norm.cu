// RMSNorm: the sum of squares is reduced in fp32 through warp shuffles, in one order for every
// kernel here (BlockInvRms's: 256 threads' strided partial sums), so all agree bit for bit.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>

#include "kernels/common/launch.cuh"
#include "kernels/norm/block_inv_rms.cuh"
#include "kernels/norm/rms_norm.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;

// RmsNormF32 for rows of at most 2048 (kPerLane = 8, 16, 32, 64 values per lane: up to 256,
// 512, 1024, 2048 wide), one warp per row, kWarpRows rows per block: the model's per-head and
// low-rank norms have up to T * 64 rows of 512, where a 256-thread block per row spends more
// time being scheduled and synchronised than reading its 2 KB. Bit for bit RmsNormBody: lane l
// holds elements l + 32 s, so slot s belongs to RmsNormBody's thread l + 32 (s % 8), whose
// partial sum adds its elements (slots w, w + 8, ...) in the same order; each of the 8 virtual
// warps' partials is reduced by the same xor butterfly, and their sums are added in warp order
// from 0, as BlockInvRms's thread 0 does. Padding slots hold 0, and adding 0 * 0 changes no sum.
constexpr int kWarpRows = 8;

template <int kPerLane>
__device__ void RmsNormWarpRowsBody(int64_t rows, int64_t dim, const float* x, int64_t ldx,
                                    const float* weight, float eps, float* out, int64_t ldout) {
  static_assert(kThreads == 256, "WarpRowInvRms emulates 8 warps");
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpRows + threadIdx.x / 32;
  if (row >= rows) return;  // no block-wide barrier below
  const float* xr = x + row * ldx;
  float* orow = out + row * ldout;
  float v[kPerLane];
#pragma unroll
  for (int s = 0; s < kPerLane; ++s) {
    const int64_t i = lane + 32 * s;
    v[s] = i < dim ? xr[i] : 0.0f;
  }
  // Every lane's loads feed the sum, so writing in place (out == x) is safe.
  const float inv = WarpRowInvRms<kPerLane>(v, dim, eps);
#pragma unroll
  for (int s = 0; s < kPerLane; ++s) {
    const int64_t i = lane + 32 * s;
    if (i < dim) orow[i] = weight[i] * (v[s] * inv);
  }
}

// RmsNormF32 for rows of 2049 to kThreads * kPer (kPer = 16, 32, 64: up to 4096, 8192, 16384;
// the hyper-connection mix normalises hc_mult * hidden = 16384-wide rows), one block per row:
// each thread keeps its elements (RmsNormBody's, in its order) in registers, so the row is read
// from memory once and all of a thread's loads are in flight together. Bit for bit RmsNormBody.
template <int kPer>
__device__ void RmsNormInRegistersBody(int64_t dim, const float* x, int64_t ldx,
                                       const float* weight, float eps, float* out, int64_t ldout) {
  const float* xr = x + blockIdx.x * ldx;
  float* orow = out + blockIdx.x * ldout;
  float v[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    v[j] = i < dim ? xr[i] : 0.0f;
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) ss += v[j] * v[j];
  // BlockInvRms synchronises the block after every thread's loads, so out may alias x.
  const float inv = BlockInvRms<kThreads / 32>(ss, dim, eps);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    if (i < dim) orow[i] = weight[i] * (v[j] * inv);
  }
}

__device__ void RmsNormBody(int64_t dim, const float* x, int64_t ldx, const float* weight,
                            float eps, float* out, int64_t ldout) {
  const float* xr = x + blockIdx.x * ldx;
  float* orow = out + blockIdx.x * ldout;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) ss += xr[i] * xr[i];
  // Every thread has finished reading its part of xr before the result is published, so
  // writing in place (out == x) is safe.
  const float inv = BlockInvRms<kThreads / 32>(ss, dim, eps);
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) orow[i] = weight[i] * (xr[i] * inv);
}

// AddRmsNormBody for rows of at most kThreads * kPer (8, 16 or 28 per thread: hidden sizes
// up to 2048, 4096, 7168 without spilling registers): every load (x, y, weight) is
// issued before the first store, where the loop below has to wait for each element's load
// after the previous element's store to x (x and y may alias as far as the compiler knows):
// 8 dependent round trips per thread for a 2048-wide row. Each thread handles the same
// elements in the same order as the loop, so the results are bit for bit the loop's.
template <int kPer>
__device__ __forceinline__ void AddRmsNormInRegisters(int64_t dim, float* xr, const float* yr,
                                                      const float* weight, float eps, float* orow,
                                                      uint16_t* orow_bf16) {
  float v[kPer], w[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    v[j] = 0.0f;
    w[j] = 0.0f;
    if (i < dim) {
      v[j] = yr != nullptr ? xr[i] + yr[i] : xr[i];
      w[j] = weight[i];
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    if (i < dim) {
      if (yr != nullptr) xr[i] = v[j];
      ss += v[j] * v[j];
    }
  }
  const float inv = BlockInvRms<kThreads / 32>(ss, dim, eps);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    if (i < dim) {
      const float o = w[j] * (v[j] * inv);
      if (orow != nullptr) orow[i] = o;
      if (orow_bf16 != nullptr) orow_bf16[i] = __bfloat16_as_ushort(__float2bfloat16_rn(o));
    }
  }
}

// The quantisation of AddRmsNormFp8: in AddRmsNormVectorised's layout, chunk c (4 values) of the
// row is held by thread c % kThreads, so the 32 chunks of 128-wide block b (chunks 32 b .. 32 b +
// 31) are the 32 lanes of warp b % 8 at the same q = b / 8: a block's amax is one warp butterfly.
// The arithmetic is kernels::Fp8QuantizeRows': s = max(amax / 448, FLT_MIN) (IEEE division),
// each value divided by s (IEEE) and converted to e4m3 (nearest even, saturating); fmaxf is exact,
// so the amax is the same in any order. Every lane of the warp calls it (present: c < chunks).
__device__ __forceinline__ void QuantizeChunk(float4 o, bool present, int c, int64_t row,
                                              const RmsNormFp8Out& fp8) {
  if (fp8.from_bf16) {
    o.x = __bfloat162float(__float2bfloat16_rn(o.x));
    o.y = __bfloat162float(__float2bfloat16_rn(o.y));
    o.z = __bfloat162float(__float2bfloat16_rn(o.z));
    o.w = __bfloat162float(__float2bfloat16_rn(o.w));
  }
  float amax = present ? fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w))) : 0.0f;
  for (int m = 16; m > 0; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
  if (!present) return;
  const float s = fmaxf(__fdiv_rn(amax, 448.0f), FLT_MIN);
  const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(
      make_float2(__fdiv_rn(o.x, s), __fdiv_rn(o.y, s)), __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(
      make_float2(__fdiv_rn(o.z, s), __fdiv_rn(o.w, s)), __NV_SATFINITE, __NV_E4M3);
  reinterpret_cast<uint32_t*>(fp8.q + row * fp8.ldq)[c] =
      static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  if (c % 32 == 0) fp8.scales[(c / 32) * fp8.m_pad + row] = s;
}

// AddRmsNormInRegisters with 16-byte accesses, for 16-byte aligned rows with dim % 4 == 0 and
// dim <= kThreads * 4 * kVec (kVec = 2, 4, 7: the same row sizes): thread t loads, adds, stores
// and normalises the float4 chunks t, t + kThreads, ... (a quarter of the load and store
// instructions, and bf16 outputs 8 bytes at a time). The sum of squares must stay bit for bit
// RmsNormF32's, whose thread t sums elements t, t + kThreads, ... in that order: the row's
// values go through shared memory, each thread sums its scalar elements from there in the same
// order, and BlockInvRms reduces the partial sums as before. Every other value is elementwise,
// the same expression per element, so every output is bit for bit the scalar kernel's.
template <int kVec, bool kFp8 = false>
__device__ __forceinline__ void AddRmsNormVectorised(int64_t dim, float* xr, const float* yr,
                                                     const float* weight, float eps, float* orow,
                                                     uint16_t* orow_bf16, int64_t row = 0,
                                                     const RmsNormFp8Out& fp8 = {}) {
  __shared__ float4 staged[kThreads * kVec];
  const int chunks = static_cast<int>(dim / 4);
  float4 v[kVec], w[kVec];
#pragma unroll
  for (int q = 0; q < kVec; ++q) {
    const int c = static_cast<int>(threadIdx.x) + q * kThreads;
    if (c < chunks) {
      float4 a = reinterpret_cast<const float4*>(xr)[c];
      if (yr != nullptr) {
        const float4 b = reinterpret_cast<const float4*>(yr)[c];
        a.x = a.x + b.x, a.y = a.y + b.y, a.z = a.z + b.z, a.w = a.w + b.w;
      }
      v[q] = a;
      w[q] = reinterpret_cast<const float4*>(weight)[c];
    }
  }
#pragma unroll
  for (int q = 0; q < kVec; ++q) {
    const int c = static_cast<int>(threadIdx.x) + q * kThreads;
    if (c < chunks) {
      staged[c] = v[q];
      if (yr != nullptr) reinterpret_cast<float4*>(xr)[c] = v[q];
    }
  }
  __syncthreads();
  const float* s = reinterpret_cast<const float*>(staged);
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < 4 * kVec; ++j) {
    const int i = static_cast<int>(threadIdx.x) + j * kThreads;
    if (i < dim) ss += s[i] * s[i];
  }
  const float inv = BlockInvRms<kThreads / 32>(ss, dim, eps);
#pragma unroll
  for (int q = 0; q < kVec; ++q) {
    const int c = static_cast<int>(threadIdx.x) + q * kThreads;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (c < chunks) {
      o.x = w[q].x * (v[q].x * inv);
      o.y = w[q].y * (v[q].y * inv);
      o.z = w[q].z * (v[q].z * inv);
      o.w = w[q].w * (v[q].w * inv);
    }
    // Every lane, for the warp's butterfly (a chunk past the row: no values, nothing written).
    if constexpr (kFp8) QuantizeChunk(o, c < chunks, c, row, fp8);
    if (c < chunks) {
      if (orow != nullptr) reinterpret_cast<float4*>(orow)[c] = o;
      if (orow_bf16 != nullptr) {
        uint2 packed;
        packed.x = static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(o.x))) |
                   (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(o.y))) << 16);
        packed.y = static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(o.z))) |
                   (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(o.w))) << 16);
        reinterpret_cast<uint2*>(orow_bf16)[c] = packed;
      }
    }
  }
}

// AddRmsNormVectorised with the quantisation (kVec as there): rows from `rows` on (the GEMM's
// padding) write zeros and scale 1 only.
template <int kVec>
__device__ void AddRmsNormFp8Body(int64_t rows, int64_t dim, float* x, const float* y,
                                  const float* weight, float eps, float* out, uint16_t* out_bf16,
                                  RmsNormFp8Out fp8) {
  const int64_t row = blockIdx.x;
  const int chunks = static_cast<int>(dim / 4);
  if (row >= rows) {  // the whole block
    for (int c = static_cast<int>(threadIdx.x); c < chunks; c += kThreads) {
      reinterpret_cast<uint32_t*>(fp8.q + row * fp8.ldq)[c] = 0;
      if (c % 32 == 0) fp8.scales[(c / 32) * fp8.m_pad + row] = 1.0f;
    }
    return;
  }
  AddRmsNormVectorised<kVec, true>(dim, x + row * dim, y != nullptr ? y + row * dim : nullptr,
                                   weight, eps, out != nullptr ? out + row * dim : nullptr,
                                   out_bf16 != nullptr ? out_bf16 + row * dim : nullptr, row, fp8);
}

// The vectorised body (AddRmsNormVectorised), one kernel per row size so that each has only
// its own shared memory (kVec = 7: 28 KB); AddRmsNormF32 launches it only for rows it fits.
// x's rows at stride ldx, the others contiguous.
template <int kVec>
__device__ void AddRmsNormVectorisedBody(int64_t dim, float* x, int64_t ldx, const float* y,
                                         const float* weight, float eps, float* out,
                                         uint16_t* out_bf16) {
  AddRmsNormVectorised<kVec>(dim, x + blockIdx.x * ldx,
                             y != nullptr ? y + blockIdx.x * dim : nullptr, weight, eps,
                             out != nullptr ? out + blockIdx.x * dim : nullptr,
                             out_bf16 != nullptr ? out_bf16 + blockIdx.x * dim : nullptr);
}

bool Aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// x += y (optional), then RmsNormKernel's arithmetic in the same order (each thread sums the
// same elements, the same reduction), so out is bit for bit what AddF32 + RmsNormF32 give. x's
// rows at stride ldx, the others contiguous.
__device__ void AddRmsNormBody(int64_t dim, float* x, int64_t ldx, const float* y,
                               const float* weight, float eps, float* out, uint16_t* out_bf16) {
  float* xr = x + blockIdx.x * ldx;
  const float* yr = y != nullptr ? y + blockIdx.x * dim : nullptr;
  float* orow = out != nullptr ? out + blockIdx.x * dim : nullptr;
  uint16_t* orow_bf16 = out_bf16 != nullptr ? out_bf16 + blockIdx.x * dim : nullptr;
  if (dim <= kThreads * 8) {
    return AddRmsNormInRegisters<8>(dim, xr, yr, weight, eps, orow, orow_bf16);
  }
  if (dim <= kThreads * 16) {
    return AddRmsNormInRegisters<16>(dim, xr, yr, weight, eps, orow, orow_bf16);
  }
  if (dim <= kThreads * 28) {
    return AddRmsNormInRegisters<28>(dim, xr, yr, weight, eps, orow, orow_bf16);
  }
  float ss = 0.0f;
  if (yr != nullptr) {
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
      const float v = xr[i] + yr[i];
      xr[i] = v;
      ss += v * v;
    }
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) ss += xr[i] * xr[i];
  }
  const float inv = BlockInvRms<kThreads / 32>(ss, dim, eps);
  // Each thread reads back only the x elements it wrote itself.
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    const float v = weight[i] * (xr[i] * inv);
    if (orow != nullptr) orow[i] = v;
    if (orow_bf16 != nullptr) orow_bf16[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}

// AddRmsNormF32 with x's rows at stride ldx.
cudaError_t LaunchAddRmsNorm(int64_t rows, int64_t dim, float* x, int64_t ldx, const float* y,
                             const float* weight, float eps, float* out, uint16_t* out_bf16,
                             cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return cudaSuccess;
  if (rows > 0x7fffffff || ldx < dim) return cudaErrorInvalidValue;
  if (dim % 4 == 0 && ldx % 4 == 0 && dim <= kThreads * 28 && Aligned(x, 16) && Aligned(y, 16) &&
      Aligned(weight, 16) && Aligned(out, 16) && Aligned(out_bf16, 8)) {
    const unsigned grid = static_cast<unsigned>(rows);
    if (dim <= kThreads * 8) {
      return LaunchAfterPrecedingGrids<AddRmsNormVectorisedBody<2>, kThreads>(
          grid, 0, stream, dim, x, ldx, y, weight, eps, out, out_bf16);
    }
    if (dim <= kThreads * 16) {
      return LaunchAfterPrecedingGrids<AddRmsNormVectorisedBody<4>, kThreads>(
          grid, 0, stream, dim, x, ldx, y, weight, eps, out, out_bf16);
    }
    return LaunchAfterPrecedingGrids<AddRmsNormVectorisedBody<7>, kThreads>(
        grid, 0, stream, dim, x, ldx, y, weight, eps, out, out_bf16);
  }
  return LaunchAfterPrecedingGrids<AddRmsNormBody, kThreads>(
      static_cast<unsigned>(rows), 0, stream, dim, x, ldx, y, weight, eps, out, out_bf16);
}

}  // namespace

cudaError_t AddRmsNormF32(int64_t rows, int64_t dim, float* x, const float* y, const float* weight,
                          float eps, float* out, uint16_t* out_bf16, cudaStream_t stream) {
  return LaunchAddRmsNorm(rows, dim, x, dim, y, weight, eps, out, out_bf16, stream);
}

cudaError_t StridedRmsNormF32(int64_t rows, int64_t dim, const float* x, int64_t ldx,
                              const float* weight, float eps, float* out, uint16_t* out_bf16,
                              cudaStream_t stream) {
  // Without y the kernels only read x.
  return LaunchAddRmsNorm(rows, dim, const_cast<float*>(x), ldx, nullptr, weight, eps, out,
                          out_bf16, stream);
}

bool AddRmsNormFp8Supports(int64_t rows, int64_t dim, const float* x, const float* y,
                           const float* weight, const float* out, const uint16_t* out_bf16,
                           const RmsNormFp8Out& fp8) {
  return rows >= 0 && fp8.m_pad >= rows && fp8.m_pad <= 0x7fffffff && dim > 0 && dim % 16 == 0 &&
         dim <= kThreads * 28 && x != nullptr && weight != nullptr && Aligned(x, 16) &&
         Aligned(y, 16) && Aligned(weight, 16) && Aligned(out, 16) && Aligned(out_bf16, 8) &&
         fp8.q != nullptr && Aligned(fp8.q, 16) && fp8.ldq >= dim && fp8.ldq % 16 == 0 &&
         fp8.scales != nullptr;
}

cudaError_t AddRmsNormFp8(int64_t rows, int64_t dim, float* x, const float* y, const float* weight,
                          float eps, float* out, uint16_t* out_bf16, const RmsNormFp8Out& fp8,
                          cudaStream_t stream) {
  if (!AddRmsNormFp8Supports(rows, dim, x, y, weight, out, out_bf16, fp8)) {
    return cudaErrorInvalidValue;
  }
  if (fp8.m_pad == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(fp8.m_pad);
  if (dim <= kThreads * 8) {
    return LaunchAfterPrecedingGrids<AddRmsNormFp8Body<2>, kThreads>(
        grid, 0, stream, rows, dim, x, y, weight, eps, out, out_bf16, fp8);
  }
  if (dim <= kThreads * 16) {
    return LaunchAfterPrecedingGrids<AddRmsNormFp8Body<4>, kThreads>(
        grid, 0, stream, rows, dim, x, y, weight, eps, out, out_bf16, fp8);
  }
  return LaunchAfterPrecedingGrids<AddRmsNormFp8Body<7>, kThreads>(grid, 0, stream, rows, dim, x, y,
                                                                   weight, eps, out, out_bf16, fp8);
}

cudaError_t RmsNormF32(int64_t rows, int64_t dim, const float* x, int64_t ldx, const float* weight,
                       float eps, float* out, int64_t ldout, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return cudaSuccess;
  if (rows > 0x7fffffff) return cudaErrorInvalidValue;
  if (dim <= 2048) {
    const unsigned grid = static_cast<unsigned>((rows + kWarpRows - 1) / kWarpRows);
    static_assert(kWarpRows * 32 == kThreads, "one warp per row");
    if (dim <= 256) {
      return LaunchAfterPrecedingGrids<RmsNormWarpRowsBody<8>, kThreads>(
          grid, 0, stream, rows, dim, x, ldx, weight, eps, out, ldout);
    }
    if (dim <= 512) {
      return LaunchAfterPrecedingGrids<RmsNormWarpRowsBody<16>, kThreads>(
          grid, 0, stream, rows, dim, x, ldx, weight, eps, out, ldout);
    }
    if (dim <= 1024) {
      return LaunchAfterPrecedingGrids<RmsNormWarpRowsBody<32>, kThreads>(
          grid, 0, stream, rows, dim, x, ldx, weight, eps, out, ldout);
    }
    return LaunchAfterPrecedingGrids<RmsNormWarpRowsBody<64>, kThreads>(
        grid, 0, stream, rows, dim, x, ldx, weight, eps, out, ldout);
  }
  const unsigned grid = static_cast<unsigned>(rows);
  if (dim <= kThreads * 16) {
    return LaunchAfterPrecedingGrids<RmsNormInRegistersBody<16>, kThreads>(
        grid, 0, stream, dim, x, ldx, weight, eps, out, ldout);
  }
  if (dim <= kThreads * 32) {
    return LaunchAfterPrecedingGrids<RmsNormInRegistersBody<32>, kThreads>(
        grid, 0, stream, dim, x, ldx, weight, eps, out, ldout);
  }
  if (dim <= kThreads * 64) {
    return LaunchAfterPrecedingGrids<RmsNormInRegistersBody<64>, kThreads>(
        grid, 0, stream, dim, x, ldx, weight, eps, out, ldout);
  }
  return LaunchAfterPrecedingGrids<RmsNormBody, kThreads>(grid, 0, stream, dim, x, ldx, weight, eps,
                                                          out, ldout);
}

}  // namespace kernels
}  // namespace deepinfer
