// CopyRowsF32: a block per row, grid-strided over the rows.
#include <algorithm>
#include <cstdint>

#include "kernels/common/launch.cuh"
#include "kernels/v4/copy_rows.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 128;
constexpr int64_t kMaxBlocks = 65535;

__device__ void CopyRowsBody(CopyRowsArgs a) {
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const int64_t dst = a.dst_offsets != nullptr ? a.dst_offsets[r] : r * a.width;
    if (dst < 0) continue;
    const int64_t src = a.src_offsets != nullptr ? a.src_offsets[r] : r * a.width;
    const float* from = a.src + src;
    float* to = a.dst + dst;
    if (a.width % 4 == 0 && reinterpret_cast<uintptr_t>(from) % 16 == 0 &&
        reinterpret_cast<uintptr_t>(to) % 16 == 0) {
      const float4* f4 = reinterpret_cast<const float4*>(from);
      float4* t4 = reinterpret_cast<float4*>(to);
      for (int64_t i = threadIdx.x; i < a.width / 4; i += kThreads) t4[i] = f4[i];
    } else {
      for (int64_t i = threadIdx.x; i < a.width; i += kThreads) to[i] = from[i];
    }
  }
}

}  // namespace

cudaError_t CopyRowsF32(const CopyRowsArgs& a, cudaStream_t stream) {
  if (a.rows < 0 || a.width < 0) return cudaErrorInvalidValue;
  if (a.rows == 0 || a.width == 0) return cudaSuccess;
  if (a.src == nullptr || a.dst == nullptr) return cudaErrorInvalidValue;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(a.rows, kMaxBlocks));
  return LaunchAfterPrecedingGrids<CopyRowsBody, kThreads>(blocks, 0, stream, a);
}

}  // namespace kernels
}  // namespace deepinfer
