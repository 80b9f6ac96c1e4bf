// WeightInventory: DeepSeek-V3 and V4 parameter shapes from config.json, bytes per precision.
#include "worker/engine/weight_inventory.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"
#include "worker/model/model_config.h"

namespace deepinfer {
namespace {

constexpr int64_t kFp8Block = 128;  // DeepSeek's 128 x 128 weight blocks
constexpr int64_t kMxBlock = 32;    // OCP MX: values per E8M0 scale

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Collects tensors by name template ("model.layers.{L}.input_layernorm.weight") and shape, and
// names each group with the layers it covers.
class InventoryBuilder {
 public:
  struct Options {
    DType dtype = DType::kBF16;
    bool linear = false;
    int64_t routed_experts = 0;  // > 0: this many tensors per layer, one per expert
  };
  void Add(const std::string& name, int64_t layer, const std::vector<int64_t>& shape,
           const Options& o) {
    Entry& e = entries_[std::make_tuple(name, shape, o.dtype, o.linear, o.routed_experts)];
    e.layers.push_back(layer);
  }
  void AddMatrix(const std::string& name, int64_t layer, int64_t rows, int64_t cols) {
    Options o;
    o.linear = true;
    Add(name, layer, {rows, cols}, o);
  }
  void AddVector(const std::string& name, int64_t layer, int64_t n, DType dtype = DType::kBF16) {
    Options o;
    o.dtype = dtype;
    Add(name, layer, {n}, o);
  }
  std::vector<ParamGroup> Build() const {
    std::vector<ParamGroup> groups;
    for (const auto& [key, e] : entries_) {
      ParamGroup g;
      g.shape = std::get<1>(key);
      g.dtype = std::get<2>(key);
      g.linear = std::get<3>(key);
      g.routed_experts = std::get<4>(key);
      g.count = static_cast<int64_t>(e.layers.size()) * std::max<int64_t>(g.routed_experts, 1);
      std::string name = std::get<0>(key);
      if (e.layers.front() >= 0) {
        const int64_t lo = e.layers.front(), hi = e.layers.back();
        const bool contiguous = hi - lo + 1 == static_cast<int64_t>(e.layers.size());
        const std::string layers =
            lo == hi ? absl::StrCat(lo)
                     : (contiguous ? absl::StrCat("{", lo, "..", hi, "}")
                                   : absl::StrCat("{", absl::StrJoin(e.layers, ","), "}"));
        name = absl::StrReplaceAll(name, {{"{L}", layers}});
      }
      if (g.routed_experts > 0) {
        name =
            absl::StrReplaceAll(name, {{"{E}", absl::StrCat("{0..", g.routed_experts - 1, "}")}});
      }
      g.name = name;
      groups.push_back(std::move(g));
    }
    return groups;
  }

