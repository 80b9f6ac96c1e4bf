// ModelConfig parsing. nlohmann::json is used without exceptions: every field is looked up
// with find() and type-checked, so a malformed file gives an error naming file and field.
#include "worker/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"

namespace deepinfer {
namespace {

using Json = nlohmann::json;

class Reader {
 public:
  Reader(const Json& j, absl::string_view source) : j_(j), source_(source) {}

  absl::Status Error(absl::string_view field, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": field '", field, "' ", what));
  }
  // Required integer.
  absl::Status Int(const char* key, int64_t* out) const {
    auto it = j_.find(key);
    if (it == j_.end()) return Error(key, "is missing");
    if (!it->is_number_integer()) return Error(key, "must be an integer");
    *out = it->get<int64_t>();
    return absl::OkStatus();
  }
  // Optional integer; null keeps the default too.
  absl::Status OptInt(const char* key, int64_t* out) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_number_integer()) return Error(key, "must be an integer or null");
    *out = it->get<int64_t>();
    return absl::OkStatus();
  }
  absl::Status OptDouble(const char* key, double* out) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_number()) return Error(key, "must be a number");
    *out = it->get<double>();
    return absl::OkStatus();
  }
  absl::Status OptBool(const char* key, bool* out) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_boolean()) return Error(key, "must be a boolean");
    *out = it->get<bool>();
    return absl::OkStatus();
  }
  absl::Status OptString(const char* key, std::string* out) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_string()) return Error(key, "must be a string");
    *out = it->get<std::string>();
    return absl::OkStatus();
  }

 private:
  const Json& j_;
  absl::string_view source_;
};

#define DI_RETURN_IF_ERROR(expr) \
  do {                           \
    absl::Status _st = (expr);   \
    if (!_st.ok()) return _st;   \
  } while (0)

// The architectures served (config.json's architectures[0]) and the model_type values their
// checkpoints carry: DeepSeek-V3, R1, V3.1 and Moonlight say deepseek_v3, Kimi-K2 kimi_k2.
struct ArchitectureModelTypes {
  absl::string_view architecture;
  absl::Span<const absl::string_view> model_types;
};
constexpr absl::string_view kDeepseekV3ModelTypes[] = {"deepseek_v3", "kimi_k2"};
constexpr absl::string_view kDeepseekV4ModelTypes[] = {"deepseek_v4"};
constexpr char kDeepseekV4Architecture[] = "DeepseekV4ForCausalLM";
constexpr ArchitectureModelTypes kKnownArchitectures[] = {
    {"DeepseekV3ForCausalLM", kDeepseekV3ModelTypes},
    {kDeepseekV4Architecture, kDeepseekV4ModelTypes},
};

// A config names its model twice (architectures, model_type). Either alone is enough; when
// both are there they must name the same model: a file that says deepseek_v4 with
// DeepseekV3ForCausalLM (an edited or half-converted config) is refused, not run as V3.
absl::Status CheckArchitecture(const std::string& architecture, const std::string& model_type,
                               absl::string_view source) {
  std::vector<std::string> supported;
  for (const ArchitectureModelTypes& known : kKnownArchitectures) {
    const bool type_matches = std::find(known.model_types.begin(), known.model_types.end(),
                                        model_type) != known.model_types.end();
    if (architecture == known.architecture) {
      if (model_type.empty() || type_matches) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": model_type '", model_type, "' does not match architectures[0] '", architecture,
          "' (whose model_type is ", absl::StrJoin(known.model_types, " or "),
          "); the file names two different models, fix one of the fields"));
    }
    if (architecture.empty() && type_matches) return absl::OkStatus();
    supported.push_back(absl::StrCat(known.architecture, " (model_type ",
                                     absl::StrJoin(known.model_types, " or "), ")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": unsupported architecture '", architecture, "' (model_type '",
                   model_type, "'); supported: ", absl::StrJoin(supported, ", ")));
}

double YarnGetMscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

