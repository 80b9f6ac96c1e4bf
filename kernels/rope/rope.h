// Rotary position embedding (fp32), interleaved or rotate-half layout, with the YaRN attention
// factor applied to cos/sin: the GPU counterpart of Backend::ApplyRope.
#ifndef DEEPINFER_KERNELS_ROPE_ROPE_H_
#define DEEPINFER_KERNELS_ROPE_ROPE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// Rotates x in place. Element (t, h, i) of the rotary slice is x[t*token_stride +
// h*head_stride + i], i < rope_dim (even). Pair j of token t turns by positions[t] *
// inv_freq[j] (formed in fp32, as HF does); interleaved pairs are (2j, 2j+1), otherwise
// (j, j + rope_dim/2). inv_freq has rope_dim/2 entries (YaRN already folded in).
cudaError_t ApplyRopeF32(int64_t tokens, int64_t heads, float* x, int64_t token_stride,
                         int64_t head_stride, int64_t rope_dim, const int32_t* positions,
                         const float* inv_freq, float attention_factor, bool interleaved,
                         cudaStream_t stream);

// The MLA layer's preparation of one step in one launch (block per token): for each token t,
//  * latent = RmsNorm(kv[t, :latent_dim]) with norm_weight and eps (RmsNormF32's arithmetic),
//  * k = the shared rope key kv[t, latent_dim:] rotated (ApplyRopeF32's arithmetic),
//  * both written to cache entry slots[t] (latent, then k; rounded to nearest even when
//    cache_bf16), as WriteLatentCacheF32 does,
//  * the q_heads rope slices of the query rotated in place (q + t*q_token_stride +
//    h*q_head_stride; q_heads 0: none).
// Bit for bit RmsNormF32 + ApplyRopeF32 (twice) + WriteLatentCacheF32. kv is only read.
struct NormRopeCacheParams {
  int64_t tokens = 0;
  const float* kv = nullptr;  // [tokens, ld_kv]: latent_dim values, then rope_dim
  int64_t ld_kv = 0;
  const float* norm_weight = nullptr;  // [latent_dim]
  float eps = 1e-6f;
  int32_t latent_dim = 0, rope_dim = 0;
  float* q = nullptr;  // the first query rope slice
  int64_t q_heads = 0, q_token_stride = 0, q_head_stride = 0;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;  // [rope_dim / 2]
  float attention_factor = 1.0f;
  bool interleaved = false;
  const int32_t* slots = nullptr;
  void* cache = nullptr;  // entries of latent_dim + rope_dim values
  bool cache_bf16 = false;
};
cudaError_t NormRopeWriteLatentCacheF32(const NormRopeCacheParams& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_ROPE_ROPE_H_
