// DeepseekV4Config parsing. nlohmann::json without exceptions: every field is looked up with
// find() and type-checked, so a malformed file gives an error naming the file and the field.
#include "worker/model/deepseek_v4/v4_config.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace deepinfer {
namespace {

using Json = nlohmann::json;

class Fields {
 public:
  Fields(const Json& j, std::string source) : j_(j), source_(std::move(source)) {}

  absl::Status Error(absl::string_view field, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": field '", field, "' ", what));
  }
  bool Has(const char* key) const {
    auto it = j_.find(key);
    return it != j_.end() && !it->is_null();
  }
  absl::Status Int(const char* key, int64_t* out, bool required = false) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) {
      return required ? Error(key, "is missing") : absl::OkStatus();
    }
    if (!it->is_number_integer()) return Error(key, "must be an integer");
    *out = it->get<int64_t>();
    return absl::OkStatus();
  }
  absl::Status Double(const char* key, double* out) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_number()) return Error(key, "must be a number");
    *out = it->get<double>();
    return absl::OkStatus();
  }
  absl::Status String(const char* key, std::string* out) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_string()) return Error(key, "must be a string");
    *out = it->get<std::string>();
    return absl::OkStatus();
  }
  absl::Status Bool(const char* key, bool* out) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_boolean()) return Error(key, "must be a boolean");
    *out = it->get<bool>();
    return absl::OkStatus();
  }
  const Json* Find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  const std::string& source() const { return source_; }

 private:
  const Json& j_;
  std::string source_;
};

#define V4_RETURN_IF_ERROR(expr) \
  do {                           \
    absl::Status _st = (expr);   \
    if (!_st.ok()) return _st;   \
  } while (0)

// One rope's parameters ({"rope_type", "rope_theta", "factor", ...}) into `rope`; theta only
// where the object names one.
absl::Status ParseRope(const Json& obj, const std::string& source, int64_t max_positions,
                       RopeConfig* rope) {
  Fields f(obj, source);
  std::string type = "default";
  V4_RETURN_IF_ERROR(f.String("type", &type));
  V4_RETURN_IF_ERROR(f.String("rope_type", &type));
  V4_RETURN_IF_ERROR(f.Double("rope_theta", &rope->theta));
  if (type == "default") return absl::OkStatus();
  if (type != "yarn") {
    return f.Error("rope_type", absl::StrCat("'", type, "' is not supported (default, yarn)"));
  }
  rope->yarn = true;
  if (!f.Has("factor")) return f.Error("factor", "is missing (YaRN)");
  V4_RETURN_IF_ERROR(f.Double("factor", &rope->factor));
  V4_RETURN_IF_ERROR(
      f.Int("original_max_position_embeddings", &rope->original_max_position_embeddings));
  V4_RETURN_IF_ERROR(f.Double("beta_fast", &rope->beta_fast));
  V4_RETURN_IF_ERROR(f.Double("beta_slow", &rope->beta_slow));
  V4_RETURN_IF_ERROR(f.Bool("truncate", &rope->truncate));
  // HF fixes a V4 compress rope's YaRN attention_factor at 1 unless the file sets one.
  rope->attention_factor = 1.0;
  V4_RETURN_IF_ERROR(f.Double("attention_factor", &rope->attention_factor));
  if (rope->original_max_position_embeddings <= 0) {
    rope->original_max_position_embeddings = max_positions;
  }
  if (rope->factor <= 0 || rope->original_max_position_embeddings <= 0) {
    return f.Error("factor", "YaRN needs factor > 0 and original_max_position_embeddings");
  }
  return absl::OkStatus();
}

std::vector<float> InvFreq(const RopeConfig& rope, int64_t rope_dim) {
  ModelConfig c;
  c.qk_rope_head_dim = rope_dim;
  c.rope = rope;
  return c.RopeInvFreq();
}

}  // namespace

absl::StatusOr<DeepseekV4Config> DeepseekV4Config::FromModelConfig(const ModelConfig& config) {
  absl::StatusOr<DeepseekV4Config> c = FromJson(config.json, "config.json");
  if (!c.ok()) return c.status();
  if (config.num_draft_layers < 0 || config.num_draft_layers > c->num_nextn_predict_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_draft_layers ", config.num_draft_layers, " is not within the model's ",
                     c->num_nextn_predict_layers, " MTP layers (num_nextn_predict_layers)"));
  }
  c->num_draft_layers = config.num_draft_layers;
  if (config.speculative_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("speculative_tokens ", config.speculative_tokens, " is negative"));
  }
  c->speculative_tokens = config.speculative_tokens;
  return c;
}

