// MlaAttention: DeepSeek's multi-head latent attention for every layer of a model, over a
// kPagedLatent cache group. Queries come from q_proj or q_a -> norm -> q_b; the latent and the
// shared rope key from kv_a; the cache holds the normalised latent and the rotated rope key per
// token and layer. Decode (and prefill when PrefillAttention says so) attends in the absorbed
// form: queries projected into the latent space through W_uk, outputs lifted back through W_uv;
// sequences that bring many new tokens may take the non-absorbed form (keys expanded through
// kv_b), the others in the same step staying absorbed. Another attention
// kind (sliding window, compressed sparse) is another class here with its cache kind.
#ifndef DEEPINFER_WORKER_MODEL_ATTENTION_MLA_ATTENTION_H_
#define DEEPINFER_WORKER_MODEL_ATTENTION_MLA_ATTENTION_H_

#include <cstdint>
#include <memory>

#include "worker/backend/backend.h"
#include "worker/kv_cache/kv_cache_spec.h"
#include "worker/model/attention/prefill_attention.h"
#include "worker/model/layer_context.h"
#include "worker/model/layers/residual_stream.h"
#include "worker/model/model_config.h"
#include "worker/model/model_weights.h"

namespace deepinfer {

class MlaAttention {
 public:
  // `weights` must outlive the attention (its layers' attention projections are read).
  MlaAttention(const ModelConfig& config, const ModelWeights* weights, Backend* backend);

  // The cache MLA keeps: one kPagedLatent group over every layer, the MTP modules' decoder
  // layers (ModelConfig::num_draft_layers) after the model's.
  static KvCacheSpec CacheSpec(const ModelConfig& config, WeightDType dtype);

  // out [T, hidden] = attention of layer `layer` for ctx's tokens, writing their cache entries.
  // h: the normed rows as the GEMMs take them (bf16 with ctx.mode.bf16_operands). With `norm`,
  // h is not yet written: the norm and the GEMMs that read h (q or q_a, kv_a) run as one
  // Backend::AddRmsNormGemms, h its scratch.
  void Forward(int64_t layer, const LayerContext& ctx, ActivationView h, float* out,
               const ResidualNorm* norm = nullptr);

  void set_prefill_attention(PrefillAttention form) { prefill_attention_ = form; }
  PrefillAttention prefill_attention() const { return prefill_attention_; }

 private:
  // The least number of new tokens for which a sequence of this step takes the non-absorbed
  // form (prefill_attention_); 0 where none does (the spans).
  int32_t MhaPrefillMinTokens(const LayerContext& ctx) const;
  // Per-step temporaries, written by an op before they are read (not zeroed).
  std::unique_ptr<DeviceBuffer> Floats(int64_t n) {
    return backend_->AllocateScratch(n * sizeof(float));
  }

  const ModelConfig& config_;
  const ModelWeights* const weights_;
  Backend* const backend_;
  std::unique_ptr<DeviceBuffer> inv_freq_;
  float rope_attention_factor_ = 1.0f;
  float softmax_scale_ = 1.0f;
  PrefillAttention prefill_attention_ = PrefillAttention::kAuto;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_ATTENTION_MLA_ATTENTION_H_