 private:
  struct Entry {
    std::vector<int64_t> layers;  // -1 for tensors outside the layers
  };
  std::map<std::tuple<std::string, std::vector<int64_t>, DType, bool, int64_t>, Entry> entries_;
};

// SwiGLU experts of one layer: gate and up [inter, hidden], down [hidden, inter].
void AddExperts(InventoryBuilder& b, const std::string& prefix, int64_t layer, int64_t hidden,
                int64_t inter, int64_t experts) {
  InventoryBuilder::Options o;
  o.linear = true;
  o.routed_experts = experts;
  b.Add(prefix + "experts.{E}.gate_proj.weight", layer, {inter, hidden}, o);
  b.Add(prefix + "experts.{E}.up_proj.weight", layer, {inter, hidden}, o);
  b.Add(prefix + "experts.{E}.down_proj.weight", layer, {hidden, inter}, o);
}

void AddMlp(InventoryBuilder& b, const std::string& prefix, int64_t layer, int64_t hidden,
            int64_t inter) {
  b.AddMatrix(prefix + "gate_proj.weight", layer, inter, hidden);
  b.AddMatrix(prefix + "up_proj.weight", layer, inter, hidden);
  b.AddMatrix(prefix + "down_proj.weight", layer, hidden, inter);
}

absl::StatusOr<WeightInventory> DeepseekV3Inventory(absl::string_view json,
                                                    absl::string_view source, bool include_mtp) {
  absl::StatusOr<ModelConfig> c_or = ModelConfig::FromJson(json, source);
  if (!c_or.ok()) return c_or.status();
  const ModelConfig& c = *c_or;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads;
  InventoryBuilder b;
  const InventoryBuilder::Options plain;
  b.Add("model.embed_tokens.weight", -1, {c.vocab_size, H}, plain);
  b.AddVector("model.norm.weight", -1, H);
  if (!c.tie_word_embeddings) b.Add("lm_head.weight", -1, {c.vocab_size, H}, plain);
  WeightInventory inv;
  inv.architecture = c.architecture;
  inv.routed_experts = c.n_routed_experts;
  const int64_t layers =
      c.num_hidden_layers + (include_mtp ? c.num_nextn_predict_layers : int64_t{0});
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers.{L}.";
    b.AddVector(p + "input_layernorm.weight", l, H);
    b.AddVector(p + "post_attention_layernorm.weight", l, H);
    const std::string a = p + "self_attn.";
    if (c.q_lora_rank > 0) {
      b.AddMatrix(a + "q_a_proj.weight", l, c.q_lora_rank, H);
      b.AddVector(a + "q_a_layernorm.weight", l, c.q_lora_rank);
      b.AddMatrix(a + "q_b_proj.weight", l, nh * c.qk_head_dim(), c.q_lora_rank);
    } else {
      b.AddMatrix(a + "q_proj.weight", l, nh * c.qk_head_dim(), H);
    }
    b.AddMatrix(a + "kv_a_proj_with_mqa.weight", l, c.kv_lora_rank + c.qk_rope_head_dim, H);
    b.AddVector(a + "kv_a_layernorm.weight", l, c.kv_lora_rank);
    b.AddMatrix(a + "kv_b_proj.weight", l, nh * (c.qk_nope_head_dim + c.v_head_dim),
                c.kv_lora_rank);
    b.AddMatrix(a + "o_proj.weight", l, H, nh * c.v_head_dim);
    const std::string m = p + "mlp.";
    if (c.IsMoeLayer(l)) {
      ++inv.moe_layers;
      InventoryBuilder::Options router;
      b.Add(m + "gate.weight", l, {c.n_routed_experts, H}, router);
      b.AddVector(m + "gate.e_score_correction_bias", l, c.n_routed_experts, DType::kF32);
      AddExperts(b, m, l, H, c.moe_intermediate_size, c.n_routed_experts);
      if (c.n_shared_experts > 0) {
        AddMlp(b, m + "shared_experts.", l, H, c.n_shared_experts * c.moe_intermediate_size);
      }
    } else {
      AddMlp(b, m, l, H, c.intermediate_size);
    }
    if (l >= c.num_hidden_layers) {  // MTP glue; embedding and head shared with the model
      b.AddVector(p + "enorm.weight", l, H);
      b.AddVector(p + "hnorm.weight", l, H);
      b.AddMatrix(p + "eh_proj.weight", l, H, 2 * H);
      b.AddVector(p + "shared_head.norm.weight", l, H);
    }
  }
  inv.groups = b.Build();
  return inv;
}

absl::StatusOr<WeightInventory> DeepseekV4Inventory(absl::string_view json,
                                                    absl::string_view source, bool include_mtp) {
  absl::StatusOr<DeepseekV4Shape> s_or = DeepseekV4Shape::FromJson(json, source);
  if (!s_or.ok()) return s_or.status();
  const DeepseekV4Shape& s = *s_or;
  const int64_t H = s.hidden_size, nh = s.num_attention_heads, hd = s.head_dim;
  const int64_t ql = s.q_lora_rank, ihd = s.index_head_dim, mix = (2 + s.hc_mult) * s.hc_mult;
  InventoryBuilder b;
  const InventoryBuilder::Options plain;
  b.Add("model.embed_tokens.weight", -1, {s.vocab_size, H}, plain);
  b.AddVector("model.norm.weight", -1, H);
  if (!s.tie_word_embeddings) b.Add("lm_head.weight", -1, {s.vocab_size, H}, plain);
  InventoryBuilder::Options f32;
  f32.dtype = DType::kF32;
  b.Add("model.hc_head.hc_fn", -1, {s.hc_mult, s.hc_mult * H}, f32);
  b.AddVector("model.hc_head.hc_base", -1, s.hc_mult, DType::kF32);
  b.AddVector("model.hc_head.hc_scale", -1, 1, DType::kF32);

  WeightInventory inv;
  inv.architecture = "DeepseekV4ForCausalLM";
  inv.routed_experts = s.n_routed_experts;
  for (int64_t l = 0; l < s.num_hidden_layers; ++l) {
    const std::string& attn_kind = s.layer_types[l];
    const std::string p = "model.layers.{L}.";
    auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
      b.AddMatrix(p + name, l, rows, cols);
    };
    auto tensor = [&](const std::string& name, std::vector<int64_t> shape, DType dtype) {
      InventoryBuilder::Options o;
      o.dtype = dtype;
      b.Add(p + name, l, shape, o);
    };
    tensor("input_layernorm.weight", {H}, DType::kBF16);
    tensor("post_attention_layernorm.weight", {H}, DType::kBF16);
    for (const char* hc : {"attn_hc.", "ffn_hc."}) {
      tensor(absl::StrCat(hc, "fn"), {mix, s.hc_mult * H}, DType::kF32);
      tensor(absl::StrCat(hc, "base"), {mix}, DType::kF32);
      tensor(absl::StrCat(hc, "scale"), {3}, DType::kF32);
    }
    const std::string a = "self_attn.";
    matrix(a + "q_a_proj.weight", ql, H);
    tensor(a + "q_a_norm.weight", {ql}, DType::kBF16);
    matrix(a + "q_b_proj.weight", nh * hd, ql);
    matrix(a + "kv_proj.weight", hd, H);
    tensor(a + "kv_norm.weight", {hd}, DType::kBF16);
    matrix(a + "o_a_proj.weight", s.o_groups * s.o_lora_rank, nh * hd / s.o_groups);
    matrix(a + "o_b_proj.weight", H, s.o_groups * s.o_lora_rank);
    tensor(a + "sinks", {nh}, DType::kF32);
    const std::string cp = a + "compressor.";
    if (attn_kind == "compressed_sparse_attention") {
      matrix(cp + "kv_proj.weight", 2 * hd, H);
      matrix(cp + "gate_proj.weight", 2 * hd, H);
      tensor(cp + "position_bias", {s.csa_compress_rate, 2 * hd}, DType::kF32);
      tensor(cp + "kv_norm.weight", {hd}, DType::kBF16);
      const std::string ix = cp + "indexer.";
      matrix(ix + "kv_proj.weight", 2 * ihd, H);
      matrix(ix + "gate_proj.weight", 2 * ihd, H);
      tensor(ix + "position_bias", {s.csa_compress_rate, 2 * ihd}, DType::kF32);
      tensor(ix + "kv_norm.weight", {ihd}, DType::kBF16);
      matrix(ix + "q_b_proj.weight", s.index_n_heads * ihd, ql);
      matrix(ix + "scorer.weights_proj.weight", s.index_n_heads, H);
    } else if (attn_kind == "heavily_compressed_attention") {
      matrix(cp + "kv_proj.weight", hd, H);
      matrix(cp + "gate_proj.weight", hd, H);
      tensor(cp + "position_bias", {s.hca_compress_rate, hd}, DType::kF32);
      tensor(cp + "kv_norm.weight", {hd}, DType::kBF16);
    }
    ++inv.moe_layers;
    const std::string m = "mlp.";
    tensor(m + "gate.weight", {s.n_routed_experts, H}, DType::kBF16);
    if (s.mlp_layer_types[l] == "hash_moe") {
      tensor(m + "gate.tid2eid", {s.vocab_size, s.num_experts_per_tok}, DType::kI64);
    } else {
      tensor(m + "gate.e_score_correction_bias", {s.n_routed_experts}, DType::kF32);
    }
    AddExperts(b, p + m, l, H, s.moe_intermediate_size, s.n_routed_experts);
    const int64_t shared = s.n_shared_experts * s.moe_intermediate_size;
    matrix(m + "shared_experts.gate_proj.weight", shared, H);
    matrix(m + "shared_experts.up_proj.weight", shared, H);
    matrix(m + "shared_experts.down_proj.weight", H, shared);
  }
  // MTP modules by the release's names (what DeepseekV4Weights loads): a decoder block with
  // sliding-window attention (HF configs do not describe the module; the release's V4-Flash
  // config gives it compress ratio 0) and learned routing over every routed expert, plus
  // e_proj, h_proj, three norms and its own hc head.
  const int64_t mtp = include_mtp ? s.num_nextn_predict_layers : 0;
  for (int64_t i = 0; i < mtp; ++i) {
    const std::string p = "mtp.{L}.";
    auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
      b.AddMatrix(p + name, i, rows, cols);
    };
    auto tensor = [&](const std::string& name, std::vector<int64_t> shape, DType dtype) {
      InventoryBuilder::Options o;
      o.dtype = dtype;
      b.Add(p + name, i, shape, o);
    };
    tensor("attn_norm.weight", {H}, DType::kBF16);
    tensor("ffn_norm.weight", {H}, DType::kBF16);
    for (const char* hc : {"hc_attn_", "hc_ffn_"}) {
      tensor(absl::StrCat(hc, "fn"), {mix, s.hc_mult * H}, DType::kF32);
      tensor(absl::StrCat(hc, "base"), {mix}, DType::kF32);
      tensor(absl::StrCat(hc, "scale"), {3}, DType::kF32);
    }
    matrix("attn.wq_a.weight", ql, H);
    tensor("attn.q_norm.weight", {ql}, DType::kBF16);
    matrix("attn.wq_b.weight", nh * hd, ql);
    matrix("attn.wkv.weight", hd, H);
    tensor("attn.kv_norm.weight", {hd}, DType::kBF16);
    matrix("attn.wo_a.weight", s.o_groups * s.o_lora_rank, nh * hd / s.o_groups);
    matrix("attn.wo_b.weight", H, s.o_groups * s.o_lora_rank);
    tensor("attn.attn_sink", {nh}, DType::kF32);
    ++inv.moe_layers;
    tensor("ffn.gate.weight", {s.n_routed_experts, H}, DType::kBF16);
    tensor("ffn.gate.bias", {s.n_routed_experts}, DType::kF32);
    InventoryBuilder::Options experts;
    experts.linear = true;
    experts.routed_experts = s.n_routed_experts;
    const int64_t I = s.moe_intermediate_size, shared = s.n_shared_experts * I;
    b.Add(p + "ffn.experts.{E}.w1.weight", i, {I, H}, experts);
    b.Add(p + "ffn.experts.{E}.w3.weight", i, {I, H}, experts);
    b.Add(p + "ffn.experts.{E}.w2.weight", i, {H, I}, experts);
    matrix("ffn.shared_experts.w1.weight", shared, H);
    matrix("ffn.shared_experts.w3.weight", shared, H);
    matrix("ffn.shared_experts.w2.weight", H, shared);
    matrix("e_proj.weight", H, H);
    matrix("h_proj.weight", H, H);
    for (const char* norm : {"enorm.weight", "hnorm.weight", "norm.weight"}) {
      tensor(norm, {H}, DType::kBF16);
    }
    tensor("hc_head_fn", {s.hc_mult, s.hc_mult * H}, DType::kF32);
    tensor("hc_head_base", {s.hc_mult}, DType::kF32);
    tensor("hc_head_scale", {1}, DType::kF32);
  }
  inv.groups = b.Build();
  return inv;
}

}  // namespace

