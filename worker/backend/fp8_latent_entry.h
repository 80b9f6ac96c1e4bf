// The FP8 entry of the paged latent KV cache (--kv-cache-dtype fp8, PagedLatentCacheView::dtype
// kFp8E4M3), after vLLM's fp8_ds_mla layout with one scale per token: the latent (kv_lora_rank
// values, 512 for DeepSeek-V3) as e4m3 codes sharing one fp32 scale, the rotated rope key
// (qk_rope_head_dim values) kept bf16, since it carries the position and is small. Per entry,
// in bytes (L = latent_dim, R = rope_dim):
//
//   [0, L)                           latent codes q_i = e4m3(x_i / s), nearest even, saturating
//   [rope_offset, rope_offset + 2R)  rope key, bf16 bits (nearest even)
//   [scale_offset, scale_offset + 4) s = max(amax / 448, FLT_MIN), amax = max_i |x_i|, fp32
//   padding up to a multiple of 16 bytes (entries stay 16-byte aligned for vector loads)
//
// The latent value read back is e4m3_to_float(q_i) * s (within 2^-4 relative of x_i for
// |x_i| >= 2^-6 s, since e4m3 keeps 4 significant bits). DeepSeek-V3: 512 + 128 + 4 bytes,
// padded to 656 bytes a token and layer against 1152 in bf16 (1.76x the tokens).
#ifndef DEEPINFER_WORKER_BACKEND_FP8_LATENT_ENTRY_H_
#define DEEPINFER_WORKER_BACKEND_FP8_LATENT_ENTRY_H_

#include <cstdint>

namespace deepinfer {

// The most device memory the CUDA backend's attention over an FP8 cache takes at once for its bf16
// copy of the entries a call reads (worker/backend/cuda/cuda_backend_attention.cc: prefill and
// the one-token decode kernel; other decode calls read the FP8 entries directly; a call whose
// copy would be larger reads the FP8 entries with MlaAttentionF32's kernels). The memory plan
// keeps it aside twice: in the decode graphs' pool and in eager (prefill) scratch.
constexpr int64_t kFp8CacheCopyMaxBytes = int64_t{512} << 20;

// The largest finite e4m3 ("fn" variant) value: the scale maps a token's amax onto it.
constexpr float kFp8E4M3Max = 448.0f;

struct Fp8LatentEntryLayout {
  int64_t rope_offset = 0;
  int64_t scale_offset = 0;
  int64_t bytes = 0;  // of one entry, padding included
};

constexpr int64_t RoundUpTo(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

constexpr Fp8LatentEntryLayout Fp8LatentLayout(int64_t latent_dim, int64_t rope_dim) {
  const int64_t rope = RoundUpTo(latent_dim, 4);
  const int64_t scale = RoundUpTo(rope + 2 * rope_dim, 4);
  return {rope, scale, RoundUpTo(scale + 4, 16)};
}

// The per-token scale of a latent whose largest magnitude is amax: max(amax / 448, FLT_MIN),
// one IEEE division (the CUDA cache-write kernel computes the same bits).
float Fp8LatentScale(float amax);

// Writes one entry (Fp8LatentLayout(latent_dim, rope_dim).bytes at dst): the latent quantised
// with its own scale, the rope key rounded to bf16, the padding zeroed.
void QuantizeFp8LatentEntry(const float* latent, int64_t latent_dim, const float* rope_key,
                            int64_t rope_dim, uint8_t* dst);
// Reads one entry back as fp32: latent_dim latent values then rope_dim rope values into out.
void DequantizeFp8LatentEntry(const uint8_t* src, int64_t latent_dim, int64_t rope_dim, float* out);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_FP8_LATENT_ENTRY_H_
