// Absorbed multi-head latent attention (fp32 activations and math) over the paged latent KV
// cache (fp32, bf16 or FP8 entries), and the write of new latents/rope keys into that cache: the
// GPU counterparts of Backend::WriteLatentCache and Backend::MlaAttention. Prefill and decode
// tokens go through the same kernel (each query token carries its own sequence and causal context
// length). MlaAttentionF32 reads each cached key once per (token, group of 16 heads) and splits
// long contexts over several blocks (split-K); with a bf16 cache (and for DeepSeek's shape an
// FP8 one) it runs both products on tensor cores (see mla_attention.cu).
#ifndef DEEPINFER_KERNELS_ATTENTION_MLA_ATTENTION_H_
#define DEEPINFER_KERNELS_ATTENTION_MLA_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// Element type of the cache entries.
enum class LatentCacheType : int32_t { kFloat32, kBFloat16, kFp8E4M3 };

// Cache layout: entry t of block b is at element (b*block_size + t) * (latent_dim + rope_dim)
// of cache, the latent first, the rope key after; elements are fp32 or bf16 (type).
// kFp8E4M3 (the worker's worker/backend/fp8_latent_entry.h, which computes the offsets): entry
// t of block b is at byte (b*block_size + t) * fp8_entry_bytes; latent_dim e4m3 codes q_i, the
// rope key as rope_dim bf16 values at byte fp8_rope_offset, the entry's fp32 scale s at byte
// fp8_scale_offset; latent value i is e4m3(q_i) * s, s = max(amax / 448, FLT_MIN) over the
// latent's |values| and q_i = e4m3(x_i / s) (nearest even, saturating).
struct PagedLatentCache {
  void* cache = nullptr;
  int32_t block_size = 0;
  int32_t latent_dim = 0;
  int32_t rope_dim = 0;
  LatentCacheType type = LatentCacheType::kFloat32;
  int32_t fp8_rope_offset = 0;
  int32_t fp8_scale_offset = 0;
  int32_t fp8_entry_bytes = 0;
};

// Whether an FP8 cache's offsets are a layout the kernels take: the rope key within the entry
// after the latent and 2-byte aligned, the scale after it and 4-byte aligned, the entry
// 16-byte aligned.
inline bool Fp8LatentCacheLayoutValid(const PagedLatentCache& c) {
  return c.fp8_rope_offset >= c.latent_dim && c.fp8_rope_offset % 2 == 0 &&
         c.fp8_scale_offset >= c.fp8_rope_offset + 2 * c.rope_dim && c.fp8_scale_offset % 4 == 0 &&
         c.fp8_entry_bytes >= c.fp8_scale_offset + 4 && c.fp8_entry_bytes % 16 == 0;
}

// The largest latent_dim MlaAttentionF32 accepts (DeepSeek-V3: 512).
constexpr int32_t kMaxMlaLatentDim = 1024;