absl::StatusOr<WeightPrecision> ParseWeightPrecision(absl::string_view name) {
  if (name == "bf16") return WeightPrecision::kBf16;
  if (name == "fp8") return WeightPrecision::kFp8;
  if (name == "mxfp4") return WeightPrecision::kMxfp4Experts;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown weight precision '", name, "' (bf16, fp8 or mxfp4)"));
}

const char* WeightPrecisionName(WeightPrecision p) {
  switch (p) {
    case WeightPrecision::kBf16:
      return "bf16";
    case WeightPrecision::kFp8:
      return "fp8";
    case WeightPrecision::kMxfp4Experts:
      return "mxfp4";
  }
  return "?";
}

absl::StatusOr<Fp8ScaleFormat> ParseFp8ScaleFormat(absl::string_view name) {
  if (name == "f32") return Fp8ScaleFormat::kFloat32;
  if (name == "ue8m0") return Fp8ScaleFormat::kUe8m0;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown FP8 scale format '", name, "' (f32 or ue8m0)"));
}

int64_t ParamGroup::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t WeightInventory::parameters() const {
  int64_t n = 0;
  for (const ParamGroup& g : groups) n += g.count * g.elements();
  return n;
}

WeightBytes& WeightBytes::operator+=(const WeightBytes& o) {
  parameters += o.parameters;
  weights += o.weights;
  scales += o.scales;
  return *this;
}

