// WeightInventory: every parameter tensor of a DeepSeek checkpoint (V3 or V4), counted from
// config.json alone, and what storing them takes in a chosen weight precision, so a memory
// plan for a full-size model can be made without loading (or having) its weights.
//
// Precisions (what a checkpoint stores, so these are the sizes of weights kept in that format on
// the device; the loader keeps only part of that today: with `--dtype auto` on cuda, a
// DeepSeek-V3 model keeps its F8_E4M3 128 x 128-block projections and MLPs FP8 with the scales
// as float32, whatever the file's scale format, and dequantises kv_b_proj, eh_proj and
// everything else to bf16; `--dtype mxfp4` (one rank) also keeps a V3 or V4 model's routed
// experts MXFP4 as counted below; DeepSeek-V4 keeps nothing else FP8 (bf16). ModelWeights::
// DeviceBytes / DeepseekV4Weights::DeviceBytes with LoadOptions::keep_fp8 / mxfp4_experts are the
// loaders' own counts):
//   bf16   every tensor in its unquantised dtype (BF16; F32 for the router correction bias and
//          the hyper-connection mixers; I64 for the hash router's token table).
//   fp8    projection matrices F8_E4M3 with one scale per 128 x 128 block (float32, or UE8M0
//          one byte); the embedding, LM head, routers, norms and other vectors as bf16.
//   mxfp4  as fp8, but routed experts MXFP4: half a byte a value plus one E8M0 byte per 32.
//
// Routed experts are split over the GPUs (expert parallelism: each GPU hosts ceil(E / G) of
// every MoE layer); everything else is replicated on every GPU (docs/model.md, "Expert
// parallelism").
//
// V4 shapes follow HF transformers' DeepseekV4 modelling code (the attention with its CSA / HCA
// compressors and indexer, hyper-connections, hash and top-k routers). Its MTP modules are not
// in that code; they are counted as the DeepSeek-V4 release stores them (`mtp.<i>.`: a decoder
// block with sliding-window attention, e_proj, h_proj, enorm, hnorm, norm, an hc head), which
// is what DeepseekV4Weights loads.
#ifndef DEEPINFER_WORKER_ENGINE_WEIGHT_INVENTORY_H_
#define DEEPINFER_WORKER_ENGINE_WEIGHT_INVENTORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {

enum class WeightPrecision { kBf16, kFp8, kMxfp4Experts };
// "bf16", "fp8", "mxfp4"; INVALID_ARGUMENT naming the value otherwise.
absl::StatusOr<WeightPrecision> ParseWeightPrecision(absl::string_view name);
const char* WeightPrecisionName(WeightPrecision precision);

enum class Fp8ScaleFormat { kFloat32, kUe8m0 };
// "f32", "ue8m0".
absl::StatusOr<Fp8ScaleFormat> ParseFp8ScaleFormat(absl::string_view name);

// Tensors of one shape and role: `count` of them, e.g. one projection in each of 58 layers.
struct ParamGroup {
  std::string name;            // e.g. "model.layers.{3..60}.mlp.experts.{0..255}.gate_proj.weight"
  std::vector<int64_t> shape;  // one tensor's
  int64_t count = 1;
  DType dtype = DType::kBF16;  // storage when not quantised
  bool linear = false;         // a projection matrix: FP8 (or MXFP4 for routed experts)
  // Routed experts: count = MoE layers x routed_experts, split over the GPUs.
  int64_t routed_experts = 0;

  int64_t elements() const;  // of one tensor
};

struct WeightInventory {
  std::string architecture;  // config.json's, e.g. "DeepseekV4ForCausalLM"
  std::vector<ParamGroup> groups;
  int64_t moe_layers = 0;      // including MTP layers when counted
  int64_t routed_experts = 0;  // per MoE layer

  int64_t parameters() const;  // all tensors' elements
};

struct WeightBytes {
  int64_t parameters = 0;
  int64_t weights = 0;  // values as stored (quantised or not)
  int64_t scales = 0;   // FP8 / MXFP4 block scales
  int64_t total() const { return weights + scales; }
  WeightBytes& operator+=(const WeightBytes& o);
};

// `count` tensors of `group`'s shape in `precision`.
WeightBytes GroupBytes(const ParamGroup& group, int64_t count, WeightPrecision precision,
                       Fp8ScaleFormat scale_format);
// What each GPU of `num_gpus` holds (the GPU with the most experts when they do not divide).
WeightBytes PerGpuWeightBytes(const WeightInventory& inventory, int64_t num_gpus,
                              WeightPrecision precision, Fp8ScaleFormat scale_format);

// The shapes of a DeepSeek-V4 config.json that the inventory uses.
struct DeepseekV4Shape {
  int64_t vocab_size = 0, hidden_size = 0, num_hidden_layers = 0;
  int64_t num_attention_heads = 0, head_dim = 0, q_lora_rank = 0;
  int64_t o_groups = 0, o_lora_rank = 0;
  int64_t n_routed_experts = 0, n_shared_experts = 0, moe_intermediate_size = 0;
  int64_t num_experts_per_tok = 0;
  int64_t index_n_heads = 0, index_head_dim = 0;
  int64_t csa_compress_rate = 0, hca_compress_rate = 0;
  int64_t sliding_window = 0, hc_mult = 0;
  int64_t num_nextn_predict_layers = 1;  // HF's default
  bool tie_word_embeddings = false;
  // Per layer: "sliding_attention", "compressed_sparse_attention",
  // "heavily_compressed_attention"; "moe" or "hash_moe".
  std::vector<std::string> layer_types, mlp_layer_types;

  static absl::StatusOr<DeepseekV4Shape> FromJson(absl::string_view json, absl::string_view source);
};

// The inventory of config.json text: DeepseekV3ForCausalLM (and the model types
// ModelConfig takes) or DeepseekV4ForCausalLM. `include_mtp`: count the
// num_nextn_predict_layers MTP layers (sharing the embedding and the LM head).
absl::StatusOr<WeightInventory> InventoryFromConfigJson(absl::string_view json,
                                                        absl::string_view source, bool include_mtp);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_ENGINE_WEIGHT_INVENTORY_H_
