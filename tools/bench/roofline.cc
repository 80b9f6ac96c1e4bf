// Roofline arithmetic. Attention FLOPs follow the form the model runs (MlaForm): absorbed, scores
// over latent + rope (2*(kv_lora+rope) per key and head) and the weighted latent sum
// (2*kv_lora); non-absorbed, scores over nope + rope and the weighted value sum (2*v).
#include "tools/bench/roofline.h"

#include <algorithm>
#include <cmath>

namespace deepinfer {
namespace {

double AttentionParams(const ModelConfig& c) {
  const double H = c.hidden_size, nh = c.num_attention_heads;
  const double q = c.q_lora_rank > 0
                       ? H * c.q_lora_rank + c.q_lora_rank + c.q_lora_rank * nh * c.qk_head_dim()
                       : H * nh * c.qk_head_dim();
  const double kv = H * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank +
                    static_cast<double>(c.kv_lora_rank) * nh * (c.qk_nope_head_dim + c.v_head_dim);
  return q + kv + nh * c.v_head_dim * H + 2 * H;  // + o_proj + the two layer norms
}

// FLOPs of attention for one query token that sees `keys` cached entries, all layers.
double AttentionFlopsPerToken(const ModelConfig& c, double keys,
                              MlaForm form = MlaForm::kAbsorbed) {
  const double per_pair =
      form == MlaForm::kAbsorbed
          ? 2.0 * (c.kv_lora_rank + c.qk_rope_head_dim) + 2.0 * c.kv_lora_rank
          : 2.0 * (c.qk_nope_head_dim + c.qk_rope_head_dim) + 2.0 * c.v_head_dim;
  return c.num_hidden_layers * c.num_attention_heads * keys * per_pair;
}

double CacheBytesPerEntry(const ModelConfig& c, double bytes_per_value) {
  return c.num_hidden_layers * static_cast<double>(c.kv_lora_rank + c.qk_rope_head_dim) *
         bytes_per_value;
}

}  // namespace

ParamCounts CountParams(const ModelConfig& c) {
  ParamCounts p;
  const double H = c.hidden_size;
  p.embedding = static_cast<double>(c.vocab_size) * H;
  const double lm_head = c.tie_word_embeddings ? 0.0 : p.embedding;
  p.per_routed_expert = 3.0 * H * c.moe_intermediate_size;
  p.total = p.embedding + lm_head + H;  // + final norm
  p.active_per_token = lm_head > 0 ? lm_head + H : p.embedding + H;
  const double attn = AttentionParams(c);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    p.total += attn;
    p.active_per_token += attn;
    if (c.IsMoeLayer(l)) {
      ++p.moe_layers;
      const double router = static_cast<double>(c.n_routed_experts) * H + c.n_routed_experts;
      const double shared = c.n_shared_experts * p.per_routed_expert;
      p.total += router + shared + c.n_routed_experts * p.per_routed_expert;
      p.active_per_token += router + shared + c.num_experts_per_tok * p.per_routed_expert;
    } else {
      p.total += 3.0 * H * c.intermediate_size;
      p.active_per_token += 3.0 * H * c.intermediate_size;
    }
  }
  return p;
}

double StepCost::RooflineSeconds(double bytes_per_s, double flops_per_s) const {
  return std::max(bytes / bytes_per_s, flops / flops_per_s);
}

StepCost DecodeStepCost(const ModelConfig& c, int64_t batch, int64_t context,
                        double bytes_per_param, double cache_bytes_per_value,
                        int64_t ranks) {
  const ParamCounts p = CountParams(c);
  const double E = c.n_routed_experts, k = c.num_experts_per_tok;
  // Expected distinct experts among all ranks' batch*top_k uniform choices (without repeats per
  // token); each rank hosts 1 / ranks of them.
  const double tokens = static_cast<double>(batch) * ranks;
  const double touched = E > 0 ? E * (1.0 - std::pow(1.0 - k / E, tokens)) / ranks : 0;
  const double routed_all = p.moe_layers * E * p.per_routed_expert;
  // The embedding table is read one row per token, unless it is also the (tied) LM head.
  const double non_expert = p.total - routed_all - (c.tie_word_embeddings ? 0.0 : p.embedding);
  StepCost s;
  s.bytes = (non_expert + p.moe_layers * touched * p.per_routed_expert +
             batch * static_cast<double>(c.hidden_size)) *
                bytes_per_param +
            batch * static_cast<double>(context + 1) * CacheBytesPerEntry(c, cache_bytes_per_value);
  s.flops = batch * (2.0 * p.active_per_token + AttentionFlopsPerToken(c, context + 1));
  return s;
}

StepCost PrefillStepCost(const ModelConfig& c, int64_t seqs, int64_t len, double bytes_per_param,
                         double cache_bytes_per_value, int64_t ranks, MlaForm form) {
  const ParamCounts p = CountParams(c);
  StepCost s;
  const double tokens = static_cast<double>(seqs) * len;
  // Routed experts other ranks host are not read here.
  const double others = p.moe_layers * static_cast<double>(c.n_routed_experts) *
                        p.per_routed_expert * (1.0 - 1.0 / ranks);
  s.bytes = (p.total - p.embedding - others + tokens * c.hidden_size) * bytes_per_param +
            tokens * CacheBytesPerEntry(c, cache_bytes_per_value);
  // Token i of a prompt attends to i + 1 entries: len*(len+1)/2 keys per prompt. The LM head
  // runs only for the last token of each prompt.
  const double keys = static_cast<double>(seqs) * len * (len + 1) / 2.0;
  const double lm_head = static_cast<double>(c.vocab_size) * c.hidden_size;
  s.flops = 2.0 * tokens * (p.active_per_token - lm_head) + 2.0 * seqs * lm_head +
            AttentionFlopsPerToken(c, 1.0, form) * keys;
  return s;
}

}  // namespace deepinfer