absl::StatusOr<DeepseekV4Config> DeepseekV4Config::FromJson(absl::string_view text,
                                                            absl::string_view source_name) {
  const std::string source(source_name);
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a valid JSON object"));
  }
  Fields f(j, source);
  DeepseekV4Config c;
  V4_RETURN_IF_ERROR(f.Int("vocab_size", &c.vocab_size, true));
  V4_RETURN_IF_ERROR(f.Int("hidden_size", &c.hidden_size, true));
  V4_RETURN_IF_ERROR(f.Int("num_hidden_layers", &c.num_layers, true));
  V4_RETURN_IF_ERROR(f.Int("num_attention_heads", &c.num_heads, true));
  c.head_dim = 512;
  c.q_lora_rank = 1024;
  c.o_groups = 8;
  c.o_lora_rank = 1024;
  c.sliding_window = 128;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.index_n_heads = 64;
  c.index_head_dim = 128;
  c.index_topk = 512;
  c.n_routed_experts = 256;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 6;
  c.moe_intermediate_size = 2048;
  c.routed_scaling_factor = 1.5;
  c.swiglu_limit = 10.0;
  c.max_position_embeddings = 1048576;
  c.compress_rope.theta = 160000.0;
  V4_RETURN_IF_ERROR(f.Int("head_dim", &c.head_dim));
  V4_RETURN_IF_ERROR(f.Int("q_lora_rank", &c.q_lora_rank));
  V4_RETURN_IF_ERROR(f.Int("o_groups", &c.o_groups));
  V4_RETURN_IF_ERROR(f.Int("o_lora_rank", &c.o_lora_rank));
  V4_RETURN_IF_ERROR(f.Int("sliding_window", &c.sliding_window));
  V4_RETURN_IF_ERROR(f.Int("hc_mult", &c.hc_mult));
  V4_RETURN_IF_ERROR(f.Int("hc_sinkhorn_iters", &c.hc_sinkhorn_iters));
  V4_RETURN_IF_ERROR(f.Double("hc_eps", &c.hc_eps));
  V4_RETURN_IF_ERROR(f.Double("rms_norm_eps", &c.rms_norm_eps));
  V4_RETURN_IF_ERROR(f.Int("index_n_heads", &c.index_n_heads));
  V4_RETURN_IF_ERROR(f.Int("index_head_dim", &c.index_head_dim));
  V4_RETURN_IF_ERROR(f.Int("index_topk", &c.index_topk));
  V4_RETURN_IF_ERROR(f.Int("n_routed_experts", &c.n_routed_experts));
  V4_RETURN_IF_ERROR(f.Int("n_shared_experts", &c.n_shared_experts));
  V4_RETURN_IF_ERROR(f.Int("num_experts_per_tok", &c.num_experts_per_tok));
  V4_RETURN_IF_ERROR(f.Int("moe_intermediate_size", &c.moe_intermediate_size));
  V4_RETURN_IF_ERROR(f.Double("routed_scaling_factor", &c.routed_scaling_factor));
  V4_RETURN_IF_ERROR(f.String("scoring_func", &c.scoring_func));
  V4_RETURN_IF_ERROR(f.Double("swiglu_limit", &c.swiglu_limit));
  V4_RETURN_IF_ERROR(f.Int("max_position_embeddings", &c.max_position_embeddings));
  V4_RETURN_IF_ERROR(f.Double("rope_theta", &c.main_rope.theta));
  V4_RETURN_IF_ERROR(f.Double("compress_rope_theta", &c.compress_rope.theta));
  std::string act = "silu";
  V4_RETURN_IF_ERROR(f.String("hidden_act", &act));
  if (act != "silu") return f.Error("hidden_act", absl::StrCat("'", act, "' is not supported"));
  if (c.scoring_func != "sqrtsoftplus" && c.scoring_func != "sigmoid") {
    return f.Error("scoring_func",
                   absl::StrCat("'", c.scoring_func, "' is not supported (sqrtsoftplus, sigmoid)"));
  }
  const int64_t n = c.num_layers;
  if (n <= 0) return f.Error("num_hidden_layers", "must be positive");

  // Rope width: partial_rotary_factor, else legacy qk_rope_head_dim, else 64 / 512.
  double partial = 0.0;
  V4_RETURN_IF_ERROR(f.Double("partial_rotary_factor", &partial));
  int64_t legacy_rope_dim = 0;
  V4_RETURN_IF_ERROR(f.Int("qk_rope_head_dim", &legacy_rope_dim));
  if (partial <= 0.0) partial = legacy_rope_dim > 0 ? double(legacy_rope_dim) / c.head_dim : 0.125;
  c.rope_dim = static_cast<int64_t>(c.head_dim * partial);

  // Compression rates per attention type.
  int64_t csa_rate = 4, hca_rate = 128;
  if (const Json* rates = f.Find("compress_rates")) {
    if (!rates->is_object()) return f.Error("compress_rates", "must be an object");
    Fields rf(*rates, source + ": compress_rates");
    V4_RETURN_IF_ERROR(rf.Int("compressed_sparse_attention", &csa_rate));
    V4_RETURN_IF_ERROR(rf.Int("heavily_compressed_attention", &hca_rate));
  }
  V4_RETURN_IF_ERROR(f.Int("compress_rate_csa", &csa_rate));
  V4_RETURN_IF_ERROR(f.Int("compress_rate_hca", &hca_rate));
  if (csa_rate <= 0 || hca_rate <= 0) return f.Error("compress_rates", "must be positive");

  // Layer schedule: layer_types > legacy compress_ratios > HF's default (2 HCA, then CSA / HCA).
  std::vector<V4AttentionKind> kinds;
  if (const Json* types = f.Find("layer_types")) {
    if (!types->is_array()) return f.Error("layer_types", "must be a list");
    for (const Json& t : *types) {
      const std::string s = t.is_string() ? t.get<std::string>() : "";
      if (s == "sliding_attention") {
        kinds.push_back(V4AttentionKind::kSliding);
      } else if (s == "compressed_sparse_attention") {
        kinds.push_back(V4AttentionKind::kSparse);
      } else if (s == "heavily_compressed_attention") {
        kinds.push_back(V4AttentionKind::kCompressed);
      } else {
        return f.Error("layer_types", absl::StrCat("has an unknown entry '", t.dump(), "'"));
      }
    }
  } else if (const Json* ratios = f.Find("compress_ratios")) {
    if (!ratios->is_array()) return f.Error("compress_ratios", "must be a list");
    for (const Json& r : *ratios) {
      const int64_t v = r.is_number_integer() ? r.get<int64_t>() : -1;
      if (v == 0) {
        kinds.push_back(V4AttentionKind::kSliding);
      } else if (v == 4) {
        kinds.push_back(V4AttentionKind::kSparse);
      } else if (v == 128) {
        kinds.push_back(V4AttentionKind::kCompressed);
      } else {
        return f.Error("compress_ratios",
                       absl::StrCat("has an entry ", r.dump(), " (expected 0, 4 or 128)"));
      }
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      kinds.push_back(i < 2 || i % 2 == 0 ? V4AttentionKind::kCompressed
                                          : V4AttentionKind::kSparse);
    }
  }
  if (static_cast<int64_t>(kinds.size()) < n) {
    return f.Error("layer_types",
                   absl::StrCat("has ", kinds.size(), " entries for ", n, " layers"));
  }
  auto rate = [&](V4AttentionKind k) -> int64_t {
    return k == V4AttentionKind::kSliding ? 0 : k == V4AttentionKind::kSparse ? csa_rate : hca_rate;
  };
  // MTP modules: the release's per-layer list goes on past the model's layers with one entry
  // per module (V4-Flash: 0); without one a module's attention is sliding.
  V4_RETURN_IF_ERROR(f.Int("num_nextn_predict_layers", &c.num_nextn_predict_layers));
  if (c.num_nextn_predict_layers < 0) return f.Error("num_nextn_predict_layers", "is negative");
  for (int64_t i = 0; i < c.num_nextn_predict_layers; ++i) {
    const V4AttentionKind k =
        n + i < static_cast<int64_t>(kinds.size()) ? kinds[n + i] : V4AttentionKind::kSliding;
    c.mtp_attention.push_back(k);
    c.mtp_compress_rate.push_back(rate(k));
  }
  kinds.resize(n);
  c.attention = kinds;
  for (V4AttentionKind k : kinds) c.compress_rate.push_back(rate(k));

  // MoE schedule: mlp_layer_types > legacy num_hash_layers > 3 hash layers.
  if (const Json* types = f.Find("mlp_layer_types")) {
    if (!types->is_array()) return f.Error("mlp_layer_types", "must be a list");
    for (const Json& t : *types) {
      const std::string s = t.is_string() ? t.get<std::string>() : "";
      if (s != "hash_moe" && s != "moe") {
        return f.Error("mlp_layer_types", absl::StrCat("has an unknown entry '", t.dump(), "'"));
      }
      c.hash_moe.push_back(s == "hash_moe");
    }
    if (static_cast<int64_t>(c.hash_moe.size()) < n) {
      return f.Error("mlp_layer_types", "has fewer entries than layers");
    }
    c.hash_moe.resize(n);
  } else {
    int64_t hash_layers = 3;
    V4_RETURN_IF_ERROR(f.Int("num_hash_layers", &hash_layers));
    for (int64_t i = 0; i < n; ++i) c.hash_moe.push_back(i < hash_layers);
  }

  // Ropes: nested {"main", "compress"}, or flat parameters (YaRN keys) for the compress rope.
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const Json* rp = f.Find(key);
    if (rp == nullptr) continue;
    if (!rp->is_object()) return f.Error(key, "must be an object or null");
    const std::string where = absl::StrCat(source, ": ", key);
    auto main = rp->find("main");
    auto compress = rp->find("compress");
    if (main != rp->end() && main->is_object() && compress != rp->end() && compress->is_object()) {
      V4_RETURN_IF_ERROR(
          ParseRope(*main, where + ".main", c.max_position_embeddings, &c.main_rope));
      V4_RETURN_IF_ERROR(
          ParseRope(*compress, where + ".compress", c.max_position_embeddings, &c.compress_rope));
      if (c.main_rope.yarn) return f.Error(key, "a YaRN main rope is not supported");
    } else {
      Json flat = *rp;
      flat.erase("rope_theta");  // the compress rope keeps compress_rope_theta
      V4_RETURN_IF_ERROR(ParseRope(flat, where, c.max_position_embeddings, &c.compress_rope));
    }
  }

  auto positive = [&](const char* name, int64_t v) -> absl::Status {
    if (v <= 0) return f.Error(name, absl::StrCat("must be positive, got ", v));
    return absl::OkStatus();
  };
  for (const auto& [name, v] : std::vector<std::pair<const char*, int64_t>>{
           {"vocab_size", c.vocab_size},
           {"hidden_size", c.hidden_size},
           {"num_attention_heads", c.num_heads},
           {"head_dim", c.head_dim},
           {"q_lora_rank", c.q_lora_rank},
           {"o_groups", c.o_groups},
           {"o_lora_rank", c.o_lora_rank},
           {"sliding_window", c.sliding_window},
           {"hc_mult", c.hc_mult},
           {"hc_sinkhorn_iters", c.hc_sinkhorn_iters},
           {"n_routed_experts", c.n_routed_experts},
           {"num_experts_per_tok", c.num_experts_per_tok},
           {"moe_intermediate_size", c.moe_intermediate_size}}) {
    V4_RETURN_IF_ERROR(positive(name, v));
  }
  if (c.rope_dim <= 0 || c.rope_dim % 2 != 0 || c.rope_dim > c.head_dim) {
    return f.Error("partial_rotary_factor",
                   absl::StrCat("gives a rope width of ", c.rope_dim, " for head_dim ", c.head_dim,
                                " (must be even, positive, at most head_dim)"));
  }
  if ((c.num_heads * c.head_dim) % c.o_groups != 0) {
    return f.Error("o_groups", "must divide num_attention_heads * head_dim");
  }
  if (c.num_experts_per_tok > c.n_routed_experts) {
    return f.Error("num_experts_per_tok", "exceeds n_routed_experts");
  }
  bool sparse = false;
  for (V4AttentionKind k : c.attention) sparse |= k == V4AttentionKind::kSparse;
  for (V4AttentionKind k : c.mtp_attention) sparse |= k == V4AttentionKind::kSparse;
  if (sparse) {
    V4_RETURN_IF_ERROR(positive("index_n_heads", c.index_n_heads));
    V4_RETURN_IF_ERROR(positive("index_head_dim", c.index_head_dim));
    V4_RETURN_IF_ERROR(positive("index_topk", c.index_topk));
    if (c.rope_dim > c.index_head_dim) {
      return f.Error("index_head_dim", "must be at least the rope width");
    }
  }
  return c;
}

std::vector<float> DeepseekV4Config::MainInvFreq() const { return InvFreq(main_rope, rope_dim); }

std::vector<float> DeepseekV4Config::CompressInvFreq() const {
  return InvFreq(compress_rope, rope_dim);
}

float DeepseekV4Config::CompressAttentionFactor() const {
  return compress_rope.yarn ? static_cast<float>(compress_rope.attention_factor) : 1.0f;
}

}  // namespace deepinfer
