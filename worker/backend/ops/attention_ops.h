// Attention ops: an MLA layer's attention after its cache holds this step's keys, through the
// output projection, as one call. Where the caller asks for the non-absorbed prefill form and
// the backend has it for the arguments (Backend::MhaPrefillAttention) the call runs it;
// otherwise the absorbed form, the reference: q_nope . W_uk, Backend::MlaAttention over the
// latent cache, . W_uv. Callers never see which ran.
#ifndef DEEPINFER_WORKER_BACKEND_OPS_ATTENTION_OPS_H_
#define DEEPINFER_WORKER_BACKEND_OPS_ATTENTION_OPS_H_

#include <cstdint>

#include "worker/backend/backend.h"

namespace deepinfer {

struct MlaOutputArgs {
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t nope_dim = 0;     // qk_nope_head_dim
  int64_t rope_dim = 0;     // qk_rope_head_dim (= cache.rope_dim)
  int64_t v_dim = 0;        // v_head_dim
  int64_t hidden_size = 0;  // o_proj's output width
  // [tokens, heads, nope_dim | rope_dim], the rope part already rotated; token t's heads at
  // q + t * q_token_stride (0: heads * (nope_dim + rope_dim), the tokens packed).
  const float* q = nullptr;
  int64_t q_token_stride = 0;
  // Optional: the absorbed query [tokens, heads, latent_dim] where the caller already made it
  // (Backend::NormRopeCacheAbsorbQuery); null: made here from q's nope part and w_uk.
  const float* q_latent = nullptr;
  PagedLatentCacheView cache;
  const int32_t* block_tables = nullptr;
  int32_t max_blocks_per_seq = 0;
  const int32_t* token_seq = nullptr;
  const int32_t* context_len = nullptr;
  // HOST: one span per block-table row (MlaAttentionArgs::sequences); may be empty.
  const MlaSequenceSpan* sequences = nullptr;
  int32_t num_sequences = 0;
  int32_t max_context_hint = 0;
  float softmax_scale = 1.0f;
  WeightView w_uk;    // head h: [latent_dim, nope_dim] at h * latent_dim * nope_dim
  WeightView kv_b;    // [heads * (nope_dim + v_dim), latent_dim], K_nope rows first
  WeightView o_proj;  // [hidden_size, heads * v_dim]
  // Try the non-absorbed form (needs sequences) for the sequences that bring at least
  // non_absorbed_min_tokens new tokens (0: every sequence); the others take the absorbed form,
  // each run of consecutive sequences of one form in its own calls. Where the backend declines
  // the non-absorbed op, every token takes the absorbed form in one call. Its output reaches
  // o_proj rounded to bf16 with bf16_operands.
  bool non_absorbed = false;
  int32_t non_absorbed_min_tokens = 0;
  bool bf16_operands = false;
  float* out = nullptr;  // [tokens, hidden_size], overwritten
};

void MlaAttentionOutput(Backend* backend, const MlaOutputArgs& a);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_OPS_ATTENTION_OPS_H_
