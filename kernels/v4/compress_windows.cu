// CompressWindowsF32, two launches of the same arithmetic. Each column gets
// CpuV4Ops::CompressWindows's operations in its order: the max (exact in any order), then
// sum += exp(l - max) slot after slot, then acc += v * (exp(l - max) / sum) slot after slot.
//   WalkBody (from kWalkMinWindows windows: prefill): a thread per (window, column) walks the
//     window's slots three times, 8 slots' loads in flight.
//   LanesBody (fewer windows: decode): a block per (window, kCols columns), kLanes slot lanes
//     loading and exponentiating the slots in parallel into shared memory, one thread per column
//     adding them in order. At one window it takes 8 us where the walk took 20 (HCA's 128 slots
//     in series); at 8 x 4096 prefill the walk's 3 calls take 0.57 ms against the lanes' 1.23.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/common/launch.cuh"
#include "kernels/v4/compress_windows.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kWalkMinWindows = 256;
constexpr int kWalkThreads = 128;
constexpr int kCols = 16;
constexpr int kLanes = 8;
constexpr int kThreads = kCols * kLanes;
constexpr int kChunk = 64;  // slots staged at once
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

// Window w's slots at column d: each slot's gate logit (gate + position bias) and value, and
// the softmax's terms. Slots below R are the previous window's with overlap (else this window's)
// at column d; with overlap this window's slots from R on are at column D + d with bias row
// s - R. Slots [0, first) are the previous window's, absent without has_prev (weight 0; the
// CPU's 0 * (0 / sum) leaves its sums unchanged, so they are left out).
struct Window {
  const float* kv;
  const float* gate;
  const float* bias;
  int64_t R, D, stride, width, slots, first;
  __device__ __forceinline__ int64_t Col(int64_t s, int64_t d) const { return s < R ? d : D + d; }
  __device__ __forceinline__ float Logit(int64_t s, int64_t d) const {
    const int64_t b = s < R ? s * width + d : (s - R) * width + D + d;
    return __fadd_rn(gate[s * stride + Col(s, d)], bias[b]);
  }
  // exp(logit - max): the sum's term.
  __device__ __forceinline__ float Exp(int64_t s, int64_t d, float mx) const {
    return expf(__fsub_rn(Logit(s, d), mx));
  }
  // value * (exp(logit - max) / sum): the weighted sum's term.
  __device__ __forceinline__ float Weighted(int64_t s, int64_t d, float mx, float sum) const {
    return __fmul_rn(kv[s * stride + Col(s, d)], __fdiv_rn(Exp(s, d, mx), sum));
  }
};

__device__ __forceinline__ Window WindowOf(const Params& p, int64_t w) {
  const int64_t slots = p.overlap ? 2 * p.ratio : p.ratio;
  return {p.kv + w * slots * p.stride,
          p.gate + w * slots * p.stride,
          p.bias,
          p.ratio,
          p.dim,
          p.stride,
          p.width,
          slots,
          p.overlap && p.has_prev[w] == 0 ? p.ratio : 0};
}

__device__ void WalkBody(Params p) {
  const int64_t d = int64_t{blockIdx.x} * kWalkThreads + threadIdx.x;
  if (d >= p.dim) return;
  for (int64_t w = blockIdx.y; w < p.windows; w += gridDim.y) {
    const Window at = WindowOf(p, w);
    float mx = -INFINITY;
#pragma unroll 8
    for (int64_t s = at.first; s < at.slots; ++s) mx = fmaxf(mx, at.Logit(s, d));
    float sum = 0.0f;
#pragma unroll 8
    for (int64_t s = at.first; s < at.slots; ++s) sum = __fadd_rn(sum, at.Exp(s, d, mx));
    float acc = 0.0f;
#pragma unroll 8
    for (int64_t s = at.first; s < at.slots; ++s) acc = __fadd_rn(acc, at.Weighted(s, d, mx, sum));
    p.out[w * p.dim + d] = acc;
  }
}

__device__ void LanesBody(Params p) {
  __shared__ float staged[kChunk][kCols];
  __shared__ float lane_max[kLanes][kCols];
  __shared__ float column_sum[kCols];
  const int c = threadIdx.x % kCols, lane = threadIdx.x / kCols;
  const int64_t d = int64_t{blockIdx.x} * kCols + c;
  const bool valid = d < p.dim;
  const int64_t dc = valid ? d : p.dim - 1;  // a valid column for the padding threads' loads
  for (int64_t w = blockIdx.y; w < p.windows; w += gridDim.y) {
    const Window at = WindowOf(p, w);
    float mx = -INFINITY;
#pragma unroll 4
    for (int64_t s = at.first + lane; s < at.slots; s += kLanes) mx = fmaxf(mx, at.Logit(s, dc));
    lane_max[lane][c] = mx;
    __syncthreads();
    mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kLanes; ++i) mx = fmaxf(mx, lane_max[i][c]);
    // Pass 0 sums the Exp terms into sum; pass 1 the Weighted terms into acc.
    float sum = 0.0f, acc = 0.0f;
    for (int pass = 0; pass < 2; ++pass) {
      float& total = pass == 0 ? sum : acc;
      for (int64_t base = at.first; base < at.slots; base += kChunk) {
        const int n = static_cast<int>(min(static_cast<int64_t>(kChunk), at.slots - base));
#pragma unroll 4
        for (int i = lane; i < n; i += kLanes) {
          staged[i][c] = pass == 0 ? at.Exp(base + i, dc, mx) : at.Weighted(base + i, dc, mx, sum);
        }
        __syncthreads();
        if (lane == 0) {
          for (int i = 0; i < n; ++i) total = __fadd_rn(total, staged[i][c]);
        }
        __syncthreads();
      }
      if (pass == 0) {
        if (lane == 0) column_sum[c] = sum;
        __syncthreads();
        sum = column_sum[c];
      }
    }
    if (lane == 0 && valid) p.out[w * p.dim + d] = acc;
    __syncthreads();  // lane_max and column_sum are rewritten for the next window
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
  const unsigned windows = static_cast<unsigned>(std::min<int64_t>(a.windows, kMaxGridY));
  if (a.windows >= kWalkMinWindows) {
    const dim3 grid(static_cast<unsigned>((a.dim + kWalkThreads - 1) / kWalkThreads), windows);
    return LaunchAfterPrecedingGrids<WalkBody, kWalkThreads>(grid, 0, stream, p);
  }
  const dim3 grid(static_cast<unsigned>((a.dim + kCols - 1) / kCols), windows);
  return LaunchAfterPrecedingGrids<LanesBody, kThreads>(grid, 0, stream, p);
}

}  // namespace kernels
}  // namespace deepinfer
