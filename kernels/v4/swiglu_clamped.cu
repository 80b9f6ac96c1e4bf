// SwiGluClampedF32: grid-stride over groups of kVec columns; the row / column split of an index
// in 64-bit arithmetic (expert activations can exceed 2^31 elements).
#include <algorithm>
#include <cstdint>

#include "kernels/common/launch.cuh"
#include "kernels/v4/swiglu_clamped.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

__device__ __forceinline__ float SwiGlu(float gate, float up, float limit) {
  if (limit > 0.0f) {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
  }
  // expf (not __expf): the fast intrinsic is off by several ulp for large |gate|.
  return __fmul_rn(__fdiv_rn(gate, __fadd_rn(1.0f, expf(-gate))), up);
}

__device__ void SwiGluClampedX4Body(int64_t groups, int64_t inter4, const float* x, float limit,
                                    float* out) {
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < groups;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t r = i / inter4, c = i - r * inter4;
    const float4* row = reinterpret_cast<const float4*>(x) + r * 2 * inter4;
    const float4 g = row[c], u = row[inter4 + c];
    reinterpret_cast<float4*>(out)[i] =
        make_float4(SwiGlu(g.x, u.x, limit), SwiGlu(g.y, u.y, limit), SwiGlu(g.z, u.z, limit),
                    SwiGlu(g.w, u.w, limit));
  }
}

__device__ void SwiGluClampedBody(int64_t n, int64_t inter, const float* x, float limit,
                                  float* out) {
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t r = i / inter, c = i - r * inter;
    out[i] = SwiGlu(x[r * 2 * inter + c], x[r * 2 * inter + inter + c], limit);
  }
}

unsigned BlocksFor(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

}  // namespace

cudaError_t SwiGluClampedF32(int64_t rows, int64_t inter, const float* x, float limit, float* out,
                             cudaStream_t stream) {
  if (rows < 0 || inter < 0) return cudaErrorInvalidValue;
  if (rows == 0 || inter == 0) return cudaSuccess;
  if (inter % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    const int64_t groups = rows * (inter / 4);
    return LaunchAfterPrecedingGrids<SwiGluClampedX4Body, kThreads>(
        BlocksFor(groups), 0, stream, groups, inter / 4, x, limit, out);
  }
  const int64_t n = rows * inter;
  return LaunchAfterPrecedingGrids<SwiGluClampedBody, kThreads>(BlocksFor(n), 0, stream, n, inter,
                                                                x, limit, out);
}

}  // namespace kernels
}  // namespace deepinfer
