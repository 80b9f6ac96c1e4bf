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

// Slot s of a window at column d: its gate logit (gate + position bias) and its value. Slots
// below R are the previous window's with overlap (else this window's) at column d; with overlap
// this window's slots from R on are at column D + d with bias row s - R.
struct Slots {
  const float* kv;
  const float* gate;
  const float* bias;
  int64_t R, D, stride, width;
  __device__ __forceinline__ int64_t Col(int64_t s, int64_t d) const { return s < R ? d : D + d; }
  __device__ __forceinline__ float Logit(int64_t s, int64_t d) const {
    const int64_t b = s < R ? s * width + d : (s - R) * width + D + d;
    return __fadd_rn(gate[s * stride + Col(s, d)], bias[b]);
  }
  __device__ __forceinline__ float Value(int64_t s, int64_t d) const {
    return kv[s * stride + Col(s, d)];
  }
};

__device__ void WalkBody(Params p) {
  const int64_t R = p.ratio, D = p.dim, slots = p.overlap ? 2 * R : R;
  const int64_t d = int64_t{blockIdx.x} * kWalkThreads + threadIdx.x;
  if (d >= D) return;
  for (int64_t w = blockIdx.y; w < p.windows; w += gridDim.y) {
    const Slots at{p.kv + w * slots * p.stride,
                   p.gate + w * slots * p.stride,
                   p.bias,
                   R,
                   D,
                   p.stride,
                   p.width};
    // Slots [0, first) are the previous window's, absent without has_prev (see LanesBody).
    const int64_t first = p.overlap && p.has_prev[w] == 0 ? R : 0;
    float mx = -INFINITY;
#pragma unroll 8
    for (int64_t s = first; s < slots; ++s) mx = fmaxf(mx, at.Logit(s, d));
    float sum = 0.0f;
#pragma unroll 8
    for (int64_t s = first; s < slots; ++s)
      sum = __fadd_rn(sum, expf(__fsub_rn(at.Logit(s, d), mx)));
    float acc = 0.0f;
#pragma unroll 8
    for (int64_t s = first; s < slots; ++s) {
      acc = __fadd_rn(
          acc, __fmul_rn(at.Value(s, d), __fdiv_rn(expf(__fsub_rn(at.Logit(s, d), mx)), sum)));
    }
    p.out[w * D + d] = acc;
  }
}

__device__ void LanesBody(Params p) {
  __shared__ float staged[kChunk][kCols];
  __shared__ float lane_max[kLanes][kCols];
  __shared__ float column_sum[kCols];
  const int64_t R = p.ratio, D = p.dim, slots = p.overlap ? 2 * R : R;
  const int c = threadIdx.x % kCols, lane = threadIdx.x / kCols;
  const int64_t d = int64_t{blockIdx.x} * kCols + c;
  const bool valid = d < D;
  const int64_t dc = valid ? d : D - 1;  // a valid column for the loads of the padding threads
  for (int64_t w = blockIdx.y; w < p.windows; w += gridDim.y) {
    const Slots at{p.kv + w * slots * p.stride,
                   p.gate + w * slots * p.stride,
                   p.bias,
                   R,
                   D,
                   p.stride,
                   p.width};
    // Slots [0, first) are the previous window's, absent without has_prev (weight 0; the CPU's
    // 0 * (0 / sum) leaves its sums unchanged, so they are left out).
    const int64_t first = p.overlap && p.has_prev[w] == 0 ? R : 0;
    float mx = -INFINITY;
#pragma unroll 4
    for (int64_t s = first + lane; s < slots; s += kLanes) mx = fmaxf(mx, at.Logit(s, dc));
    lane_max[lane][c] = mx;
    __syncthreads();
    mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kLanes; ++i) mx = fmaxf(mx, lane_max[i][c]);
    // Pass 0 sums exp(l - max) into sum; pass 1 sums v * (exp(l - max) / sum) into acc.
    float sum = 0.0f, acc = 0.0f;
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t base = first; base < slots; base += kChunk) {
        const int n = static_cast<int>(min(static_cast<int64_t>(kChunk), slots - base));
#pragma unroll 4
        for (int i = lane; i < n; i += kLanes) {
          const float e = expf(__fsub_rn(at.Logit(base + i, dc), mx));
          staged[i][c] = pass == 0 ? e : __fmul_rn(at.Value(base + i, dc), __fdiv_rn(e, sum));
        }
        __syncthreads();
        if (lane == 0) {
          if (pass == 0) {
            for (int i = 0; i < n; ++i) sum = __fadd_rn(sum, staged[i][c]);
          } else {
            for (int i = 0; i < n; ++i) acc = __fadd_rn(acc, staged[i][c]);
          }
        }
        __syncthreads();
      }
      if (pass == 0) {
        if (lane == 0) column_sum[c] = sum;
        __syncthreads();
        sum = column_sum[c];
      }
    }
    if (lane == 0 && valid) p.out[w * D + d] = acc;
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
