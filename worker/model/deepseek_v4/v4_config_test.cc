// Tests for DeepseekV4Config: HF's defaults and nested ropes, the legacy keys, clear errors.
#include "worker/model/deepseek_v4/v4_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;

constexpr char kSmall[] = R"({
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
  "head_dim": 32, "q_lora_rank": 24, "o_groups": 2, "o_lora_rank": 16, "sliding_window": 8,
  "layer_types": ["sliding_attention", "compressed_sparse_attention",
                  "heavily_compressed_attention", "compressed_sparse_attention"],
  "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
  "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
  "partial_rotary_factor": 0.25, "index_n_heads": 2, "index_head_dim": 16, "index_topk": 3,
  "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
  "rope_parameters": {
    "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 4.0,
                 "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
                 "attention_factor": 1.0, "partial_rotary_factor": 0.25}},
  "max_position_embeddings": 256})";

TEST(DeepseekV4ConfigTest, ParsesTheModernLayout) {
  auto c = DeepseekV4Config::FromJson(kSmall, "small");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_dim, 8);
  EXPECT_EQ(c->attention[0], V4AttentionKind::kSliding);
  EXPECT_EQ(c->attention[1], V4AttentionKind::kSparse);
  EXPECT_EQ(c->attention[2], V4AttentionKind::kCompressed);
  EXPECT_EQ(c->compress_rate[1], 4);
  EXPECT_EQ(c->compress_rate[2], 16);
  EXPECT_EQ(c->compress_rate[0], 0);
  EXPECT_TRUE(c->hash_moe[0]);
  EXPECT_FALSE(c->hash_moe[1]);
  EXPECT_TRUE(c->compress_rope.yarn);
  EXPECT_FALSE(c->main_rope.yarn);
  EXPECT_EQ(c->main_rope.theta, 10000.0);
  EXPECT_EQ(c->compress_rope.theta, 160000.0);
  EXPECT_EQ(c->CompressAttentionFactor(), 1.0f);
  EXPECT_EQ(c->MainInvFreq().size(), 4u);
  EXPECT_FLOAT_EQ(c->MainInvFreq()[0], 1.0f);
  // HF's defaults where the file is silent.
  EXPECT_EQ(c->hc_mult, 4);
  EXPECT_EQ(c->hc_sinkhorn_iters, 20);
  EXPECT_EQ(c->swiglu_limit, 10.0);
  EXPECT_EQ(c->scoring_func, "sqrtsoftplus");
}

TEST(DeepseekV4ConfigTest, FoldsTheLegacyKeysAsHfDoes) {
  constexpr char kLegacy[] = R"({
    "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
    "head_dim": 32, "qk_rope_head_dim": 16, "compress_ratios": [128, 4, 0],
    "num_hash_layers": 2, "compress_rope_theta": 40000.0,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 64,
                     "beta_fast": 32, "beta_slow": 1}})";
  auto c = DeepseekV4Config::FromJson(kLegacy, "legacy");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_dim, 16);
  EXPECT_EQ(c->attention[0], V4AttentionKind::kCompressed);
  EXPECT_EQ(c->attention[1], V4AttentionKind::kSparse);
  EXPECT_EQ(c->attention[2], V4AttentionKind::kSliding);
  EXPECT_EQ(c->compress_rate[0], 128);
  EXPECT_TRUE(c->hash_moe[1]);
  EXPECT_FALSE(c->hash_moe[2]);
  // The flat YaRN parameters are the compress rope's, with its own theta.
  EXPECT_TRUE(c->compress_rope.yarn);
  EXPECT_EQ(c->compress_rope.theta, 40000.0);
  EXPECT_EQ(c->compress_rope.attention_factor, 1.0);
  EXPECT_FALSE(c->main_rope.yarn);
}

TEST(DeepseekV4ConfigTest, DefaultScheduleIsHfs) {
  constexpr char kBare[] = R"({"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 5,
    "num_attention_heads": 2, "head_dim": 16, "o_groups": 2})";
  auto c = DeepseekV4Config::FromJson(kBare, "bare");
  ASSERT_TRUE(c.ok()) << c.status();
  // Two HCA layers, then CSA / HCA alternating; three hash layers.
  EXPECT_EQ(c->attention[0], V4AttentionKind::kCompressed);
  EXPECT_EQ(c->attention[1], V4AttentionKind::kCompressed);
  EXPECT_EQ(c->attention[2], V4AttentionKind::kCompressed);
  EXPECT_EQ(c->attention[3], V4AttentionKind::kSparse);
  EXPECT_EQ(c->attention[4], V4AttentionKind::kCompressed);
  EXPECT_TRUE(c->hash_moe[2]);
  EXPECT_FALSE(c->hash_moe[3]);
}

TEST(DeepseekV4ConfigTest, ErrorsNameTheField) {
  std::string bad = kSmall;
  bad.replace(bad.find("\"sliding_attention\""), 19, "\"full_attention\"");
  auto c = DeepseekV4Config::FromJson(bad, "/ckpt/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              testing::AllOf(HasSubstr("/ckpt/config.json"), HasSubstr("layer_types"),
                             HasSubstr("full_attention")));
  std::string scoring = kSmall;
  scoring.replace(scoring.find("\"max_position"), 0, "\"scoring_func\": \"softmax\", ");
  EXPECT_THAT(std::string(DeepseekV4Config::FromJson(scoring, "x").status().message()),
              HasSubstr("scoring_func"));
  EXPECT_FALSE(DeepseekV4Config::FromJson("[1]", "x").ok());
}

}  // namespace
}  // namespace deepinfer
