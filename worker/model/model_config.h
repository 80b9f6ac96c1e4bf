// ModelConfig: the DeepSeek-V3 architecture hyper-parameters, parsed from a checkpoint's
// config.json (DeepSeek's own files, HF transformers 4.x `rope_scaling` and 5.x
// `rope_parameters` layouts, Kimi-K2/Moonlight which reuse the architecture), plus the derived
// quantities the model needs (softmax scale, YaRN frequencies). `architectures` and
// `model_type` must name the same model (DeepseekV3ForCausalLM: deepseek_v3 or kimi_k2;
// DeepseekV4ForCausalLM: deepseek_v4).
//
// For DeepSeek-V4 only the fields every architecture shares are read here (vocabulary, hidden
// size, layers, heads, experts, norm epsilon, context length); the V4 model parses the rest
// from `json` (worker/model/deepseek_v4/v4_config.h).
#ifndef DEEPINFER_WORKER_MODEL_MODEL_CONFIG_H_
#define DEEPINFER_WORKER_MODEL_MODEL_CONFIG_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deepinfer {

struct RopeConfig {
  double theta = 10000.0;
  bool yarn = false;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;            // 0: absent
  double mscale_all_dim = 0.0;    // 0: absent
  double attention_factor = 0.0;  // 0: absent (derived, see RopeAttentionFactor)
  bool truncate = true;
};

struct ModelConfig {
  std::string architecture;  // e.g. DeepseekV3ForCausalLM
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense layers
  int64_t moe_intermediate_size = 0;  // each routed / shared expert
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t q_lora_rank = 0;  // 0: no q_lora (q_proj directly)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  std::string topk_method = "noaux_tc";
  std::string scoring_func = "sigmoid";
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  RopeConfig rope;
  bool rope_interleave = true;
  bool tie_word_embeddings = false;
  int64_t num_nextn_predict_layers = 0;
  // Multi-token-prediction modules the model loads and runs as its draft head (speculative
  // decoding, docs/engine.md), at most num_nextn_predict_layers. Not read from config.json: the
  // caller that wants drafts sets it (the rank builder from --speculative-tokens), so a model
  // built without drafting neither reads nor caches the MTP layers.
  int64_t num_draft_layers = 0;
  // Drafted tokens per sequence a step may verify (speculative decoding), set by the caller with
  // num_draft_layers (the rank builder from --speculative-tokens). A model whose cache keeps
  // per-sequence state sizes it for this many rejected drafts (DeepSeek-V4's spare ring rows,
  // CausalLm::MaxDraftsPerStep); the paged MLA cache does not depend on it.
  int64_t speculative_tokens = 0;
  // FP8 block size from quantization_config.weight_block_size ([128, 128] for DeepSeek).
  int64_t fp8_block_rows = 128;
  int64_t fp8_block_cols = 128;
  // The config.json text, for an architecture whose own fields are not above (DeepSeek-V4).
  std::string json;

  // Parses and validates config.json text; `source` (a path) is named in every error.
  static absl::StatusOr<ModelConfig> FromJson(absl::string_view json, absl::string_view source);
  static absl::StatusOr<ModelConfig> FromFile(const std::string& path);

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool IsMoeLayer(int64_t layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace &&
           layer % std::max<int64_t>(1, moe_layer_freq) == 0;
  }
  // qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 under YaRN (HF / DeepSeek).
  double SoftmaxScale() const;
  // Factor HF applies to cos/sin (1 unless YaRN with mscale != mscale_all_dim, or only one set).
  double RopeAttentionFactor() const;
  // qk_rope_head_dim / 2 inverse frequencies, YaRN-blended when configured.
  std::vector<float> RopeInvFreq() const;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_MODEL_CONFIG_H_
