// RoPE: one block per token, threads over (head, pair). cos/sin are evaluated in double from
// the fp32 angle, like the CPU reference: at positions in the thousands the fp32 sincos
// intrinsics would differ from it by more than the parity tolerance allows for.
#include <cuda_bf16.h>

#include "kernels/common/launch.cuh"
#include "kernels/rope/rope.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 128;

// Pair j of a rotary slice: its two indices and the rotated values, computed once here for both
// kernels so that the fused one gives ApplyRopeF32's bits.
struct RotatedPair {
  int64_t i0, i1;
  float y0, y1;
};

__device__ __forceinline__ RotatedPair RotatePair(const float* v, int64_t j, int64_t half,
                                                  float pos, const float* inv_freq,
                                                  float attention_factor, bool interleaved) {
  const float angle = pos * inv_freq[j];
  double s, c;
  sincos(static_cast<double>(angle), &s, &c);
  const float cs = static_cast<float>(c) * attention_factor;
  const float sn = static_cast<float>(s) * attention_factor;
  RotatedPair r;
  r.i0 = interleaved ? 2 * j : j;
  r.i1 = interleaved ? 2 * j + 1 : j + half;
  const float x0 = v[r.i0], x1 = v[r.i1];
  r.y0 = x0 * cs - x1 * sn;
  r.y1 = x1 * cs + x0 * sn;
  return r;
}

__device__ void RopeBody(int64_t heads, float* x, int64_t token_stride, int64_t head_stride,
                         int64_t rope_dim, const int32_t* positions, const float* inv_freq,
                         float attention_factor, bool interleaved) {
  const int64_t t = blockIdx.x;
  const int64_t half = rope_dim / 2;
  const float pos = static_cast<float>(positions[t]);
  for (int64_t w = threadIdx.x; w < heads * half; w += kThreads) {
    const int64_t h = w / half, j = w % half;
    float* v = x + t * token_stride + h * head_stride;
    const RotatedPair r = RotatePair(v, j, half, pos, inv_freq, attention_factor, interleaved);
    v[r.i0] = r.y0;
    v[r.i1] = r.y1;
  }
}

// The fused kernel's block: RmsNormF32's (256 threads, the same partition of the row and the
// same reduction, so the same bits).
constexpr int kNormThreads = 256;

__device__ __forceinline__ void StoreEntry(float x, float* dst) { *dst = x; }
__device__ __forceinline__ void StoreEntry(float x, __nv_bfloat16* dst) {
  *dst = __float2bfloat16_rn(x);
}

template <typename T>
__device__ void NormRopeCacheBody(NormRopeCacheParams p) {
  __shared__ float partial[kNormThreads / 32];
  __shared__ float inv_rms;
  const int64_t t = blockIdx.x;
  const int64_t latent = p.latent_dim, half = p.rope_dim / 2;
  const float* kv = p.kv + t * p.ld_kv;
  T* dst = static_cast<T*>(p.cache) + static_cast<int64_t>(p.slots[t]) * (latent + p.rope_dim);
  const float pos = static_cast<float>(p.positions[t]);
  // Query rope first: independent of the norm, it overlaps the reduction's wait.
  for (int64_t w = threadIdx.x; w < p.q_heads * half; w += kNormThreads) {
    const int64_t h = w / half, j = w % half;
    float* v = p.q + t * p.q_token_stride + h * p.q_head_stride;
    const RotatedPair r =
        RotatePair(v, j, half, pos, p.inv_freq, p.attention_factor, p.interleaved);
    v[r.i0] = r.y0;
    v[r.i1] = r.y1;
  }
  // The shared rope key, straight into the cache entry.
  for (int64_t j = threadIdx.x; j < half; j += kNormThreads) {
    const RotatedPair r =
        RotatePair(kv + latent, j, half, pos, p.inv_freq, p.attention_factor, p.interleaved);
    StoreEntry(r.y0, dst + latent + r.i0);
    StoreEntry(r.y1, dst + latent + r.i1);
  }
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < latent; i += kNormThreads) ss += kv[i] * kv[i];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kNormThreads / 32; ++w) total += partial[w];
    inv_rms = 1.0f / sqrtf(total / static_cast<float>(latent) + p.eps);
  }
  __syncthreads();
  const float inv = inv_rms;
  for (int64_t i = threadIdx.x; i < latent; i += kNormThreads) {
    StoreEntry(p.norm_weight[i] * (kv[i] * inv), dst + i);
  }
}

}  // namespace

cudaError_t ApplyRopeF32(int64_t tokens, int64_t heads, float* x, int64_t token_stride,
                         int64_t head_stride, int64_t rope_dim, const int32_t* positions,
                         const float* inv_freq, float attention_factor, bool interleaved,
                         cudaStream_t stream) {
  if (tokens <= 0 || heads <= 0 || rope_dim <= 0) return cudaSuccess;
  if (rope_dim % 2 != 0 || tokens > 0x7fffffff) return cudaErrorInvalidValue;
  return LaunchAfterPrecedingGrids<RopeBody, kThreads>(
      static_cast<unsigned>(tokens), 0, stream, heads, x, token_stride, head_stride, rope_dim,
      positions, inv_freq, attention_factor, interleaved);
}

cudaError_t NormRopeWriteLatentCacheF32(const NormRopeCacheParams& p, cudaStream_t stream) {
  if (p.tokens <= 0) return cudaSuccess;
  if (p.tokens > 0x7fffffff || p.rope_dim % 2 != 0 || p.latent_dim <= 0 || p.rope_dim < 0 ||
      (p.q_heads > 0 && p.q == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const unsigned grid = static_cast<unsigned>(p.tokens);
  if (p.cache_bf16) {
    return LaunchAfterPrecedingGrids<NormRopeCacheBody<__nv_bfloat16>, kNormThreads>(grid, 0,
                                                                                     stream, p);
  }
  return LaunchAfterPrecedingGrids<NormRopeCacheBody<float>, kNormThreads>(grid, 0, stream, p);
}

}  // namespace kernels
}  // namespace deepinfer
