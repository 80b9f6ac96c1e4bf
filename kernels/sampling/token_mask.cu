// See token_mask.h.
#include <math.h>

#include <cstdint>

#include "kernels/common/launch.cuh"
#include "kernels/sampling/token_mask.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;

__device__ void MaskBody(int64_t vocab, int64_t words, float* logits, const int32_t* rows,
                         const uint32_t* masks) {
  const int64_t i = blockIdx.y;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (w >= words) return;
  const uint32_t bits = masks[i * words + w];
  if (bits == 0xffffffffu) return;
  float* row = logits + static_cast<int64_t>(rows[i]) * vocab;
  const int64_t first = w * 32;
  const int64_t count = vocab - first < 32 ? vocab - first : 32;
  for (int64_t b = 0; b < count; ++b) {
    if (!((bits >> b) & 1u)) row[first + b] = -INFINITY;
  }
}

}  // namespace

cudaError_t MaskLogitsRowsF32(int64_t n, int64_t vocab, float* logits, const int32_t* rows,
                              const uint32_t* masks, cudaStream_t stream) {
  if (n <= 0 || vocab <= 0) return cudaSuccess;
  const int64_t words = (vocab + 31) / 32;
  const dim3 grid(static_cast<unsigned>((words + kThreads - 1) / kThreads),
                  static_cast<unsigned>(n));
  return LaunchAfterPrecedingGrids<MaskBody, kThreads>(grid, 0, stream, vocab, words, logits, rows,
                                                       masks);
}

}  // namespace kernels
}  // namespace deepinfer