struct MlaAttentionParams {
  int32_t num_tokens = 0;
  int32_t num_heads = 0;
  const float* q_latent = nullptr;  // [tokens, heads, latent_dim]
  const float* q_rope = nullptr;    // (t, h, i) at q_rope[t*token_stride + h*head_stride + i]
  int64_t q_rope_token_stride = 0;
  int64_t q_rope_head_stride = 0;
  PagedLatentCache cache;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  const int32_t* token_seq = nullptr;    // [tokens]: the token's row in block_tables
  const int32_t* context_len = nullptr;  // [tokens]: cached positions the token sees (>= 1)
  float softmax_scale = 1.0f;
  float* out_latent = nullptr;  // [tokens, heads, latent_dim]
  // Split-K scratch (partial max/sum/output per context split), at least
  // MlaAttentionWorkspaceBytes(params) bytes. When null and a split is needed, MlaAttentionF32
  // allocates it with cudaMallocAsync on the stream and frees it (cudaFreeAsync) after the
  // combine; pass one to keep allocations out of the step.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Context splits per (token, head group); 0 picks them from the token count and the
  // device's SM count so that even one decode token fills the GPU. Tests and the benchmark set it.
  int32_t num_splits = 0;
  // bf16 cache, tensor-core kernel (MlaMmaVariantIsValid: 0, 4, 9, 10 or 11; the other numbers
  // belonged to variants removed after measuring slower, docs/cuda/bf16-and-kv-cache.md): 4:
  // 32-key chunks,
  // double-buffered, 2 blocks per SM, warps splitting the dot product, Q and P as bf16 hi + lo
  // pairs; 9: the key-split kernel, FlashMLA's work split: 32-key tiles, each warp scoring a
  // quarter of the keys over the whole dot product and owning a quarter of the output columns,
  // 2 blocks per SM, a short start-up (Q loaded with 16-byte loads before the first tiles'
  // copies, which are both in flight before Q is converted; the split's block-table entries in
  // shared memory), bf16 Q and P (one MMA per product: the scores carry Q's bf16 rounding, the
  // output P's; MlaAttentionBf16Operands), and 2-3 splits (kMlaClusterMergeMaxSplits) of a
  // (token, head group) run as one thread-block cluster that merges in distributed shared memory
  // (no workspace, no combine kernel; other split counts, or a device without clusters, write
  // the workspace); 9 takes latent 512 + rope 64 only, other shapes run 4; mla_attention.cu.
  // Over an FP8 cache (rope key 16-byte aligned in the entry) 9 stages the FP8 entries and
  // converts them in shared memory into bf16(e4m3(q_i) * s), the bf16 rope key as it is: the
  // bits of 9 over mla_fp8_gather.h's bf16 copy; 4 and the shapes 9 does not take run the
  // CUDA-core kernel over FP8 entries.
  // 10: the 64-head wgmma kernel (Hopper sm_90a; mla_decode_wgmma.cu): one block of two
  // warpgroups per (token, context split, group of 64 heads), 64-key tiles, bf16 Q and P as 9;
  // it takes num_heads a multiple of 64, latent 512 + rope 64, a 16-byte aligned cache (bf16, or
  // FP8 read as 9 reads it: the bits of 10 over the bf16 copy), on a compute capability 9.0
  // device; other params given 10 run the default's choice.
  // 11: the key-split kernel's ring form (mla_decode_key_split.cuh, kSplitRingStages): 9's
  // math, tiles, split merge and FP8 reading, with a ring of 4 key tiles (3 in flight while one
  // is computed) and one block per SM (so the automatic split count is about half of 9's); the
  // shapes and caches 9 takes, at any head count (groups of 16 heads); other shapes run 4. Not
  // chosen by the default (mla_attention_bench h16 times it beside 9).
  // 0 = the default: 10 where it takes the params and there are at least
  // kMlaWgmmaDefaultMinTokens tokens, else 9, else 4 for shapes 9 does not take
  // (docs/kernels/attention.md; an FP8 cache: the same choice, the CUDA-core kernel where 9
  // and 10 do not take the params). Tests and the benchmark set it.
  int32_t mma_variant = 0;
};

// The default (mma_variant 0) runs the wgmma kernel from this many tokens: at one token its
// blocks hold a few keys each and the key-split kernel is faster (docs/kernels/attention.md).
constexpr int32_t kMlaWgmmaDefaultMinTokens = 16;

// Writes token t's latent (row t of latent, stride ld_latent) and rope key (row t of rope_key,
// stride ld_rope) into cache slot slots[t] = block * block_size + offset; a bf16 cache stores
// each value rounded to nearest even (__float2bfloat16_rn, as the host's FloatToBf16Bits); an
// FP8 cache quantises the latent with its per-token scale (the bits the host's
// QuantizeFp8LatentEntry writes, padding zeroed) and rounds the rope key to bf16.
// cudaErrorInvalidValue for an FP8 layout that is not Fp8LatentCacheLayoutValid.
cudaError_t WriteLatentCacheF32(int64_t tokens, const float* latent, int64_t ld_latent,
                                const float* rope_key, int64_t ld_rope, const int32_t* slots,
                                const PagedLatentCache& cache, cudaStream_t stream);

