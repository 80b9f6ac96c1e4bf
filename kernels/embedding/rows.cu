// Gather: one block per output row. Scatter-add: one thread per column walking the rows in
// order, so no atomics and a fixed summation order (rows sharing a destination are common:
// every token appears top_k times in the expert output).
#include <algorithm>

#include "kernels/common/launch.cuh"
#include "kernels/embedding/rows.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;

__device__ void GatherRowsBody(int64_t dim, const float* src, const int32_t* idx, float* dst) {
  const float* s = src + static_cast<int64_t>(idx[blockIdx.x]) * dim;
  float* d = dst + static_cast<int64_t>(blockIdx.x) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) d[i] = s[i];
}

// 16-byte copies (dim % 4 == 0, src and dst 16-byte aligned): a quarter of the load and store
// instructions.
__device__ void GatherRowsX4Body(int64_t dim4, const float4* src, const int32_t* idx, float4* dst) {
  const float4* s = src + static_cast<int64_t>(idx[blockIdx.x]) * dim4;
  float4* d = dst + static_cast<int64_t>(blockIdx.x) * dim4;
  for (int64_t i = threadIdx.x; i < dim4; i += kThreads) d[i] = s[i];
}

__device__ void ScatterAddRowsBody(int64_t rows, int64_t dim, const float* src, const int32_t* idx,
                                   const float* weight, float* dst) {
  const int64_t c = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  if (c >= dim) return;
  for (int64_t r = 0; r < rows; ++r) {
    const float w = weight == nullptr ? 1.0f : weight[r];
    dst[static_cast<int64_t>(idx[r]) * dim + c] += w * src[r * dim + c];
  }
}

}  // namespace

cudaError_t GatherRowsF32(int64_t rows, int64_t dim, const float* src, const int32_t* idx,
                          float* dst, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return cudaSuccess;
  if (rows > 0x7fffffff) return cudaErrorInvalidValue;
  if (dim % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    return LaunchAfterPrecedingGrids<GatherRowsX4Body, kThreads>(
        static_cast<unsigned>(rows), 0, stream, dim / 4, reinterpret_cast<const float4*>(src), idx,
        reinterpret_cast<float4*>(dst));
  }
  return LaunchAfterPrecedingGrids<GatherRowsBody, kThreads>(static_cast<unsigned>(rows), 0, stream,
                                                             dim, src, idx, dst);
}

cudaError_t ScatterAddRowsF32(int64_t rows, int64_t dim, const float* src, const int32_t* idx,
                              const float* weight, float* dst, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((dim + kThreads - 1) / kThreads);
  return LaunchAfterPrecedingGrids<ScatterAddRowsBody, kThreads>(blocks, 0, stream, rows, dim, src,
                                                                 idx, weight, dst);
}

}  // namespace kernels
}  // namespace deepinfer
