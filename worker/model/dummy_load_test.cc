// The dummy load format generated in place (WeightSource::DummyFillFor + Backend::FillDummy)
// gives exactly the weights of generating on the host and uploading: the recipe against the
// source's values, the backend's sliced fill against UploadWeight, and every buffer of a whole
// model loaded both ways, in fp32 and in bf16.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/dummy_weight_source.h"
#include "worker/model/model_config.h"
#include "worker/model/model_weights.h"

namespace deepinfer {
namespace {

// The same values, but only through ReadFloat32 (the host path of the loader).
class ReadOnlySource : public WeightSource {
 public:
  explicit ReadOnlySource(WeightSource* inner) : inner_(inner) {}
  absl::Status ReadFloat32(const std::string& name, const std::vector<int64_t>& shape,
                           float* out) override {
    return inner_->ReadFloat32(name, shape, out);
  }
  bool Contains(const std::string& name) const override { return inner_->Contains(name); }
  std::string description() const override { return inner_->description(); }

 private:
  WeightSource* inner_;
};

std::vector<uint8_t> Bytes(Backend& be, const DeviceBuffer& b) {
  std::vector<uint8_t> out(b.size_bytes());
  be.CopyToHost(b.data(), out.size(), out.data());
  return out;
}

TEST(DummyLoadTest, RecipeGivesTheSourcesValues) {
  DummyWeightSource src(11);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> tensors = {
      {"model.norm.weight", {40}},
      {"model.layers.1.mlp.gate.e_score_correction_bias", {16}},
      {"model.embed_tokens.weight", {10, 24}},
      {"model.layers.2.mlp.experts.3.down_proj.weight", {24, 56}}};
  for (const auto& [name, shape] : tensors) {
    SCOPED_TRACE(name);
    std::vector<float> want(shape.size() == 1 ? shape[0] : shape[0] * shape[1]);
    ASSERT_TRUE(src.ReadFloat32(name, shape, want.data()).ok());
    std::optional<DummyFill> fill = src.DummyFillFor(name, shape);
    ASSERT_TRUE(fill.has_value());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(DummyFillValue(*fill, static_cast<int64_t>(i)), want[i]) << i;
    }
  }
}

// The CPU backend's fill and the base implementation (across its slices of 2^20 values), in
// both dtypes.
TEST(DummyLoadTest, BackendFillEqualsReadAndUpload) {
  DummyWeightSource src(3);
  const int64_t n = 37 * 56700;  // just over 2 slices of 2^20
  const std::string name = "model.layers.0.self_attn.o_proj.weight";
  std::vector<float> host(n);
  ASSERT_TRUE(src.ReadFloat32(name, {n / 37, 37}, host.data()).ok());
  for (WeightDType dtype : {WeightDType::kFloat32, WeightDType::kBFloat16}) {
    SCOPED_TRACE(WeightDTypeName(dtype));
    CpuBackend be(2, dtype);
    auto uploaded = be.UploadWeight(host.data(), n);
    const DummyFill fill = *src.DummyFillFor(name, {n / 37, 37});
    auto filled = be.Allocate(uploaded->size_bytes());
    be.FillDummy(fill, n, dtype, filled->data());  // the CPU backend's threads
    EXPECT_TRUE(Bytes(be, *filled) == Bytes(be, *uploaded));
    auto sliced = be.Allocate(uploaded->size_bytes());
    be.Backend::FillDummy(fill, n, dtype, sliced->data());  // host slices + copies (the base)
    EXPECT_TRUE(Bytes(be, *sliced) == Bytes(be, *uploaded));
  }
}

// Every buffer of `config`'s model loaded in place and from host-generated values, in fp32 and
// bf16: the same bytes.
void ExpectInPlaceEqualsHostGenerated(const ModelConfig& config) {
  for (WeightDType dtype : {WeightDType::kFloat32, WeightDType::kBFloat16}) {
    SCOPED_TRACE(absl::StrCat(WeightDTypeName(dtype), " q_lora ", config.q_lora_rank));
    CpuBackend be(2, dtype);
    DummyWeightSource dummy(5);
    ReadOnlySource host_only(&dummy);
    auto in_place = ModelWeights::Load(config, &dummy, &be, {});
    auto from_host = ModelWeights::Load(config, &host_only, &be, {});
    ASSERT_TRUE(in_place.ok()) << in_place.status();
    ASSERT_TRUE(from_host.ok()) << from_host.status();
    const ModelWeights& a = **in_place;
    const ModelWeights& b = **from_host;
    EXPECT_EQ(a.device_bytes, b.device_bytes);
    int compared = 0;
    auto same = [&](const std::unique_ptr<DeviceBuffer>& x, const std::unique_ptr<DeviceBuffer>& y,
                    const std::string& what) {
      ASSERT_EQ(x == nullptr, y == nullptr) << what;
      if (x == nullptr) return;
      EXPECT_TRUE(Bytes(be, *x) == Bytes(be, *y)) << what;
      ++compared;
    };
    auto same_mlp = [&](const MlpWeights& x, const MlpWeights& y, const std::string& what) {
      EXPECT_EQ(x.inter, y.inter) << what;
      same(x.gate_up.data, y.gate_up.data, what + " gate_up");
      same(x.down.data, y.down.data, what + " down");
    };
    same(a.embed, b.embed, "embed");
    same(a.final_norm, b.final_norm, "final_norm");
    same(a.lm_head, b.lm_head, "lm_head");
    ASSERT_EQ(a.layers.size(), b.layers.size());
    for (size_t l = 0; l < a.layers.size(); ++l) {
      const LayerWeights &x = a.layers[l], &y = b.layers[l];
      const std::string L = "layer " + std::to_string(l) + " ";
      same(x.input_norm, y.input_norm, L + "input_norm");
      same(x.post_attention_norm, y.post_attention_norm, L + "post_attention_norm");
      same(x.q_a.data, y.q_a.data, L + "q_a");
      same(x.q_a_norm, y.q_a_norm, L + "q_a_norm");
      same(x.q_b.data, y.q_b.data, L + "q_b");
      same(x.q.data, y.q.data, L + "q");
      same(x.kv_a.data, y.kv_a.data, L + "kv_a");
      same(x.qkv_a.data, y.qkv_a.data, L + "qkv_a");
      same(x.kv_a_norm, y.kv_a_norm, L + "kv_a_norm");
      same(x.kv_b, y.kv_b, L + "kv_b");
      same(x.w_uk_t, y.w_uk_t, L + "w_uk_t");
      same(x.o_proj.data, y.o_proj.data, L + "o_proj");
      same_mlp(x.dense, y.dense, L + "dense");
      same(x.router, y.router, L + "router");
      same(x.router_bias, y.router_bias, L + "router_bias");
      same_mlp(x.shared, y.shared, L + "shared");
      ASSERT_EQ(x.experts.size(), y.experts.size());
      for (const auto& [e, m] : x.experts) same_mlp(m, y.experts.at(e), L + "expert");
    }
    // embed, norm, lm_head; per layer 2 norms, qkv_a (q_a or q_proj stacked with kv_a),
    // q_a_norm/q_b with q_lora, kv_a_norm/kv_b/w_uk_t, o_proj (9 or 7), then a dense MLP (2) or
    // router, bias, shared (2) and 8 experts (16).
    const int attention = config.q_lora_rank > 0 ? 9 : 7;
    EXPECT_EQ(compared, 3 + (attention + 2) + 2 * (attention + 20));
  }
}

// With q_lora (q_a stacked with kv_a into qkv_a) and without (q_proj stacked with it), each part
// generated with its own recipe.
TEST(DummyLoadTest, ModelLoadedInPlaceEqualsHostGenerated) {
  for (const char* q_lora : {"48", "null"}) {
    absl::StatusOr<ModelConfig> c =
        ModelConfig::FromJson(absl::StrCat(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
    "num_hidden_layers": 3, "first_k_dense_replace": 1, "num_attention_heads": 4,
    "num_key_value_heads": 4, "q_lora_rank": )",
                                           q_lora, R"(, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 8, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "norm_topk_prob": true,
    "routed_scaling_factor": 2.5, "vocab_size": 300, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 256, "tie_word_embeddings": false})"),
                              "inline test config");
    ASSERT_TRUE(c.ok()) << c.status();
    ExpectInPlaceEqualsHostGenerated(*c);
  }
}

