// Grid-stride, 64-bit indices (rows * inter exceeds 2^31 at large prefills). The vector path
// reads 8 gate and 8 up values (two 16-byte loads) and writes 8 results (one 16-byte store).
// SiluMulBf16ListedRows runs the same bodies with launch row i mapped to row_of[i].
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/common/launch.cuh"
#include "kernels/moe/expert_activation.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;

unsigned GridFor(int64_t n) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{132} * 16)));
}

__device__ __forceinline__ float Lo(unsigned v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float Hi(unsigned v) { return __uint_as_float(v & 0xffff0000u); }

// expf (not __expf): the fast intrinsic is off by several ulp for large |g|. limit > 0: V4's
// clamps first.
__device__ __forceinline__ float SiluMul(float g, float u, float limit) {
  if (limit > 0.0f) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
  }
  return g / (1.0f + expf(-g)) * u;
}

__device__ __forceinline__ unsigned Pack(float lo, float hi) {
  return static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

// The rows to compute: `rows`, or fewer when the device says so.
__device__ __forceinline__ int64_t RowsInUse(int64_t rows, const int32_t* device_rows) {
  return device_rows == nullptr ? rows : max(int64_t{0}, min(rows, int64_t{*device_rows}));
}

// Row i of the launch: row_of[i] of x and out (skipped when negative), or row i itself.
__device__ __forceinline__ int64_t RowOf(int64_t i, const int32_t* row_of) {
  return row_of == nullptr ? i : int64_t{row_of[i]};
}

__device__ void SiluMulBf16Body(int64_t rows, int64_t inter, const uint16_t* x, uint16_t* out,
                                const int32_t* device_rows, const int32_t* row_of, float limit) {
  const int64_t n = RowsInUse(rows, device_rows) * inter;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t r = RowOf(i / inter, row_of), c = i % inter;
    if (r < 0) continue;
    const float g = __uint_as_float(static_cast<unsigned>(x[r * 2 * inter + c]) << 16);
    const float u = __uint_as_float(static_cast<unsigned>(x[r * 2 * inter + inter + c]) << 16);
    out[r * inter + c] = __bfloat16_as_ushort(__float2bfloat16_rn(SiluMul(g, u, limit)));
  }
}

// inter % 8 == 0: element groups of 8 never straddle a row. Index: uint32_t when rows * inter / 8
// plus the grid's stride fits (one 32-bit division per group), else int64_t (a 64-bit division
// and modulo per group).
template <typename Index>
__device__ void SiluMulBf16x8Body(int64_t rows, int64_t inter, const uint16_t* x, uint16_t* out,
                                  const int32_t* device_rows, const int32_t* row_of, float limit) {
  const Index groups = static_cast<Index>(RowsInUse(rows, device_rows) * inter / 8);
  const Index inter8 = static_cast<Index>(inter / 8);
  const Index stride = static_cast<Index>(gridDim.x) * kThreads;
  for (Index i = static_cast<Index>(blockIdx.x) * kThreads + threadIdx.x; i < groups; i += stride) {
    const Index q = i / inter8, c = i - q * inter8;
    const int64_t r = RowOf(int64_t{q}, row_of);
    if (r < 0) continue;
    const uint4* row = reinterpret_cast<const uint4*>(x) + r * 2 * int64_t{inter8};
    const uint4 g = row[c], u = row[inter8 + c];
    uint4 o;
    o.x = Pack(SiluMul(Lo(g.x), Lo(u.x), limit), SiluMul(Hi(g.x), Hi(u.x), limit));
    o.y = Pack(SiluMul(Lo(g.y), Lo(u.y), limit), SiluMul(Hi(g.y), Hi(u.y), limit));
    o.z = Pack(SiluMul(Lo(g.z), Lo(u.z), limit), SiluMul(Hi(g.z), Hi(u.z), limit));
    o.w = Pack(SiluMul(Lo(g.w), Lo(u.w), limit), SiluMul(Hi(g.w), Hi(u.w), limit));
    reinterpret_cast<uint4*>(out + r * inter)[c] = o;
  }
}

// One launch of either body over `rows` launch rows.
cudaError_t Launch(int64_t rows, int64_t inter, const uint16_t* x, uint16_t* out,
                   cudaStream_t stream, const int32_t* device_rows, const int32_t* row_of,
                   float limit) {
  const bool vec8 = inter % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vec8) {
    const unsigned grid = GridFor(rows * inter / 8);
    if (rows * inter / 8 + int64_t{grid} * kThreads < (int64_t{1} << 32)) {
      return LaunchAfterPrecedingGrids<SiluMulBf16x8Body<uint32_t>, kThreads>(
          grid, 0, stream, rows, inter, x, out, device_rows, row_of, limit);
    }
    return LaunchAfterPrecedingGrids<SiluMulBf16x8Body<int64_t>, kThreads>(
        grid, 0, stream, rows, inter, x, out, device_rows, row_of, limit);
  }
  return LaunchAfterPrecedingGrids<SiluMulBf16Body, kThreads>(
      GridFor(rows * inter), 0, stream, rows, inter, x, out, device_rows, row_of, limit);
}

}  // namespace

cudaError_t SiluMulBf16(int64_t rows, int64_t inter, const uint16_t* x, uint16_t* out,
                        cudaStream_t stream, const int32_t* device_rows, float limit) {
  if (rows < 0 || inter < 0) return cudaErrorInvalidValue;
  if (rows == 0 || inter == 0) return cudaSuccess;
  return Launch(rows, inter, x, out, stream, device_rows, nullptr, limit);
}

cudaError_t SiluMulBf16ListedRows(int64_t listed, const int32_t* row_of, int64_t inter,
                                  const uint16_t* x, uint16_t* out, cudaStream_t stream,
                                  float limit) {
  if (listed < 0 || inter < 0 || (listed > 0 && row_of == nullptr)) return cudaErrorInvalidValue;
  if (listed == 0 || inter == 0) return cudaSuccess;
  return Launch(listed, inter, x, out, stream, nullptr, row_of, limit);
}

}  // namespace kernels
}  // namespace deepinfer
