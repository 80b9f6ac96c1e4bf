// One thread per LogitAdjustment entry (see adjust_logits.h).
#include <cstdint>

#include "kernels/common/launch.cuh"
#include "kernels/sampling/adjust_logits.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;

__device__ void AdjustBody(int64_t rows, int64_t vocab, float* logits, int64_t n,
                           const LogitAdjustment* adjustments, const int32_t* count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n || (count != nullptr && i >= *count)) return;
  const LogitAdjustment a = adjustments[i];
  if (a.row < 0 || a.row >= rows || a.token < 0 || a.token >= vocab) return;
  float* l = logits + a.row * vocab + a.token;
  *l = AdjustLogit(*l, a);
}

}  // namespace

cudaError_t AdjustLogitsF32(int64_t rows, int64_t vocab, float* logits, int64_t n,
                            const LogitAdjustment* adjustments, const int32_t* count,
                            cudaStream_t stream) {
  if (n <= 0 || rows <= 0) return cudaSuccess;
  if (vocab <= 0) return cudaErrorInvalidValue;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  return LaunchAfterPrecedingGrids<AdjustBody, kThreads>(
      dim3(static_cast<unsigned>(blocks)), 0, stream, rows, vocab, logits, n, adjustments, count);
}

}  // namespace kernels
}  // namespace deepinfer
