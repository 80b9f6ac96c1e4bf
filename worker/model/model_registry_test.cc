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

}  // namespace
}  // namespace deepinfer
