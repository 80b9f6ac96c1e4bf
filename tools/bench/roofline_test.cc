// Roofline counts checked against published DeepSeek-V3 figures (671B parameters, 37B active)
// and against hand arithmetic for a tiny config.
#include "tools/bench/roofline.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

ModelConfig DeepseekV3() {
  ModelConfig c;
  c.vocab_size = 129280;
  c.hidden_size = 7168;
  c.intermediate_size = 18432;
  c.moe_intermediate_size = 2048;
  c.num_hidden_layers = 61;
  c.num_attention_heads = 128;
  c.q_lora_rank = 1536;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.n_routed_experts = 256;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 8;
  c.first_k_dense_replace = 3;
  return c;
}

TEST(RooflineTest, DeepseekV3ParameterCounts) {
  const ParamCounts p = CountParams(DeepseekV3());
  EXPECT_NEAR(p.total / 1e9, 671.0, 1.0);            // DeepSeek-V3 report: 671B
  EXPECT_NEAR(p.active_per_token / 1e9, 37.0, 1.0);  // and 37B activated per token
  EXPECT_EQ(p.moe_layers, 58);
}

TEST(RooflineTest, DecodeReadsEveryExpertAtLargeBatchAndFewAtBatchOne) {
  const ModelConfig c = DeepseekV3();
  const ParamCounts p = CountParams(c);
  const StepCost one = DecodeStepCost(c, 1, 0, 1.0, 1.0);
  const StepCost many = DecodeStepCost(c, 4096, 0, 1.0, 1.0);
  // Batch 1 touches top_k experts per layer: the active parameters (which count the LM head,
  // not the embedding table, of which one row is read) plus one step of cache.
  EXPECT_NEAR(one.bytes / 1e9, p.active_per_token / 1e9, 0.01);
  // A huge batch touches every expert: about all parameters minus the embedding table.
  EXPECT_NEAR(many.bytes / 1e9, (p.total - p.embedding) / 1e9, 1.0);
  EXPECT_NEAR(one.flops, 2.0 * p.active_per_token + 61.0 * 128 * (2 * 576 + 2 * 512), 1e3);
}

TEST(RooflineTest, CacheBytesAndAttentionFlopsScaleWithContext) {
  const ModelConfig c = DeepseekV3();
  const StepCost a = DecodeStepCost(c, 8, 999, 2.0, 2.0);
  const StepCost b = DecodeStepCost(c, 8, 1999, 2.0, 2.0);
  // 1000 more cached tokens per sequence: 576 values x 61 layers x 2 bytes each.
  EXPECT_NEAR(b.bytes - a.bytes, 8.0 * 1000 * 576 * 61 * 2, 1.0);
  // The cache is counted at its own element size, not the weights': an fp32 cache under bf16
  // weights reads twice the cache bytes; the weights' share is unchanged.
  const StepCost f = DecodeStepCost(c, 8, 999, 2.0, 4.0);
  EXPECT_NEAR(f.bytes - a.bytes, 8.0 * 1000 * 576 * 61 * 2, 1.0);
  const StepCost pf = PrefillStepCost(c, 2, 100, 2.0, 4.0),
                 pb = PrefillStepCost(c, 2, 100, 2.0, 2.0);
  EXPECT_NEAR(pf.bytes - pb.bytes, 200.0 * 576 * 61 * 2, 1.0);
  EXPECT_DOUBLE_EQ(pf.flops, pb.flops);
  EXPECT_NEAR(b.flops - a.flops, 8.0 * 1000 * 61 * 128 * (2 * 576 + 2 * 512), 1e3);
  EXPECT_DOUBLE_EQ(a.RooflineSeconds(4.3e12, 790e12), std::max(a.bytes / 4.3e12, a.flops / 790e12));
}

// The non-absorbed prefill form changes only the attention FLOPs: per (query, key) pair and
// head 2 * (128 + 64) + 2 * 128 = 640 instead of 2 * 576 + 2 * 512 = 2176 (the kv_b products are
// counted once per token in both forms); bytes stay the same.
TEST(RooflineTest, NonAbsorbedPrefillCountsItsOwnAttentionFlops) {
  const ModelConfig c = DeepseekV3();
  const StepCost absorbed = PrefillStepCost(c, 3, 1000, 2.0, 2.0);
  const StepCost mha = PrefillStepCost(c, 3, 1000, 2.0, 2.0, 1, MlaForm::kNonAbsorbed);
  const double pairs = 3.0 * 1000 * 1001 / 2;
  EXPECT_DOUBLE_EQ(mha.bytes, absorbed.bytes);
  EXPECT_NEAR(absorbed.flops - mha.flops, pairs * 61 * 128 * (2176 - 640), 1e6);
  EXPECT_GT(mha.flops, 0.0);
}

TEST(RooflineTest, ExpertParallelShareOfOneGpu) {
  const ModelConfig c = DeepseekV3();
  const ParamCounts p = CountParams(c);
  const double expert_bytes = 58.0 * 256 * p.per_routed_expert;  // every routed expert, 1 byte
  // A huge batch per rank touches every expert: each of 8 GPUs reads 1/8 of them and every
  // other weight.
  const StepCost many = DecodeStepCost(c, 4096, 0, 1.0, 1.0, 8);
  EXPECT_NEAR(many.bytes / 1e9, (p.total - p.embedding - expert_bytes * 7 / 8) / 1e9, 1.0);
  // One sequence per rank on 2 ranks: 2 tokens' distinct experts in all (E(1-(1-k/E)^2)),
  // half of them here; attention weights and cache as for one sequence.
  const StepCost two = DecodeStepCost(c, 1, 100, 1.0, 1.0, 2);
  const StepCost alone = DecodeStepCost(c, 1, 100, 1.0, 1.0, 1);
  const double q = 1.0 - 8.0 / 256;
  const double distinct_two = 256 * (1 - q * q), distinct_one = 8;
  EXPECT_NEAR(two.bytes - alone.bytes,
              58.0 * (distinct_two / 2 - distinct_one) * p.per_routed_expert, 1e3);
  EXPECT_DOUBLE_EQ(two.flops, alone.flops);  // its own tokens' FLOPs
  // Prefill: every expert is read, 1/ranks of them per GPU.
  const StepCost pre1 = PrefillStepCost(c, 4, 512, 2.0, 2.0);
  const StepCost pre4 = PrefillStepCost(c, 4, 512, 2.0, 2.0, 4);
  EXPECT_NEAR(pre1.bytes - pre4.bytes, expert_bytes * 2.0 * 3 / 4, 1e3);
  EXPECT_DOUBLE_EQ(pre1.flops, pre4.flops);
}

}  // namespace
}  // namespace deepinfer
