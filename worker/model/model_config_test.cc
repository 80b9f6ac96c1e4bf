// Tests for ModelConfig: DeepSeek/HF config layouts, YaRN-derived values, clear errors.
#include "worker/model/model_config.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kDeepSeekStyle[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
  "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
  "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "v_head_dim": 128, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
  "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
  "norm_topk_prob": true, "routed_scaling_factor": 2.5, "first_k_dense_replace": 3,
  "moe_layer_freq": 1, "rms_norm_eps": 1e-06, "rope_theta": 10000, "hidden_act": "silu",
  "max_position_embeddings": 163840, "num_nextn_predict_layers": 1,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
    "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
  "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
  "tie_word_embeddings": false})";

TEST(ModelConfigTest, ParsesDeepSeekV3Config) {
  auto c = ModelConfig::FromJson(kDeepSeekStyle, "cfg.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->q_lora_rank, 1536);
  EXPECT_EQ(c->qk_head_dim(), 192);
  EXPECT_TRUE(c->rope.yarn);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 4096);
  EXPECT_FALSE(c->IsMoeLayer(2));
  EXPECT_TRUE(c->IsMoeLayer(3));
  EXPECT_TRUE(c->rope_interleave);  // default for DeepSeek checkpoints
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c->SoftmaxScale(), m * m / std::sqrt(192.0), 1e-12);
  EXPECT_NEAR(c->RopeAttentionFactor(), 1.0, 1e-12);  // mscale == mscale_all_dim
  // YaRN: the fastest-rotating pairs keep their frequency, the slowest are divided by factor.
  auto inv = c->RopeInvFreq();
  ASSERT_EQ(inv.size(), 32u);
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_NEAR(inv[31], std::pow(10000.0, -62.0 / 64) / 40.0, 1e-12);
  // A pair inside the ramp is strictly between the two.
  bool between = false;
  for (int j = 0; j < 32; ++j) {
    double ex = std::pow(10000.0, -2.0 * j / 64), in = ex / 40;
    if (inv[j] < ex * 0.999 && inv[j] > in * 1.001) between = true;
  }
  EXPECT_TRUE(between);
}