// The fields of an architecture that ModelConfig only partly describes (DeepSeek-V4): what the
// engine, the memory plan and the expert dispatchers read. The model checks the rest.
absl::StatusOr<ModelConfig> SharedFieldsOnly(const Json& j, absl::string_view source,
                                             ModelConfig c) {
  Reader r(j, source);
  if (c.architecture.empty()) c.architecture = kDeepseekV4Architecture;
  // HF's DeepseekV4Config defaults, for a file that leaves a field out (as
  // worker/model/deepseek_v4/v4_config.cc does).
  c.moe_intermediate_size = 2048;
  c.n_routed_experts = 256;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 6;
  c.scoring_func = "sqrtsoftplus";
  c.routed_scaling_factor = 1.5;
  c.max_position_embeddings = 1048576;
  c.num_nextn_predict_layers = 1;
  DI_RETURN_IF_ERROR(r.Int("vocab_size", &c.vocab_size));
  DI_RETURN_IF_ERROR(r.Int("hidden_size", &c.hidden_size));
  DI_RETURN_IF_ERROR(r.OptInt("moe_intermediate_size", &c.moe_intermediate_size));
  DI_RETURN_IF_ERROR(r.Int("num_hidden_layers", &c.num_hidden_layers));
  DI_RETURN_IF_ERROR(r.Int("num_attention_heads", &c.num_attention_heads));
  DI_RETURN_IF_ERROR(r.OptInt("q_lora_rank", &c.q_lora_rank));
  DI_RETURN_IF_ERROR(r.OptInt("n_routed_experts", &c.n_routed_experts));
  DI_RETURN_IF_ERROR(r.OptInt("n_shared_experts", &c.n_shared_experts));
  DI_RETURN_IF_ERROR(r.OptInt("num_experts_per_tok", &c.num_experts_per_tok));
  DI_RETURN_IF_ERROR(r.OptString("scoring_func", &c.scoring_func));
  DI_RETURN_IF_ERROR(r.OptDouble("routed_scaling_factor", &c.routed_scaling_factor));
  DI_RETURN_IF_ERROR(r.OptDouble("rms_norm_eps", &c.rms_norm_eps));
  DI_RETURN_IF_ERROR(r.OptInt("max_position_embeddings", &c.max_position_embeddings));
  DI_RETURN_IF_ERROR(r.OptBool("tie_word_embeddings", &c.tie_word_embeddings));
  DI_RETURN_IF_ERROR(r.OptInt("num_nextn_predict_layers", &c.num_nextn_predict_layers));
  c.intermediate_size = c.moe_intermediate_size;  // the shared expert's width
  for (const auto& [name, v] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
                                {"hidden_size", c.hidden_size},
                                {"num_hidden_layers", c.num_hidden_layers},
                                {"num_attention_heads", c.num_attention_heads}}) {
    if (v <= 0) return r.Error(name, absl::StrCat("must be positive, got ", v));
  }
  return c;
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromJson(absl::string_view text,
                                                  absl::string_view source) {
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a valid JSON object"));
  }
  Reader r(j, source);
  ModelConfig c;
  auto arch = j.find("architectures");
  if (arch != j.end() && arch->is_array() && !arch->empty() && (*arch)[0].is_string()) {
    c.architecture = (*arch)[0].get<std::string>();
  }
  DI_RETURN_IF_ERROR(r.OptString("model_type", &c.model_type));
  DI_RETURN_IF_ERROR(CheckArchitecture(c.architecture, c.model_type, source));
  c.json = std::string(text);
  if (c.architecture == kDeepseekV4Architecture ||
      (c.architecture.empty() && c.model_type == "deepseek_v4")) {
    return SharedFieldsOnly(j, source, std::move(c));
  }
  DI_RETURN_IF_ERROR(r.Int("vocab_size", &c.vocab_size));
  DI_RETURN_IF_ERROR(r.Int("hidden_size", &c.hidden_size));
  DI_RETURN_IF_ERROR(r.Int("intermediate_size", &c.intermediate_size));
  DI_RETURN_IF_ERROR(r.Int("moe_intermediate_size", &c.moe_intermediate_size));
  DI_RETURN_IF_ERROR(r.Int("num_hidden_layers", &c.num_hidden_layers));
  DI_RETURN_IF_ERROR(r.Int("num_attention_heads", &c.num_attention_heads));
  DI_RETURN_IF_ERROR(r.OptInt("q_lora_rank", &c.q_lora_rank));
  DI_RETURN_IF_ERROR(r.Int("kv_lora_rank", &c.kv_lora_rank));
  DI_RETURN_IF_ERROR(r.Int("qk_nope_head_dim", &c.qk_nope_head_dim));
  DI_RETURN_IF_ERROR(r.Int("qk_rope_head_dim", &c.qk_rope_head_dim));
  DI_RETURN_IF_ERROR(r.Int("v_head_dim", &c.v_head_dim));
  DI_RETURN_IF_ERROR(r.OptInt("n_routed_experts", &c.n_routed_experts));
  DI_RETURN_IF_ERROR(r.OptInt("n_shared_experts", &c.n_shared_experts));
  DI_RETURN_IF_ERROR(r.OptInt("num_experts_per_tok", &c.num_experts_per_tok));
  DI_RETURN_IF_ERROR(r.OptInt("n_group", &c.n_group));
  DI_RETURN_IF_ERROR(r.OptInt("topk_group", &c.topk_group));
  DI_RETURN_IF_ERROR(r.OptString("topk_method", &c.topk_method));
  DI_RETURN_IF_ERROR(r.OptString("scoring_func", &c.scoring_func));
  DI_RETURN_IF_ERROR(r.OptBool("norm_topk_prob", &c.norm_topk_prob));
  DI_RETURN_IF_ERROR(r.OptDouble("routed_scaling_factor", &c.routed_scaling_factor));
  DI_RETURN_IF_ERROR(r.OptInt("first_k_dense_replace", &c.first_k_dense_replace));
  DI_RETURN_IF_ERROR(r.OptInt("moe_layer_freq", &c.moe_layer_freq));
  DI_RETURN_IF_ERROR(r.OptDouble("rms_norm_eps", &c.rms_norm_eps));
  DI_RETURN_IF_ERROR(r.OptInt("max_position_embeddings", &c.max_position_embeddings));
  DI_RETURN_IF_ERROR(r.OptBool("rope_interleave", &c.rope_interleave));
  DI_RETURN_IF_ERROR(r.OptBool("tie_word_embeddings", &c.tie_word_embeddings));
  DI_RETURN_IF_ERROR(r.OptInt("num_nextn_predict_layers", &c.num_nextn_predict_layers));
  DI_RETURN_IF_ERROR(r.OptDouble("rope_theta", &c.rope.theta));

  std::string act = "silu";
  DI_RETURN_IF_ERROR(r.OptString("hidden_act", &act));
  if (act != "silu") return r.Error("hidden_act", absl::StrCat("'", act, "' is not supported"));

  // RoPE: transformers 5 nests everything (theta too) in rope_parameters; older files use
  // rope_scaling with "type" or "rope_type".
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_object()) return r.Error(key, "must be an object or null");
    Reader rr(*it, absl::StrCat(source, ": ", key));
    std::string type = "default";
    DI_RETURN_IF_ERROR(rr.OptString("type", &type));
    DI_RETURN_IF_ERROR(rr.OptString("rope_type", &type));
    DI_RETURN_IF_ERROR(rr.OptDouble("rope_theta", &c.rope.theta));
    if (type == "default") continue;
    if (type != "yarn") {
      return r.Error(key, absl::StrCat("rope type '", type, "' is not supported (default, yarn)"));
    }
    c.rope.yarn = true;
    auto f = it->find("factor");
    if (f == it->end() || !f->is_number()) return rr.Error("factor", "is missing");
    c.rope.factor = f->get<double>();
    DI_RETURN_IF_ERROR(
        rr.OptInt("original_max_position_embeddings", &c.rope.original_max_position_embeddings));
    DI_RETURN_IF_ERROR(rr.OptDouble("beta_fast", &c.rope.beta_fast));
    DI_RETURN_IF_ERROR(rr.OptDouble("beta_slow", &c.rope.beta_slow));
    DI_RETURN_IF_ERROR(rr.OptDouble("mscale", &c.rope.mscale));
    DI_RETURN_IF_ERROR(rr.OptDouble("mscale_all_dim", &c.rope.mscale_all_dim));
    DI_RETURN_IF_ERROR(rr.OptDouble("attention_factor", &c.rope.attention_factor));
    DI_RETURN_IF_ERROR(rr.OptBool("truncate", &c.rope.truncate));
    if (c.rope.original_max_position_embeddings <= 0) {
      c.rope.original_max_position_embeddings = c.max_position_embeddings;
    }
  }

  auto qc = j.find("quantization_config");
  if (qc != j.end() && qc->is_object()) {
    auto bs = qc->find("weight_block_size");
    if (bs != qc->end()) {
      if (!bs->is_array() || bs->size() != 2 || !(*bs)[0].is_number_integer() ||
          !(*bs)[1].is_number_integer()) {
        return r.Error("quantization_config.weight_block_size", "must be [rows, cols]");
      }
      c.fp8_block_rows = (*bs)[0].get<int64_t>();
      c.fp8_block_cols = (*bs)[1].get<int64_t>();
    }
  }

  // Consistency checks that would otherwise surface as out-of-bounds reads.
  auto positive = [&](const char* name, int64_t v) -> absl::Status {
    if (v <= 0) return r.Error(name, absl::StrCat("must be positive, got ", v));
    return absl::OkStatus();
  };
  DI_RETURN_IF_ERROR(positive("vocab_size", c.vocab_size));
  DI_RETURN_IF_ERROR(positive("hidden_size", c.hidden_size));
  DI_RETURN_IF_ERROR(positive("num_hidden_layers", c.num_hidden_layers));
  DI_RETURN_IF_ERROR(positive("num_attention_heads", c.num_attention_heads));
  DI_RETURN_IF_ERROR(positive("kv_lora_rank", c.kv_lora_rank));
  DI_RETURN_IF_ERROR(positive("v_head_dim", c.v_head_dim));
  if (c.q_lora_rank < 0) return r.Error("q_lora_rank", "must be null or positive");
  if (c.qk_rope_head_dim <= 0 || c.qk_rope_head_dim % 2 != 0) {
    return r.Error("qk_rope_head_dim", "must be positive and even");
  }
  if (c.fp8_block_rows <= 0 || c.fp8_block_cols <= 0) {
    return r.Error("quantization_config.weight_block_size", "must be positive");
  }
  if (c.n_routed_experts > 0) {
    DI_RETURN_IF_ERROR(positive("num_experts_per_tok", c.num_experts_per_tok));
    DI_RETURN_IF_ERROR(positive("moe_intermediate_size", c.moe_intermediate_size));
    DI_RETURN_IF_ERROR(positive("n_group", c.n_group));
    if (c.n_routed_experts % c.n_group != 0) {
      return r.Error("n_group", absl::StrCat("must divide n_routed_experts (", c.n_routed_experts,
                                             "), got ", c.n_group));
    }
    if (c.topk_group <= 0 || c.topk_group > c.n_group) {
      return r.Error("topk_group", "must be in [1, n_group]");
    }
    if (c.num_experts_per_tok > c.topk_group * (c.n_routed_experts / c.n_group)) {
      return r.Error("num_experts_per_tok", "exceeds the experts in the kept groups");
    }
    if (c.topk_method != "noaux_tc") {
      return r.Error("topk_method",
                     absl::StrCat("'", c.topk_method, "' is not supported (noaux_tc)"));
    }
    if (c.scoring_func != "sigmoid") {
      return r.Error("scoring_func",
                     absl::StrCat("'", c.scoring_func, "' is not supported (sigmoid)"));
    }
  }
  if (c.rope.yarn && (c.rope.factor <= 0 || c.rope.original_max_position_embeddings <= 0)) {
    return r.Error("rope_scaling", "YaRN needs factor > 0 and original_max_position_embeddings");
  }
  return c;
}

