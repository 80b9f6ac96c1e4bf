// DeepseekV4Weights: the DeepSeek-V4 weights one rank hosts, by HF transformers' tensor names,
// uploaded to a backend, and the first DeepseekV4Config::num_draft_layers MTP modules by the
// release's names (`mtp.<i>.`, which HF's conversion leaves as they are: V4MtpWeights). Matrices
// the GEMMs read are in the backend's weight_dtype(); norms, hyper-connection parameters, sinks,
// position biases, the routers and their biases stay fp32 (HF keeps them in fp32 too). The MoE part
// (routers, shared expert, routed experts) is held in a ModelWeights (`moe`) so that the expert
// dispatchers, EPLB loads and the dispatcher factories serve V4 as they serve V3. Routed experts
// are read from HF's fused `mlp.experts.gate_up_proj` / `down_proj` ([E, 2I, H] / [E, H, I]) or per
// expert
// (`mlp.experts.E.{gate,up,down}_proj.weight`), whichever the checkpoint has; an EPLB placement
// change reads experts again through ModelWeights::ReadRoutedExperts, which takes both. With
// LoadOptions::mxfp4_experts the routed experts (the MTP modules' too) are MXFP4 on the device
// (MatrixBuffer::mx_scales): a checkpoint's MXFP4 bytes and scales as stored, other storage (the
// dummy format among them) quantised on the host (WeightLoader::LoadMxfp4Mlp).
#ifndef DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_WEIGHTS_H_
#define DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/model/deepseek_v4/v4_config.h"
#include "worker/model/model_weights.h"
#include "worker/model/weight_source.h"

namespace deepinfer {

// One hyper-connection site: fn [(2 + hc) * hc, hc * hidden], base [(2 + hc) * hc], scale [3]
// (the head: fn [hc, hc * hidden], base [hc], scale [1]). fp32.
struct V4HyperConnectionWeights {
  std::unique_ptr<DeviceBuffer> fn, base, scale;
};

// A compressor: kv and gate projections [width, hidden] (matrices; width = head_dim, or
// 2 * head_dim with overlapping windows), position_bias [ratio, width], kv_norm [head_dim].
struct V4CompressorWeights {
  int64_t dim = 0;  // the entry width
  std::unique_ptr<DeviceBuffer> kv_proj, gate_proj, position_bias, kv_norm;
};

struct V4AttentionWeights {
  std::unique_ptr<DeviceBuffer> q_a, q_a_norm, q_b;  // q_a [q_lora, H], q_b [heads*D, q_lora]
  std::unique_ptr<DeviceBuffer> kv_proj, kv_norm;    // [D, H], [D]
  std::unique_ptr<DeviceBuffer> o_a;                 // [o_groups * o_lora, heads * D / o_groups]
  std::unique_ptr<DeviceBuffer> o_b;                 // [H, o_groups * o_lora]
  std::unique_ptr<DeviceBuffer> sinks;               // [heads]
  V4CompressorWeights compressor;                    // CSA / HCA layers
  V4CompressorWeights indexer;                       // CSA layers: the indexer's own compressor
  std::unique_ptr<DeviceBuffer> index_q_b;           // [index_heads * index_dim, q_lora]
  std::unique_ptr<DeviceBuffer> index_weights;       // [index_heads, H] (scorer.weights_proj)
};

struct V4LayerWeights {
  std::unique_ptr<DeviceBuffer> input_norm, post_attention_norm;
  V4HyperConnectionWeights attn_hc, ffn_hc;
  V4AttentionWeights attention;
  std::unique_ptr<DeviceBuffer> hash_table;  // int32 [vocab, top_k] (hash_moe layers)
};

// One multi-token-prediction module of the DeepSeek-V4 release (`mtp.<i>.`; HF's loader drops
// them): a decoder block of the model's kind (hyper-connection sites, attention of the module's
// kind, MoE with learned routing) on inputs e_proj(enorm(embed(token))) + h_proj(hnorm(stream))
// per residual stream, collapsed by its own hc head and norm before the model's LM head (the
// embedding and head are the model's). Held for speculative decoding; nothing runs it yet.
struct V4MtpWeights {
  std::unique_ptr<DeviceBuffer> e_proj, h_proj;      // matrices [H, H]
  std::unique_ptr<DeviceBuffer> enorm, hnorm, norm;  // [H]
  V4HyperConnectionWeights hc_head;                  // fn [hc, hc * H], base [hc], scale [1]
  V4LayerWeights block;                              // norms, hc sites, attention
  LayerWeights moe;  // router + correction bias, shared expert, every routed expert
};

struct DeepseekV4Weights {
  static absl::StatusOr<std::unique_ptr<DeepseekV4Weights>> Load(const DeepseekV4Config& config,
                                                                 WeightSource* source,
                                                                 Backend* backend,
                                                                 const LoadOptions& options);
  // Bytes Load allocates, from the shapes alone.
  static int64_t DeviceBytes(const DeepseekV4Config& config, WeightDType matrix_dtype,
                             const LoadOptions& options);
  WeightView Matrix(const std::unique_ptr<DeviceBuffer>& buf) const {
    return WeightView(buf->data(), moe.matrix_dtype);
  }
  // The MLPs' matrices (ModelWeights::Matrix; V4 loads every matrix dequantised, never FP8, the
  // routed experts MXFP4 with LoadOptions::mxfp4_experts).
  WeightView Matrix(const MatrixBuffer& m) const { return moe.Matrix(m); }

  std::unique_ptr<DeviceBuffer> embed;  // fp32 [vocab, H]
  std::unique_ptr<DeviceBuffer> final_norm;
  std::unique_ptr<DeviceBuffer> lm_head;  // matrix [vocab, H]
  V4HyperConnectionWeights hc_head;
  std::vector<V4LayerWeights> layers;
  // Every layer is a MoE layer: moe.layers[l] holds its router (+ bias for learned routing),
  // shared expert and hosted routed experts; embed / lm_head / final_norm there are unset.
  ModelWeights moe;
  // config.num_draft_layers MTP modules, each with every routed expert whatever the rank hosts
  // (as DeepSeek-V3's draft head: docs/model.md "Draft head").
  std::vector<V4MtpWeights> mtp;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_WEIGHTS_H_
