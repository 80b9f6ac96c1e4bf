// Tests for the model registry: lookup by architecture and by model_type, clear errors.
#include "worker/model/model_registry.h"

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

TEST(ModelRegistryTest, FindsByArchitectureOrModelType) {
  ModelConfig c;
  c.architecture = "DeepseekV3ForCausalLM";
  auto a = FindArchitecture(c);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->name, "DeepseekV3ForCausalLM");
  ModelConfig kimi;
  kimi.model_type = "kimi_k2";
  a = FindArchitecture(kimi);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->name, "DeepseekV3ForCausalLM");
}

TEST(ModelRegistryTest, UnknownArchitectureNamesItAndTheKnownOnes) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  auto a = FindArchitecture(c);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("LlamaForCausalLM"), std::string::npos);
  EXPECT_NE(a.status().message().find("DeepseekV3ForCausalLM"), std::string::npos);
}

TEST(ModelRegistryTest, SizesFromTheConfig) {
  ModelConfig c;
  c.architecture = "DeepseekV3ForCausalLM";
  c.num_hidden_layers = 3;
  c.kv_lora_rank = 32;
  c.qk_rope_head_dim = 16;
  auto a = FindArchitecture(c);
  ASSERT_TRUE(a.ok()) << a.status();
  const KvCacheSpec spec = (*a)->cache_spec(c, WeightDType::kBFloat16);
  // bf16 entries: half the fp32 bytes, so the same budget plans twice the tokens.
  EXPECT_EQ(spec.BytesPerToken(), 3 * (32 + 16) * 2);
  EXPECT_EQ((*a)->cache_spec(c, WeightDType::kFloat32).BytesPerToken(), 3 * (32 + 16) * 4);
  // The activation estimate covers the residual stream and a full logits row per token.
  c.vocab_size = 1000;
  c.hidden_size = 96;
  c.intermediate_size = 192;
  c.moe_intermediate_size = 32;
  c.num_attention_heads = 4;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  EXPECT_GE((*a)->activation_floats_per_token(c), c.vocab_size + 4 * c.hidden_size);
}

TEST(ModelRegistryTest, DeepSeekV4FromItsConfigText) {
  auto c = ModelConfig::FromJson(R"({"model_type": "deepseek_v4", "vocab_size": 100,
      "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 16,
      "o_groups": 2, "sliding_window": 4, "index_head_dim": 8, "partial_rotary_factor": 0.5,
      "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
      "layer_types": ["sliding_attention", "compressed_sparse_attention"]})",
                                 "v4");
  ASSERT_TRUE(c.ok()) << c.status();
  auto a = FindArchitecture(*c);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->name, "DeepseekV4ForCausalLM");
  const KvCacheSpec spec = (*a)->cache_spec(*c, WeightDType::kBFloat16);
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate();
  ASSERT_EQ(spec.groups.size(), 2u);
  EXPECT_EQ(spec.groups[0].kind, KvCacheKind::kSlidingWindow);
  EXPECT_EQ(spec.groups[1].kind, KvCacheKind::kCompressedSparse);
  // CSA: (16 + 8) float32 per 4 positions; state: rings of 4 x 16, 8 rows of 4 x 16 and of 4 x 8.
  EXPECT_EQ(spec.BytesPerToken(), (16 + 8) * 4 / 4);
  EXPECT_EQ(spec.StateBytesPerSequence(), (2 * 4 * 16 + 8 * 64 + 8 * 32) * 4);
  EXPECT_GT((*a)->weight_bytes(*c, WeightDType::kFloat32, LoadOptions{}), 0);
}

}  // namespace
}  // namespace deepinfer