WeightBytes GroupBytes(const ParamGroup& g, int64_t count, WeightPrecision precision,
                       Fp8ScaleFormat scale_format) {
  WeightBytes b;
  const int64_t n = g.elements();
  b.parameters = count * n;
  const bool matrix = g.linear && g.shape.size() == 2;
  if (matrix && precision == WeightPrecision::kMxfp4Experts && g.routed_experts > 0) {
    const int64_t rows = g.shape[0], cols = g.shape[1];
    b.weights = count * rows * CeilDiv(cols, 2);
    b.scales = count * rows * CeilDiv(cols, kMxBlock);
  } else if (matrix && precision != WeightPrecision::kBf16) {
    const int64_t rows = g.shape[0], cols = g.shape[1];
    b.weights = count * n;
    // float32 scales are what the CUDA loader keeps: each row of blocks padded to a multiple of 4
    // (cuBLASLt's 128 x 128 block scaling needs that stride; worker/model/model_weights.cc).
    const int64_t blocks = CeilDiv(cols, kFp8Block);
    b.scales = scale_format == Fp8ScaleFormat::kFloat32
                   ? count * CeilDiv(rows, kFp8Block) * CeilDiv(blocks, 4) * 4 * 4
                   : count * CeilDiv(rows, kFp8Block) * blocks;
  } else {
    b.weights = count * DTypeStorageBytes(g.dtype, n);
  }
  return b;
}