// The rows of qkv_a are q_proj's then kv_a_proj_with_mqa's, as the source makes them.
TEST(DummyLoadTest, StackedQueryAndKvAreThePartsOneAfterTheOther) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
    "num_hidden_layers": 1, "first_k_dense_replace": 1, "num_attention_heads": 2,
    "num_key_value_heads": 2, "q_lora_rank": null, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 8, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "norm_topk_prob": true,
    "routed_scaling_factor": 2.5, "vocab_size": 300, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 256, "tie_word_embeddings": false})",
                                                        "inline test config");
  ASSERT_TRUE(c.ok()) << c.status();
  DummyWeightSource src(9);
  CpuBackend be(1, WeightDType::kFloat32);
  auto w = ModelWeights::Load(*c, &src, &be, {});
  ASSERT_TRUE(w.ok()) << w.status();
  const LayerWeights& L = (*w)->layers[0];
  EXPECT_EQ(L.q.data, nullptr);
  EXPECT_EQ(L.kv_a.data, nullptr);
  ASSERT_NE(L.qkv_a.data, nullptr);
  const int64_t hid = 64, q_rows = 2 * (16 + 8), kv_rows = 32 + 8;
  std::vector<float> want((q_rows + kv_rows) * hid);
  ASSERT_TRUE(
      src.ReadFloat32("model.layers.0.self_attn.q_proj.weight", {q_rows, hid}, want.data()).ok());
  ASSERT_TRUE(src.ReadFloat32("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", {kv_rows, hid},
                              want.data() + q_rows * hid)
                  .ok());
  std::vector<float> got(want.size());
  ASSERT_EQ(L.qkv_a.data->size_bytes(), got.size() * sizeof(float));
  be.CopyToHost(L.qkv_a.data->data(), got.size() * sizeof(float), got.data());
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace deepinfer