TEST(ModelConfigTest, HfV5RopeParametersAndNullQLora) {
  std::string s = kDeepSeekStyle;
  s.replace(s.find("\"q_lora_rank\": 1536"), 19, "\"q_lora_rank\": null");
  s.replace(s.find("\"rope_scaling\""), 14, "\"rope_parameters\"");
  s.replace(s.find("\"type\": \"yarn\""), 14, "\"rope_type\": \"yarn\", \"rope_theta\": 50000");
  auto c = ModelConfig::FromJson(s, "cfg.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->q_lora_rank, 0);
  EXPECT_TRUE(c->rope.yarn);
  EXPECT_EQ(c->rope.theta, 50000);
}

TEST(ModelConfigTest, YarnAttentionFactorFollowsHf) {
  // Only mscale_all_dim given (mscale absent): HF scales cos/sin by mscale(factor, 1).
  std::string s = kDeepSeekStyle;
  s.replace(s.find("\"mscale\": 1.0,"), 14, "");
  auto c = ModelConfig::FromJson(s, "cfg.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->RopeAttentionFactor(), 0.1 * std::log(40.0) + 1.0, 1e-12);
  // Both given and different: the ratio.
  s = kDeepSeekStyle;
  s.replace(s.find("\"mscale\": 1.0"), 13, "\"mscale\": 0.5");
  c = ModelConfig::FromJson(s, "cfg.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->RopeAttentionFactor(),
              (0.05 * std::log(40.0) + 1.0) / (0.1 * std::log(40.0) + 1.0), 1e-12);
}

TEST(ModelConfigTest, PlainRopeHasUnscaledFrequencies) {
  std::string s = kDeepSeekStyle;
  s.replace(s.find("\"type\": \"yarn\""), 14, "\"type\": \"default\"");
  auto c = ModelConfig::FromJson(s, "cfg.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->rope.yarn);
  EXPECT_NEAR(c->SoftmaxScale(), 1 / std::sqrt(192.0), 1e-12);
  auto inv = c->RopeInvFreq();
  for (int j = 0; j < 32; ++j) EXPECT_NEAR(inv[j], std::pow(10000.0, -2.0 * j / 64), 1e-6);
}

TEST(ModelConfigTest, ErrorsNameFileAndField) {
  auto bad_json = ModelConfig::FromJson("{not json", "/ckpt/config.json");
  EXPECT_FALSE(bad_json.ok());
  EXPECT_NE(bad_json.status().message().find("/ckpt/config.json"), std::string::npos);

  std::string s = kDeepSeekStyle;
  s.replace(s.find("DeepseekV3ForCausalLM"), 21, "LlamaForCausalLM");
  auto arch = ModelConfig::FromJson(s, "/ckpt/config.json");
  EXPECT_FALSE(arch.ok());
  EXPECT_NE(arch.status().message().find("LlamaForCausalLM"), std::string::npos);

  s = kDeepSeekStyle;
  s.replace(s.find("\"kv_lora_rank\": 512,"), 20, "");
  auto missing = ModelConfig::FromJson(s, "/ckpt/config.json");
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("kv_lora_rank"), std::string::npos);

  s = kDeepSeekStyle;
  s.replace(s.find("\"n_group\": 8"), 12, "\"n_group\": 3");
  EXPECT_FALSE(ModelConfig::FromJson(s, "x").ok());
  s = kDeepSeekStyle;
  s.replace(s.find("\"scoring_func\": \"sigmoid\""), 25, "\"scoring_func\": \"softmax\"");
  EXPECT_FALSE(ModelConfig::FromJson(s, "x").ok());
}

// architectures[0] and model_type name one model: either alone is enough, both must agree.
TEST(ModelConfigTest, ModelTypeMustMatchTheArchitecture) {
  auto with = [](const std::string& architectures, const std::string& model_type) {
    const std::string names =
        R"("architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",)";
    std::string s = kDeepSeekStyle;
    s.replace(s.find(names), names.size(), architectures + model_type);
    return ModelConfig::FromJson(s, "/ckpt/config.json");
  };
  // What checkpoints ship: DeepSeek-V3/R1/V3.1 and Moonlight, Kimi-K2, and either field alone.
  for (const auto& [arch, type] : std::vector<std::pair<std::string, std::string>>{
           {R"("architectures": ["DeepseekV3ForCausalLM"],)", R"("model_type": "deepseek_v3",)"},
           {R"("architectures": ["DeepseekV3ForCausalLM"],)", R"("model_type": "kimi_k2",)"},
           {R"("architectures": ["DeepseekV3ForCausalLM"],)", ""},
           {"", R"("model_type": "deepseek_v3",)"},
           {"", R"("model_type": "kimi_k2",)"}}) {
    auto c = with(arch, type);
    EXPECT_TRUE(c.ok()) << arch << type << ": " << c.status();
  }
  auto v4 =
      with(R"("architectures": ["DeepseekV3ForCausalLM"],)", R"("model_type": "deepseek_v4",)");
  ASSERT_FALSE(v4.ok());
  EXPECT_EQ(v4.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(v4.status().message()),
              AllOf(HasSubstr("/ckpt/config.json"), HasSubstr("model_type 'deepseek_v4'"),
                    HasSubstr("architectures[0] 'DeepseekV3ForCausalLM'"),
                    HasSubstr("deepseek_v3 or kimi_k2")));
  auto mixtral =
      with(R"("architectures": ["DeepseekV3ForCausalLM"],)", R"("model_type": "mixtral",)");
  EXPECT_THAT(std::string(mixtral.status().message()), HasSubstr("model_type 'mixtral'"));
  auto v4_arch =
      with(R"("architectures": ["DeepseekV4ForCausalLM"],)", R"("model_type": "deepseek_v3",)");
  EXPECT_THAT(std::string(v4_arch.status().message()),
              AllOf(HasSubstr("model_type 'deepseek_v3'"),
                    HasSubstr("architectures[0] 'DeepseekV4ForCausalLM'")));
  // DeepSeek-V4 by its model_type alone: the shared fields, and the text for the V4 model.
  auto v4_type = with("", R"("model_type": "deepseek_v4",)");
  ASSERT_TRUE(v4_type.ok()) << v4_type.status();
  EXPECT_EQ(v4_type->architecture, "DeepseekV4ForCausalLM");
  EXPECT_EQ(v4_type->hidden_size, 7168);
  EXPECT_NE(v4_type->json.find("deepseek_v4"), std::string::npos);
  // An architecture we do not serve, whatever the model_type says.
  auto llama = with(R"("architectures": ["LlamaForCausalLM"],)", R"("model_type": "llama",)");
  EXPECT_THAT(std::string(llama.status().message()),
              AllOf(HasSubstr("unsupported architecture 'LlamaForCausalLM'"),
                    HasSubstr("DeepseekV4ForCausalLM")));
  EXPECT_FALSE(with("", "").ok());
}

}  // namespace
}  // namespace deepinfer
