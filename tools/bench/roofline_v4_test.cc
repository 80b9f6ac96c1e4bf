// The V4 roofline checked against DeepSeek's published V4-Flash size (284B parameters, 13B
// activated per token) and against hand arithmetic for a tiny config.
#include "tools/bench/roofline_v4.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

DeepseekV4Config V4Flash() {
  const char* src = std::getenv("TEST_SRCDIR");
  const std::string path =
      std::string(src ? src : ".") + "/deepinfer/tools/bench/configs/deepseek_v4_flash.json";
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<DeepseekV4Config> c = DeepseekV4Config::FromJson(text.str(), path);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : DeepseekV4Config{};
}

// Two layers (sliding, then CSA with ratio 4), hidden 8, 2 heads of dim 4, window 3, index
// top-k 2 over index heads of dim 2; 4 experts top-2 with intermediate 2; one hc stream.
DeepseekV4Config Tiny() {
  DeepseekV4Config c;
  c.vocab_size = 10;
  c.hidden_size = 8;
  c.num_layers = 2;
  c.num_heads = 2;
  c.head_dim = 4;
  c.q_lora_rank = 4;
  c.o_groups = 1;
  c.o_lora_rank = 2;
  c.sliding_window = 3;
  c.attention = {V4AttentionKind::kSliding, V4AttentionKind::kSparse};
  c.compress_rate = {0, 4};
  c.hash_moe = {false, false};
  c.hc_mult = 1;
  c.index_n_heads = 1;
  c.index_head_dim = 2;
  c.index_topk = 2;
  c.n_routed_experts = 4;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 2;
  return c;
}

TEST(RooflineV4Test, V4FlashParameterCounts) {
  const ParamCounts p = CountParamsV4(V4Flash());
  EXPECT_NEAR(p.total / 1e9, 284.0, 1.0);
  EXPECT_NEAR(p.active_per_token / 1e9, 13.0, 0.5);
  EXPECT_EQ(p.moe_layers, 43);
}

TEST(RooflineV4Test, KeysPerQueryFollowTheLayerKind) {
  const DeepseekV4Config c = Tiny();
  // Position 9 sees 10 tokens: window 3, two complete 4-token entries, both selected (top-k 2).
  V4KeysPerQuery k = KeysPerQueryV4(c, 0, 9);
  EXPECT_EQ(k.window, 3);
  EXPECT_EQ(k.compressed, 0);
  EXPECT_EQ(k.indexer, 0);
  k = KeysPerQueryV4(c, 1, 9);
  EXPECT_EQ(k.window, 3);
  EXPECT_EQ(k.compressed, 2);
  EXPECT_EQ(k.indexer, 2);
  // Position 13 sees 14 tokens: three entries scored, the top 2 attended.
  k = KeysPerQueryV4(c, 1, 13);
  EXPECT_EQ(k.compressed, 2);
  EXPECT_EQ(k.indexer, 3);
  // Position 1: a window of 2, no complete entry yet.
  k = KeysPerQueryV4(c, 1, 1);
  EXPECT_EQ(k.window, 2);
  EXPECT_EQ(k.compressed, 0);
}

TEST(RooflineV4Test, TinyParameterCountsByHand) {
  const ParamCounts p = CountParamsV4(Tiny());
  // Attention, both layers: q_a 32 + 4, q_b 32, kv 32 + 4, o_a 2 * 8 = 16, o_b 16, sinks 2,
  // norms 16 = 154. CSA layer adds its compressor (2 * 8 * 8 + 4 * 8 + 4 = 164) and indexer
  // (2 * 4 * 8 + 4 * 4 + 2 = 82, q_b 2 * 4 = 8, head weights 8) = 262.
  // hc (1 stream, 3 mix values) per layer: 2 * (3 * 8 + 3 + 3) = 60; head 8 + 1 + 1 = 10.
  // MoE per layer: router 32 + 4, shared 48, routed 4 * 48 = 192.
  const double layer0 = 154 + 60 + 36 + 48, layer1 = layer0 + 262;
  EXPECT_DOUBLE_EQ(p.total, 80 + 80 + 8 + 10 + layer0 + layer1 + 2 * 192);
  EXPECT_DOUBLE_EQ(p.active_per_token, 80 + 8 + 10 + layer0 + layer1 + 2 * 2 * 48);
  EXPECT_DOUBLE_EQ(p.per_routed_expert, 48);
}

