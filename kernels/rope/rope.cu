// RoPE: one block per token, threads over (head, pair). cos/sin are evaluated in double from
// the fp32 angle, like the CPU reference: at positions in the thousands the fp32 sincos
// intrinsics would differ from it by more than the parity tolerance allows for.
#include "kernels/rope/rope.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 128;

__global__ void RopeKernel(int64_t heads, float* x, int64_t token_stride, int64_t head_stride,
                           int64_t rope_dim, const int32_t* positions, const float* inv_freq,
                           float attention_factor, bool interleaved) {
  const int64_t t = blockIdx.x;
  const int64_t half = rope_dim / 2;
  const float pos = static_cast<float>(positions[t]);
  for (int64_t w = threadIdx.x; w < heads * half; w += kThreads) {
    const int64_t h = w / half, j = w % half;
    const float angle = pos * inv_freq[j];
    double s, c;
    sincos(static_cast<double>(angle), &s, &c);
    const float cs = static_cast<float>(c) * attention_factor;
    const float sn = static_cast<float>(s) * attention_factor;
    float* v = x + t * token_stride + h * head_stride;
    const int64_t i0 = interleaved ? 2 * j : j;
    const int64_t i1 = interleaved ? 2 * j + 1 : j + half;
    const float x0 = v[i0], x1 = v[i1];
    v[i0] = x0 * cs - x1 * sn;
    v[i1] = x1 * cs + x0 * sn;
  }
}

}  // namespace

cudaError_t ApplyRopeF32(int64_t tokens, int64_t heads, float* x, int64_t token_stride,
                         int64_t head_stride, int64_t rope_dim, const int32_t* positions,
                         const float* inv_freq, float attention_factor, bool interleaved,
                         cudaStream_t stream) {
  if (tokens <= 0 || heads <= 0 || rope_dim <= 0) return cudaSuccess;
  if (rope_dim % 2 != 0 || tokens > 0x7fffffff) return cudaErrorInvalidValue;
  RopeKernel<<<static_cast<unsigned>(tokens), kThreads, 0, stream>>>(
      heads, x, token_stride, head_stride, rope_dim, positions, inv_freq, attention_factor,
      interleaved);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace deepinfer