// The largest num_splits MlaAttentionF32 accepts.
constexpr int32_t kMaxMlaSplits = 64;
// The largest MlaAttentionParams::mma_variant.
constexpr int32_t kMaxMlaMmaVariant = 11;
// Whether MlaAttentionF32 accepts `variant` as MlaAttentionParams::mma_variant: 0 (the default),
// 4, 9, 10 or 11 (kMlaMmaVariantList; the numbers of removed variants are rejected, the others
// keep their meaning).
constexpr bool MlaMmaVariantIsValid(int32_t variant) {
  return variant == 0 || variant == 4 || variant == 9 || variant == 10 ||
         variant == kMaxMlaMmaVariant;
}
// The valid values, for error messages.
constexpr char kMlaMmaVariantList[] = "0, 4, 9, 10, 11";
// Variant 9 merges its splits in a thread-block cluster at 2 to this many splits (clusters of 4
// measured slower than the workspace + combine on the H200, docs/cuda/bf16-and-kv-cache.md); other
// split counts write the workspace.
constexpr int32_t kMlaClusterMergeMaxSplits = 3;

// out[t, h] = sum_j softmax_j(scale * (q_latent[t,h]·c_j + q_rope[t,h]·k_j)) c_j over the
// first context_len[t] entries of the token's sequence. cudaErrorInvalidValue if latent_dim
// exceeds kMaxMlaLatentDim, num_splits is outside [0, kMaxMlaSplits], mma_variant is not
// MlaMmaVariantIsValid, or a given workspace is smaller than MlaAttentionWorkspaceBytes.
cudaError_t MlaAttentionF32(const MlaAttentionParams& params, cudaStream_t stream);

// Which kernel MlaAttentionF32 runs for these params on the current device: "grouped_fp8" (FP8
// cache: CUDA cores, entries dequantised to fp32 in shared memory), "mma_bf16" (bf16
// cache, latent_dim <= 512, latent_dim + rope_dim <= 640, a GPU with bf16 tensor cores),
// "mma_bf16_key_split" (the same, variant 9's kernel: latent 512 + rope 64, a 16-byte
// aligned cache), "mma_bf16_key_split_cluster" (variant 9 with its cluster merge: 2-3 splits,
// sm_90, a 16-byte aligned out_latent), "mma_fp8_key_split" and "mma_fp8_key_split_cluster"
// (the same kernel over an FP8 cache's entries), "mma_bf16_key_split_ring",
// "mma_bf16_key_split_ring_cluster", "mma_fp8_key_split_ring" and "mma_fp8_key_split_ring_cluster"
// (variant 11's ring form of that kernel), "wgmma_bf16_64_heads" (variant 10's kernel: 64
// heads a block, sm_90a), "wgmma_fp8_64_heads" (the same over FP8 entries), "grouped_bf16"
// (other bf16 shapes: CUDA cores, keys
// widened to fp32 in shared memory), "grouped_f32", or "invalid". For tests and the benchmark.
const char* MlaAttentionKernelName(const MlaAttentionParams& params);

// True when MlaAttentionF32 runs these params with Q and P rounded to bf16 (variant 9's
// key-split kernel, its ring form (11) or variant 10's wgmma kernel; false for invalid params):
// its results then match a reference over Q rounded to bf16 to within P's rounding, 2^-9 * max
// |latent| per output element (tests).
bool MlaAttentionBf16Operands(const MlaAttentionParams& params);

// True when params' cache is FP8 and MlaAttentionF32 runs them on the kernel, split count and
// merge it would run over a bf16 cache of the same shape (the key-split kernel in either form, or
// the 64-head wgmma kernel, which read FP8 entries themselves): the output is then bit for bit
// that of the call over the bf16 copy of the entries that GatherFp8LatentCacheBf16 writes
// (mla_fp8_gather.h), so a caller need not make the copy. False where the bf16 cache would run
// another kernel (variant 4, other shapes) or for invalid params.
bool MlaAttentionReadsFp8Directly(const MlaAttentionParams& params);

// Bytes of workspace MlaAttentionF32 needs for these params on the current device (0 when it
// runs without splitting). Reads the device's SM count when params.num_splits is 0.
cudaError_t MlaAttentionWorkspaceBytes(const MlaAttentionParams& params, size_t* bytes);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_ATTENTION_MLA_ATTENTION_H_
