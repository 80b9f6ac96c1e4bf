// PrefillAttention: which form of MLA a prefill step's attention takes (--prefill-attention).
// Only MLA attention reads it; a model without MLA ignores it.
#ifndef DEEPINFER_WORKER_MODEL_ATTENTION_PREFILL_ATTENTION_H_
#define DEEPINFER_WORKER_MODEL_ATTENTION_PREFILL_ATTENTION_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace deepinfer {

enum class PrefillAttention {
  // The non-absorbed form for each sequence that brings at least kMhaPrefillMinTokens new
  // tokens, where the backend has the op; the step's other sequences (decodes, short chunks)
  // absorbed.
  kAuto,
  // Always the absorbed form: q_nope . W_uk, attention over the 576-wide latent (MlaAttention),
  // then . W_uv.
  kAbsorbed,
  // The non-absorbed form (Backend::MhaPrefillAttention: keys expanded through kv_b, attention
  // of width nope + rope over values of width v) for each sequence that brings more than one
  // new token, where the backend has it; one-token sequences absorbed.
  kMha,
};

// kAuto's least number of new tokens per sequence for the non-absorbed form. From the FLOP
// counts and measured rates (docs/cuda/prefill.md): expanding a key costs about as much as ~50 new
// tokens' absorbed attention to it saves.
inline constexpr int32_t kMhaPrefillMinTokens = 64;

// "auto" / "absorbed" / "mha"; INVALID_ARGUMENT naming the bad value otherwise.
absl::StatusOr<PrefillAttention> ParsePrefillAttention(const std::string& name);
const char* PrefillAttentionName(PrefillAttention form);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_ATTENTION_PREFILL_ATTENTION_H_
