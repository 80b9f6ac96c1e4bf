// DeepseekV4Config: the DeepSeek-V4 hyper-parameters (HF transformers `deepseek_v4`), parsed from
// config.json, with the legacy keys older checkpoints ship folded in as HF folds them:
// `compress_ratios` (per layer 0 / 4 / 128) for `layer_types`, `compress_rate_csa` /
// `compress_rate_hca` for `compress_rates`, `num_hash_layers` for `mlp_layer_types`,
// `qk_rope_head_dim` for `partial_rotary_factor`; a flat `rope_parameters` / `rope_scaling`
// (YaRN keys) becomes the "compress" rope, as HF nests it.
//
// The release's MTP modules (num_nextn_predict_layers, tensors `mtp.<i>.*`) are described too
// (mtp_attention); DeepseekV4Weights loads the first num_draft_layers of them.
//
// Two ropes: "main" (rope_theta, plain) for sliding-window layers, "compress"
// (compress_rope_theta, YaRN with attention_factor 1 when configured) for CSA / HCA layers,
// their compressors and the indexer. Both rotate the trailing rope_dim channels of a head,
// GPT-J interleaved.
#ifndef DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_CONFIG_H_
#define DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/model/model_config.h"

namespace deepinfer {

enum class V4AttentionKind {
  kSliding,     // sliding_attention: the window only
  kCompressed,  // heavily_compressed_attention (HCA): window + every compressed entry
  kSparse,      // compressed_sparse_attention (CSA): window + the indexer's top-k entries
};

struct DeepseekV4Config {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t head_dim = 0;  // the one shared KV head's width (K = V)
  int64_t rope_dim = 0;  // trailing channels of a head that are rotated
  int64_t q_lora_rank = 0;
  int64_t o_groups = 0;
  int64_t o_lora_rank = 0;
  int64_t sliding_window = 0;
  std::vector<V4AttentionKind> attention;  // per layer
  std::vector<int64_t> compress_rate;      // per layer (0 for sliding layers)
  std::vector<bool> hash_moe;              // per layer: experts from tid2eid[token]
  int64_t hc_mult = 1;
  int64_t hc_sinkhorn_iters = 1;
  double hc_eps = 1e-6;
  double rms_norm_eps = 1e-6;
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  double routed_scaling_factor = 1.0;
  std::string scoring_func = "sqrtsoftplus";  // or "sigmoid"
  double swiglu_limit = 0.0;                  // 0: no clamp
  int64_t max_position_embeddings = 0;
  RopeConfig main_rope;
  RopeConfig compress_rope;
  // Multi-token-prediction modules in the checkpoint (the release's `mtp.<i>.` tensors; HF's
  // default 1), and each module's attention kind and compress rate: a legacy `compress_ratios`
  // (or `layer_types`) list's entries past num_hidden_layers, one per module (V4-Flash: 0),
  // else sliding.
  int64_t num_nextn_predict_layers = 1;
  std::vector<V4AttentionKind> mtp_attention;
  std::vector<int64_t> mtp_compress_rate;
  // The modules a model loads: ModelConfig::num_draft_layers (FromModelConfig; INVALID_ARGUMENT
  // beyond num_nextn_predict_layers), 0 from FromJson.
  int64_t num_draft_layers = 0;
  // Drafts per sequence a verification step may reject: ModelConfig::speculative_tokens
  // (FromModelConfig; INVALID_ARGUMENT if negative), 0 from FromJson. Every ring of the cache
  // keeps this many spare rows (KvCacheGroupSpec::spare_rows).
  int64_t speculative_tokens = 0;

  static absl::StatusOr<DeepseekV4Config> FromJson(absl::string_view json,
                                                   absl::string_view source);
  // From ModelConfig::json (the registry hands the model a ModelConfig).
  static absl::StatusOr<DeepseekV4Config> FromModelConfig(const ModelConfig& config);

  int64_t hc_mix() const { return (2 + hc_mult) * hc_mult; }
  bool compressed(int64_t layer) const { return attention[layer] != V4AttentionKind::kSliding; }
  // rope_dim / 2 inverse frequencies of the main / compress rope (YaRN-blended when set).
  std::vector<float> MainInvFreq() const;
  std::vector<float> CompressInvFreq() const;
  // cos/sin factor of the compress rope (1 unless a YaRN config sets another attention_factor).
  float CompressAttentionFactor() const;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_CONFIG_H_