TEST(RooflineV4Test, DecodeBytesCountWeightsTouchedAndTheEntriesRead) {
  const DeepseekV4Config c = Tiny();
  const ParamCounts p = CountParamsV4(c);
  // One sequence at context 9 (the new token at position 9): two of four experts touched per
  // layer; hc weights (2 * 60 + 10) in fp32; cache: layer 0 reads 3 rows of 4, layer 1 3 + 2
  // rows of 4 and 2 indexer keys of 2.
  const StepCost s = DecodeStepCostV4(c, 1, 9, 2.0, 4.0);
  const double hc = 130;
  const double matrices = p.total - 2 * 4 * 48 - 80 - hc;
  EXPECT_DOUBLE_EQ(s.bytes, (matrices + 2 * 2 * 48 + 8) * 2.0 + hc * 4.0 + (12 + 20 + 4) * 4.0);
  // FLOPs: 2 per active weight; attention 2 heads x (3 + 5) keys x 16; indexer 1 x 2 x 4.
  EXPECT_DOUBLE_EQ(s.flops, 2 * p.active_per_token + 2 * 8 * 16 + 8);
}

// MXFP4 experts beside bf16 matrices: only the routed experts' bytes change.
TEST(RooflineV4Test, ExpertBytesCountOnlyTheRoutedExperts) {
  const DeepseekV4Config c = Tiny();
  const double mx = 0.5 + 1.0 / 32;
  const StepCost bf16 = DecodeStepCostV4(c, 1, 9, 2.0, 4.0);
  const StepCost mixed = DecodeStepCostV4(c, 1, 9, 2.0, 4.0, 1, mx);
  // Two of four experts of 48 weights touched in each of the two layers.
  EXPECT_DOUBLE_EQ(bf16.bytes - mixed.bytes, 2 * 2 * 48 * (2.0 - mx));
  EXPECT_DOUBLE_EQ(mixed.flops, bf16.flops);
  const StepCost prefill = PrefillStepCostV4(c, 1, 16, 2.0, 4.0);
  const StepCost prefill_mx = PrefillStepCostV4(c, 1, 16, 2.0, 4.0, 1, mx);
  EXPECT_DOUBLE_EQ(prefill.bytes - prefill_mx.bytes, 2 * 4 * 48 * (2.0 - mx));  // every expert
  // Two ranks: each reads half of them.
  EXPECT_DOUBLE_EQ(PrefillStepCostV4(c, 1, 16, 2.0, 4.0, 2).bytes -
                       PrefillStepCostV4(c, 1, 16, 2.0, 4.0, 2, mx).bytes,
                   4 * 48 * (2.0 - mx));
}

TEST(RooflineV4Test, PrefillAttentionGrowsWithThePromptButStaysBoundedByTheWindow) {
  const DeepseekV4Config c = V4Flash();
  const StepCost a = PrefillStepCostV4(c, 1, 1024, 2.0, 4.0);
  const StepCost b = PrefillStepCostV4(c, 2, 1024, 2.0, 4.0);
  const StepCost d = PrefillStepCostV4(c, 1, 2048, 2.0, 4.0);
  // Twice the prompts: twice the FLOPs less one read of the weights.
  EXPECT_GT(b.flops, 1.99 * a.flops);
  EXPECT_LT(b.bytes, 1.1 * a.bytes);
  // Twice the length costs more than twice (compressed entries grow) but far less than four
  // times (the window and the top-k are bounded).
  EXPECT_GT(d.flops, 2.0 * a.flops);
  EXPECT_LT(d.flops, 2.5 * a.flops);
}

}  // namespace
}  // namespace deepinfer
