// DequantScratchOf: each term by hand for a small config, and only where both the precision
// and the architecture keep the stored format.
#include "worker/engine/dequant_scratch.h"

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

constexpr char kSmallV3[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "vocab_size": 100, "hidden_size": 16, "intermediate_size": 32, "moe_intermediate_size": 8,
  "num_hidden_layers": 2, "num_attention_heads": 2, "q_lora_rank": 12, "kv_lora_rank": 8,
  "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 4, "n_routed_experts": 4,
  "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
  "first_k_dense_replace": 1, "num_nextn_predict_layers": 1, "max_position_embeddings": 64,
  "rope_theta": 10000, "tie_word_embeddings": false})";

// FP8: the matrices' elements are q_a 12 x 16 = 192, q_b 2 x (4 + 2) x 16 = 192, kv_a
// (8 + 2) x 16 = 160, o 16 x 2 x 4 = 128, the dense MLP's gate_up 2 x 32 x 16 = 1024, the
// shared expert's 2 x 8 x 16 = 256: the largest, 1024, as bf16 is 2048 bytes.
// MXFP4: one expert as bf16 is 3 x 16 x 8 x 2 = 768 bytes; all 4 fit within 1 GiB: 3072.
TEST(DequantScratchTest, TermsByHandWhereBothKeepTheFormat) {
  absl::StatusOr<ModelConfig> config = ModelConfig::FromJson(kSmallV3, "small");
  ASSERT_TRUE(config.ok()) << config.status();
  Architecture both;
  both.keeps_fp8 = true;
  both.keeps_mxfp4_experts = true;

  DequantScratch s = DequantScratchOf(*config, both, /*keep_fp8=*/true, /*mxfp4_experts=*/true);
  EXPECT_EQ(s.fp8_bytes, 2048);
  EXPECT_EQ(s.mxfp4_bytes, 3072);
  EXPECT_EQ(s.total(), 2048 + 3072);

  s = DequantScratchOf(*config, both, /*keep_fp8=*/true, /*mxfp4_experts=*/false);
  EXPECT_EQ(s.fp8_bytes, 2048);
  EXPECT_EQ(s.mxfp4_bytes, 0);
  s = DequantScratchOf(*config, both, /*keep_fp8=*/false, /*mxfp4_experts=*/false);
  EXPECT_EQ(s.total(), 0);

  // An architecture that reads its matrices dequantised (V4) has no FP8 term; one that does
  // not keep MXFP4 experts no MXFP4 term.
  Architecture mxfp4_only;
  mxfp4_only.keeps_mxfp4_experts = true;
  s = DequantScratchOf(*config, mxfp4_only, /*keep_fp8=*/true, /*mxfp4_experts=*/true);
  EXPECT_EQ(s.fp8_bytes, 0);
  EXPECT_EQ(s.mxfp4_bytes, 3072);
  Architecture neither;
  EXPECT_EQ(DequantScratchOf(*config, neither, true, true).total(), 0);
}

// Two shared experts: their gate_up copied as two parts per MoE layer, 2 x 2 x 8 x 16 = 512
// bytes; the config's MoE layers are layer 1 (first_k_dense_replace 1) and, with one draft
// layer, layer 2. None with MXFP4 experts, without FP8, or with one shared expert.
TEST(DequantScratchTest, SharedExpertPartsWithMoreThanOneSharedExpert) {
  absl::StatusOr<ModelConfig> config = ModelConfig::FromJson(kSmallV3, "small");
  ASSERT_TRUE(config.ok()) << config.status();
  Architecture fp8;
  fp8.keeps_fp8 = true;
  EXPECT_EQ(DequantScratchOf(*config, fp8, true, false).shared_expert_copy_bytes, 0);
  config->n_shared_experts = 2;
  DequantScratch s = DequantScratchOf(*config, fp8, /*keep_fp8=*/true, /*mxfp4_experts=*/false);
  EXPECT_EQ(s.shared_expert_copy_bytes, 512);
  EXPECT_EQ(s.total(), s.fp8_bytes + 512);
  config->num_draft_layers = 1;
  EXPECT_EQ(DequantScratchOf(*config, fp8, true, false).shared_expert_copy_bytes, 1024);
  EXPECT_EQ(DequantScratchOf(*config, fp8, true, true).shared_expert_copy_bytes, 0);
  EXPECT_EQ(DequantScratchOf(*config, fp8, false, false).shared_expert_copy_bytes, 0);
}

}  // namespace
}  // namespace deepinfer
