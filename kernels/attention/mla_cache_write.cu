// WriteLatentCacheF32: new latents and rope keys into the paged latent cache (one block per
// token).
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/attention/mla_attention.h"

namespace deepinfer {
namespace kernels {
namespace {

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

}  // namespace

cudaError_t WriteLatentCacheF32(int64_t tokens, const float* latent, int64_t ld_latent,
                                const float* rope_key, int64_t ld_rope, const int32_t* slots,
                                const PagedLatentCache& cache, cudaStream_t stream) {
  if (tokens <= 0) return cudaSuccess;
  if (tokens > 0x7fffffff) return cudaErrorInvalidValue;
  if (cache.type == LatentCacheType::kBFloat16) {
    WriteLatentCacheKernel<__nv_bfloat16><<<static_cast<unsigned>(tokens), 128, 0, stream>>>(
        latent, ld_latent, rope_key, ld_rope, slots, cache);
  } else if (cache.type == LatentCacheType::kFloat32) {
    WriteLatentCacheKernel<float><<<static_cast<unsigned>(tokens), 128, 0, stream>>>(
        latent, ld_latent, rope_key, ld_rope, slots, cache);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace deepinfer