WeightBytes PerGpuWeightBytes(const WeightInventory& inv, int64_t num_gpus,
                              WeightPrecision precision, Fp8ScaleFormat scale_format) {
  WeightBytes total;
  for (const ParamGroup& g : inv.groups) {
    int64_t count = g.count;
    if (g.routed_experts > 0) {
      count =
          g.count / g.routed_experts * CeilDiv(g.routed_experts, std::max<int64_t>(num_gpus, 1));
    }
    total += GroupBytes(g, count, precision, scale_format);
  }
  return total;
}

absl::StatusOr<DeepseekV4Shape> DeepseekV4Shape::FromJson(absl::string_view json,
                                                          absl::string_view source) {
  nlohmann::json j = nlohmann::json::parse(json.begin(), json.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", why));
  };
  DeepseekV4Shape s;
  struct Field {
    const char* name;
    int64_t* value;
  };
  const Field fields[] = {{"vocab_size", &s.vocab_size},
                          {"hidden_size", &s.hidden_size},
                          {"num_hidden_layers", &s.num_hidden_layers},
                          {"num_attention_heads", &s.num_attention_heads},
                          {"head_dim", &s.head_dim},
                          {"q_lora_rank", &s.q_lora_rank},
                          {"o_groups", &s.o_groups},
                          {"o_lora_rank", &s.o_lora_rank},
                          {"n_routed_experts", &s.n_routed_experts},
                          {"moe_intermediate_size", &s.moe_intermediate_size},
                          {"num_experts_per_tok", &s.num_experts_per_tok},
                          {"index_n_heads", &s.index_n_heads},
                          {"index_head_dim", &s.index_head_dim},
                          {"sliding_window", &s.sliding_window},
                          {"hc_mult", &s.hc_mult}};
  for (const Field& f : fields) {
    auto it = j.find(f.name);
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() <= 0) {
      return bad(absl::StrCat("'", f.name, "' must be a positive integer"));
    }
    *f.value = it->get<int64_t>();
  }
  for (auto [name, value] :
       {std::pair<const char*, int64_t*>{"n_shared_experts", &s.n_shared_experts},
        {"num_nextn_predict_layers", &s.num_nextn_predict_layers}}) {
    auto it = j.find(name);
    if (it == j.end()) continue;
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      return bad(absl::StrCat("'", name, "' must be a non-negative integer"));
    }
    *value = it->get<int64_t>();
  }
  if (auto it = j.find("tie_word_embeddings"); it != j.end() && it->is_boolean()) {
    s.tie_word_embeddings = it->get<bool>();
  }
  auto rates = j.find("compress_rates");
  if (rates == j.end() || !rates->is_object()) return bad("'compress_rates' must be an object");
  for (auto [name, value] :
       {std::pair<const char*, int64_t*>{"compressed_sparse_attention", &s.csa_compress_rate},
        {"heavily_compressed_attention", &s.hca_compress_rate}}) {
    auto it = rates->find(name);
    if (it == rates->end() || !it->is_number_integer() || it->get<int64_t>() <= 0) {
      return bad(absl::StrCat("'compress_rates.", name, "' must be a positive integer"));
    }
    *value = it->get<int64_t>();
  }
  if (s.num_attention_heads * s.head_dim % s.o_groups != 0) {
    return bad(absl::StrCat("num_attention_heads x head_dim (", s.num_attention_heads * s.head_dim,
                            ") is not a multiple of o_groups (", s.o_groups, ")"));
  }
  auto kinds = [&](const char* field, std::vector<std::string>* out,
                   const std::vector<std::string>& allowed) -> absl::Status {
    auto it = j.find(field);
    if (it == j.end() || !it->is_array() ||
        static_cast<int64_t>(it->size()) != s.num_hidden_layers) {
      return bad(
          absl::StrCat("'", field, "' must list one kind per layer (", s.num_hidden_layers, ")"));
    }
    for (const auto& k : *it) {
      if (!k.is_string() ||
          std::find(allowed.begin(), allowed.end(), k.get<std::string>()) == allowed.end()) {
        return bad(absl::StrCat("'", field, "' holds ", k.dump(),
                                "; known kinds: ", absl::StrJoin(allowed, ", ")));
      }
      out->push_back(k.get<std::string>());
    }
    return absl::OkStatus();
  };
  if (absl::Status st = kinds(
          "layer_types", &s.layer_types,
          {"sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"});
      !st.ok()) {
    return st;
  }
  if (absl::Status st = kinds("mlp_layer_types", &s.mlp_layer_types, {"moe", "hash_moe"});
      !st.ok()) {
    return st;
  }
  return s;
}

absl::StatusOr<WeightInventory> InventoryFromConfigJson(absl::string_view json,
                                                        absl::string_view source,
                                                        bool include_mtp) {
  nlohmann::json j = nlohmann::json::parse(json.begin(), json.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  std::string arch;
  if (auto a = j.find("architectures");
      a != j.end() && a->is_array() && !a->empty() && (*a)[0].is_string()) {
    arch = (*a)[0].get<std::string>();
  }
  const std::string type = j.value("model_type", "");
  if (arch == "DeepseekV4ForCausalLM" || (arch.empty() && type == "deepseek_v4")) {
    return DeepseekV4Inventory(json, source, include_mtp);
  }
  return DeepseekV3Inventory(json, source, include_mtp);
}

}  // namespace deepinfer
