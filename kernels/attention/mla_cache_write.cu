// WriteLatentCacheF32: new latents and rope keys into the paged latent cache (one block per
// token); an FP8 cache's latent quantised with its per-token scale.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>

#include "kernels/attention/mla_attention.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kWriteThreads = 128;

// fp32 -> cache element.
__device__ __forceinline__ void Store(float x, float* dst) { *dst = x; }
__device__ __forceinline__ void Store(float x, __nv_bfloat16* dst) {
  *dst = __float2bfloat16_rn(x);
}

template <typename T>
__global__ void WriteLatentCacheKernel(const float* latent, int64_t ld_latent,
                                       const float* rope_key, int64_t ld_rope, const int32_t* slots,
                                       PagedLatentCache cache) {
  const int64_t t = blockIdx.x;
  const int64_t entry = cache.latent_dim + cache.rope_dim;
  T* dst = static_cast<T*>(cache.cache) + static_cast<int64_t>(slots[t]) * entry;
  for (int64_t i = threadIdx.x; i < entry; i += blockDim.x) {
    Store(i < cache.latent_dim ? latent[t * ld_latent + i]
                               : rope_key[t * ld_rope + (i - cache.latent_dim)],
          dst + i);
  }
}

// The FP8 entry: the latent's amax over the block, s = max(amax / 448, FLT_MIN), codes
// e4m3(x / s) (IEEE divisions and the saturating nearest-even conversion: the host's bits).
__global__ void __launch_bounds__(kWriteThreads)
    WriteFp8LatentCacheKernel(const float* latent, int64_t ld_latent, const float* rope_key,
                              int64_t ld_rope, const int32_t* slots, PagedLatentCache cache) {
  __shared__ float warp_max[kWriteThreads / 32];
  const int64_t t = blockIdx.x;
  const float* x = latent + t * ld_latent;
  float amax = 0.0f;
  for (int i = threadIdx.x; i < cache.latent_dim; i += kWriteThreads) {
    amax = fmaxf(amax, fabsf(x[i]));
  }
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = warp_max[0];
  for (int w = 1; w < kWriteThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
  const float s = fmaxf(__fdiv_rn(amax, 448.0f), FLT_MIN);

  uint8_t* dst =
      static_cast<uint8_t*>(cache.cache) + static_cast<int64_t>(slots[t]) * cache.fp8_entry_bytes;
  for (int i = threadIdx.x; i < cache.latent_dim; i += kWriteThreads) {
    dst[i] =
        static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(x[i], s), __NV_SATFINITE, __NV_E4M3));
  }
  __nv_bfloat16* rope = reinterpret_cast<__nv_bfloat16*>(dst + cache.fp8_rope_offset);
  for (int i = threadIdx.x; i < cache.rope_dim; i += kWriteThreads) {
    rope[i] = __float2bfloat16_rn(rope_key[t * ld_rope + i]);
  }
  if (threadIdx.x == 0) *reinterpret_cast<float*>(dst + cache.fp8_scale_offset) = s;
  // The gaps (latent to rope, rope to scale) and the padding after the scale: zero, as the host.
  for (int i = cache.latent_dim + threadIdx.x; i < cache.fp8_entry_bytes; i += kWriteThreads) {
    const bool in_rope =
        i >= cache.fp8_rope_offset && i < cache.fp8_rope_offset + 2 * cache.rope_dim;
    const bool in_scale = i >= cache.fp8_scale_offset && i < cache.fp8_scale_offset + 4;
    if (!in_rope && !in_scale) dst[i] = 0;
  }
}

}  // namespace

cudaError_t WriteLatentCacheF32(int64_t tokens, const float* latent, int64_t ld_latent,
                                const float* rope_key, int64_t ld_rope, const int32_t* slots,
                                const PagedLatentCache& cache, cudaStream_t stream) {
  if (tokens <= 0) return cudaSuccess;
  if (tokens > 0x7fffffff) return cudaErrorInvalidValue;
  const unsigned grid = static_cast<unsigned>(tokens);
  if (cache.type == LatentCacheType::kBFloat16) {
    WriteLatentCacheKernel<__nv_bfloat16>
        <<<grid, kWriteThreads, 0, stream>>>(latent, ld_latent, rope_key, ld_rope, slots, cache);
  } else if (cache.type == LatentCacheType::kFloat32) {
    WriteLatentCacheKernel<float>
        <<<grid, kWriteThreads, 0, stream>>>(latent, ld_latent, rope_key, ld_rope, slots, cache);
  } else if (cache.type == LatentCacheType::kFp8E4M3 && Fp8LatentCacheLayoutValid(cache)) {
    WriteFp8LatentCacheKernel<<<grid, kWriteThreads, 0, stream>>>(latent, ld_latent, rope_key,
                                                                  ld_rope, slots, cache);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace deepinfer
