// CompressWindowsF32: grid (column blocks, windows); thread d of window w walks the window's
// slots three times (max, sum, weighted sum), as CpuV4Ops::CompressWindows does per column.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/common/launch.cuh"
#include "kernels/v4/compress_windows.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 128;
constexpr int64_t kMaxGridY = 65535;

struct Params {
  int64_t windows = 0, ratio = 0, dim = 0, stride = 0, width = 0;
  bool overlap = false;
  const float* kv = nullptr;
  const float* gate = nullptr;
  const float* bias = nullptr;
  const int32_t* has_prev = nullptr;
  float* out = nullptr;
};

__device__ void CompressWindowsBody(Params p) {
  const int64_t R = p.ratio, D = p.dim, slots = p.overlap ? 2 * R : R;
  const int64_t d = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  if (d >= D) return;
  for (int64_t w = blockIdx.y; w < p.windows; w += gridDim.y) {
    const float* kv = p.kv + w * slots * p.stride;
    const float* gate = p.gate + w * slots * p.stride;
    // Slots [0, first) are the previous window's, absent without has_prev (weight 0).
    const int64_t first = p.overlap && p.has_prev[w] == 0 ? R : 0;
    // Calls f(logit, value pointer) for slots first ... slots - 1 in order: the slot's gate logit
    // (gate + position bias) and its value, at column d of the slot's row (slots below R: the
    // previous window's with overlap, else this window's) or at column D + d (this window's
    // slots from R on, with overlap). Unrolled so
    // that 8 slots' loads are in flight at once (HCA walks 128 slots).
    auto walk = [&](auto&& f) {
#pragma unroll 8
      for (int64_t s = first; s < R; ++s) {
        f(__fadd_rn(gate[s * p.stride + d], p.bias[s * p.width + d]), kv + s * p.stride + d);
      }
      if (!p.overlap) return;
#pragma unroll 8
      for (int64_t s = R; s < slots; ++s) {
        f(__fadd_rn(gate[s * p.stride + D + d], p.bias[(s - R) * p.width + D + d]),
          kv + s * p.stride + D + d);
      }
    };
    float mx = -INFINITY;
    walk([&](float l, const float*) { mx = fmaxf(mx, l); });
    float sum = 0.0f;
    walk([&](float l, const float*) { sum = __fadd_rn(sum, expf(__fsub_rn(l, mx))); });
    float acc = 0.0f;
    // The absent slots add 0 * (0 / sum) = 0 on the CPU: acc is unchanged by leaving them out.
    walk([&](float l, const float* v) {
      acc = __fadd_rn(acc, __fmul_rn(*v, __fdiv_rn(expf(__fsub_rn(l, mx)), sum)));
    });
    p.out[w * D + d] = acc;
  }
}

}  // namespace

cudaError_t CompressWindowsF32(const CompressWindowsArgs& a, cudaStream_t stream) {
  const int64_t width = a.overlap ? 2 * a.dim : a.dim;
  const int64_t stride = a.row_stride > 0 ? a.row_stride : width;
  if (a.windows < 0 || a.dim < 0 || a.ratio < 1 || stride < width) return cudaErrorInvalidValue;
  if (a.windows == 0 || a.dim == 0) return cudaSuccess;
  Params p;
  p.windows = a.windows;
  p.ratio = a.ratio;
  p.dim = a.dim;
  p.stride = stride;
  p.width = width;
  p.overlap = a.overlap;
  p.kv = a.kv;
  p.gate = a.gate;
  p.bias = a.bias;
  p.has_prev = a.has_prev;
  p.out = a.out;
  const dim3 grid(static_cast<unsigned>((a.dim + kThreads - 1) / kThreads),
                  static_cast<unsigned>(std::min<int64_t>(a.windows, kMaxGridY)));
  return LaunchAfterPrecedingGrids<CompressWindowsBody, kThreads>(grid, 0, stream, p);
}

}  // namespace kernels
}  // namespace deepinfer
