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

// RmsNormF32 then ApplyRopeF32 (interleaved pairs) of each row's last rope_dim values, in one
// launch (a warp per row): rows r = t * heads + h of dim values at x + r * ldx, normed with
// weight and eps into out + r * ldout (which may alias x), token t's rows turned by positions[t].
// Bit for bit RmsNormF32(tokens * heads, dim, x, ldx, weight, eps, out, ldout), then
// ApplyRopeF32(tokens, heads, out + dim - rope_dim, heads * ldout, ldout, rope_dim, positions,
// inv_freq, attention_factor, true): a query's or key's per-head norm and rope (DeepSeek-V4).
// RmsNormRopeSupported: dim <= kRmsNormRopeMaxDim, rope_dim and dim - rope_dim even; otherwise
// cudaErrorInvalidValue.
// weight and inv_freq are read before the programmatic-dependent-launch wait: no kernel of the
// stream may write them (weights of the model). With RopeRows::kAuto up to 128 rows run a row a
// block (a decode token's 64 heads: 64 blocks), more rows 8 a block; kWide takes 8 a block at
// every row count (the same arithmetic; rope_bench times both).
inline constexpr int64_t kRmsNormRopeMaxDim = 2048;
enum class RopeRows {
  kAuto,  // a row a block up to 128 rows
  kWide,  // 8 rows a block
};
bool RmsNormRopeSupported(int64_t tokens, int64_t heads, int64_t dim, int64_t rope_dim);
cudaError_t RmsNormRopeF32(int64_t tokens, int64_t heads, int64_t dim, const float* x, int64_t ldx,
                           const float* weight, float eps, float* out, int64_t ldout,
                           int64_t rope_dim, const int32_t* positions, const float* inv_freq,
                           float attention_factor, cudaStream_t stream,
                           RopeRows rows_shape = RopeRows::kAuto);
// RmsNormRopeF32's values rounded to bf16 (nearest even; bits) into out + r * ldout, which must
// not overlap x: the per-head query a bf16 consumer (SinkAttentionF32's q_bf16) reads as it would
// round RmsNormRopeF32's fp32 output, one pass instead of an fp32 write and a read.
cudaError_t RmsNormRopeToBf16(int64_t tokens, int64_t heads, int64_t dim, const float* x,
                              int64_t ldx, const float* weight, float eps, uint16_t* out,
                              int64_t ldout, int64_t rope_dim, const int32_t* positions,
                              const float* inv_freq, float attention_factor, cudaStream_t stream,
                              RopeRows rows_shape = RopeRows::kAuto);
// RmsNormRopeToBf16 on rows given in bf16 (bits; widened to fp32 exactly): bit for bit
// RmsNormRopeToBf16 on the widened rows. out may be x (in place, ldout == ldx); otherwise the
// two must not overlap. The rows are read as 4-byte words, 2 rows a warp and 16 a block at every
// row count: the prefill query of a bf16 model, whose q_b GEMM writes bf16 (half the bytes read
// of RmsNormRopeToBf16, and no second buffer). Errors as RmsNormRopeToBf16, and
// cudaErrorInvalidValue for x == out with ldx != ldout, an odd ldx or x not 4-byte aligned.
cudaError_t RmsNormRopeBf16(int64_t tokens, int64_t heads, int64_t dim, const uint16_t* x,
                            int64_t ldx, const float* weight, float eps, uint16_t* out,
                            int64_t ldout, int64_t rope_dim, const int32_t* positions,
                            const float* inv_freq, float attention_factor, cudaStream_t stream);

// Two RmsNormRopeF32 calls in one launch (a's rows, then b's; blocks per the rows of both, as
// RopeRows says): bit for bit RmsNormRopeF32 on a, then on b, with the same eps, rope_dim,
// positions (token t of each), inv_freq and attention_factor: DeepSeek-V4's query heads and its
// key row at one step. b's rows must not overlap a's output nor a's rows b's output.
// RmsNormRopePairSupported: each call RmsNormRopeSupported, a.dim and b.dim in one of the
// kernel's width classes (up to 256, 512, 1024, 2048), x and out set; otherwise
// cudaErrorInvalidValue.
struct RmsNormRopeRows {
  int64_t tokens = 0, heads = 0, dim = 0;
  const float* x = nullptr;
  int64_t ldx = 0;
  const float* weight = nullptr;
  float* out = nullptr;  // may be x
  int64_t ldout = 0;
};
bool RmsNormRopePairSupported(const RmsNormRopeRows& a, const RmsNormRopeRows& b, int64_t rope_dim);
cudaError_t RmsNormRopePairF32(const RmsNormRopeRows& a, const RmsNormRopeRows& b, float eps,
                               int64_t rope_dim, const int32_t* positions, const float* inv_freq,
                               float attention_factor, cudaStream_t stream,
                               RopeRows rows_shape = RopeRows::kAuto);

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

// The absorbed MLA query of the same step: out[t, h, j] = sum_p bf16(q_nope[t, h, p]) * w[h, j, p]
// (fp32 accumulation), the W_uk product the model otherwise runs as a BatchedGemm.
struct AbsorbQueryParams {
  int64_t heads = 0, nope_dim = 0, latent_dim = 0;
  // Head h of token t: q_nope + t*q_token_stride + h*q_head_stride, nope_dim fp32 values.
  const float* q_nope = nullptr;
  int64_t q_token_stride = 0, q_head_stride = 0;
  // bf16 bits: row j of head h at w + h*latent_dim*nope_dim + j*nope_dim.
  const uint16_t* w = nullptr;
  // out + t*heads*latent_dim + h*latent_dim + j.
  float* out = nullptr;
};

// Whether NormRopeCacheAbsorbQueryF32 takes these params: 1 <= tokens <= 4, a query rope (q,
// q_heads > 0), 64 <= nope_dim <= 512 with nope_dim % 8 == 0, q_nope, its strides and w 16-byte
// aligned.
bool NormRopeCacheAbsorbQuerySupported(const NormRopeCacheParams& p, const AbsorbQueryParams& a);

// NormRopeWriteLatentCacheF32(p) and the absorbed query a in one launch (programmatic dependent
// launch: the W_uk rows are loaded before the wait): one block per token runs the former, the
// other blocks the product, with SmallMGemmBf16's row-per-group arithmetic (kRowPerGroup,
// 8/16/32 lanes a row for nope_dim from 64/128/256), so the output has the bits of
// NormRopeWriteLatentCacheF32 followed by SmallMGemmBf16 with m = tokens, batch = heads and
// algo kRowPerGroup (kAuto's choice below nope_dim 512, e.g. DeepSeek's 128). The
// query rope slices p.q (rotated in place) must not overlap a's q_nope slices. Saves one link of
// the decode step's launch chain (docs/kernels/attention.md, "Norm, rope, cache write and W_uk
// in one launch").
// cudaErrorInvalidValue (launching nothing) where NormRopeCacheAbsorbQuerySupported is false.
cudaError_t NormRopeCacheAbsorbQueryF32(const NormRopeCacheParams& p, const AbsorbQueryParams& a,
                                        cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_ROPE_ROPE_H_