absl::StatusOr<ModelConfig> ModelConfig::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open config"));
  std::stringstream ss;
  ss << in.rdbuf();
  return FromJson(ss.str(), path);
}

double ModelConfig::SoftmaxScale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope.yarn && rope.mscale_all_dim != 0.0) {
    const double m = YarnGetMscale(rope.factor, rope.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

double ModelConfig::RopeAttentionFactor() const {
  if (!rope.yarn) return 1.0;
  if (rope.attention_factor != 0.0) return rope.attention_factor;
  if (rope.mscale != 0.0 && rope.mscale_all_dim != 0.0) {
    return YarnGetMscale(rope.factor, rope.mscale) /
           YarnGetMscale(rope.factor, rope.mscale_all_dim);
  }
  return YarnGetMscale(rope.factor, 1.0);
}

std::vector<float> ModelConfig::RopeInvFreq() const {
  const int64_t dim = qk_rope_head_dim;
  const int64_t half = dim / 2;
  std::vector<float> inv(half), pos_freq(half);
  for (int64_t j = 0; j < half; ++j) {
    // As HF: base ** (2j / dim) in fp32, then the reciprocal.
    pos_freq[j] = static_cast<float>(
        std::pow(rope.theta, static_cast<double>(2 * j) / static_cast<double>(dim)));
    inv[j] = 1.0f / pos_freq[j];
  }
  if (!rope.yarn) return inv;
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(rope.original_max_position_embeddings / (rotations * 2 * M_PI))) /
           (2 * std::log(rope.theta));
  };
  double low = correction_dim(rope.beta_fast), high = correction_dim(rope.beta_slow);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // as HF: avoid a zero-width ramp
  for (int64_t j = 0; j < half; ++j) {
    const float extrapolation = 1.0f / pos_freq[j];
    const float interpolation = 1.0f / (static_cast<float>(rope.factor) * pos_freq[j]);
    const float ramp = std::clamp(static_cast<float>((j - low) / (high - low)), 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    inv[j] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return inv;
}

}  // namespace deepinfer
