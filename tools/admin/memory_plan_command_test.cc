// deepinfer-admin memory-plan: one GPU's terms for a small config against totals worked out by
// hand, and the full-size DeepSeek-V3 and V4-Flash configs on H200s.
#include "tools/admin/memory_plan_command.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

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

std::string Runfile(const std::string& path) {
  const char* dir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  return std::string(dir ? dir : ".") + "/" + (ws ? ws : "deepinfer") + "/" + path;
}

// A 1 GiB GPU at utilization 0.5, bf16 weights without the MTP layer (16704 bytes:
// weight_inventory_test), --max-batch-tokens 64, graphs for batches 1, 2, 4.
// Activation floats per token (DeepseekV3's formula): attention 12 + 12 + 16 + 2 + 32 + 8 +
// 16 / 2 = 90, dense 96 + 16 = 112, MoE 4 + 4 + 64 + 48 + 16 + 32 + 24 = 192; plus 3 x 16 +
// 16 + 100 = 356. Reserve 2 x 356 x 4 x 64 + 256 MiB = 268617728; graphs (1 + 2 + 4) x 356 x 4
// = 9968. KV: 2 layers x (8 + 2) x 2 bytes = 40 per token. 536870912 - 16704 - 268617728 -
// 9968 = 268226512 bytes = 419103 blocks of 16 x 40 bytes = 6705648 tokens.
TEST(MemoryPlanCommandTest, SmallConfigTermsByHand) {
  MemoryPlanCommandConfig c;
  c.num_gpus = 1;
  c.gpu_memory_mib = 1024;
  c.gpu_memory_utilization = 0.5;
  c.precision = "bf16";
  c.max_batch_tokens = 64;
  c.cuda_graph_max_batch = 4;
  c.mtp = false;
  auto r = PlanGpuMemory(kSmallV3, "small", c);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->fits()) << r->error;
  EXPECT_EQ(r->weights.total(), 16704);
  EXPECT_EQ(r->activation_reserve_bytes, 268617728);
  EXPECT_EQ(r->graph_bytes, 9968);
  EXPECT_EQ(r->kv_bytes_per_token, 40);
  EXPECT_EQ(r->kv.num_blocks, 419103);
  EXPECT_EQ(r->kv_tokens(), 6705648);
  const std::string text = FormatGpuMemoryReport(*r, c);
  EXPECT_NE(text.find("419103 blocks x 16 = 6705648 tokens, 40 bytes per token"), std::string::npos)
      << text;

  // Too small a GPU: the report says which term does not fit.
  c.gpu_memory_mib = 256;
  r = PlanGpuMemory(kSmallV3, "small", c);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->fits());
  EXPECT_NE(r->error.find("activation reserve 0.25 GiB"), std::string::npos) << r->error;
  EXPECT_NE(r->error.find("more than the 0.12 GiB"), std::string::npos) << r->error;
  c.precision = "int3";
  EXPECT_EQ(PlanGpuMemory(kSmallV3, "small", c).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The same GPU and terms as above with the FP8 and MXFP4 precisions, which add the rank
// builder's dequantisation scratch to the reserve. FP8: the largest matrix is the dense MLP's
// gate_up, 2 x 32 x 16 = 1024 values (q_a 12 x 16, q_b 2 x 6 x 16, kv_a 10 x 16, o 16 x 8 and
// the shared expert's 2 x 8 x 16 are smaller), 2048 bytes as bf16. MXFP4: an expert as bf16 is
// 3 x 16 x 8 x 2 = 768 bytes, all 4 experts within the 1 GiB bound: 3072 bytes.
TEST(MemoryPlanCommandTest, DequantScratchInTheReserve) {
  MemoryPlanCommandConfig c;
  c.num_gpus = 1;
  c.gpu_memory_mib = 1024;
  c.gpu_memory_utilization = 0.5;
  c.precision = "fp8";
  c.max_batch_tokens = 64;
  c.cuda_graph_max_batch = 4;
  c.mtp = false;
  // fp8 weights 4960 + 3384 x 2 + 16 + scales 28 x 16 = 12192 bytes (weight_inventory_test).
  // 536870912 - 12192 - 268617728 - 9968 - 2048 = 268228976 bytes = 419107 blocks of 640.
  auto r = PlanGpuMemory(kSmallV3, "small", c);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->fits()) << r->error;
  EXPECT_EQ(r->weights.total(), 12192);
  EXPECT_EQ(r->dequant_scratch.fp8_bytes, 2048);
  EXPECT_EQ(r->dequant_scratch.mxfp4_bytes, 0);
  EXPECT_EQ(r->kv.num_blocks, 419107);
  EXPECT_TRUE(r->engine_refuses.empty()) << r->engine_refuses;
  std::string text = FormatGpuMemoryReport(*r, c);
  EXPECT_NE(text.find("dequant scratch"), std::string::npos) << text;
  EXPECT_EQ(text.find("note:"), std::string::npos) << text;

  // mxfp4 on 2 GPUs: weights (4960 - 1536) + 3384 x 2 + 16 + 2 x 192 and scales 16 x 16 +
  // 2 x 32 = 10912 bytes (weight_inventory_test); scratch 2048 + 3072.
  // 536870912 - 10912 - 268617728 - 9968 - 5120 = 268227184 bytes = 419104 blocks of 640.
  // The engine refuses mxfp4 on more than one rank; the report says so and still plans.
  c.precision = "mxfp4";
  c.num_gpus = 2;
  r = PlanGpuMemory(kSmallV3, "small", c);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->fits()) << r->error;
  EXPECT_EQ(r->weights.total(), 10912);
  EXPECT_EQ(r->dequant_scratch.fp8_bytes, 2048);
  EXPECT_EQ(r->dequant_scratch.mxfp4_bytes, 3072);
  EXPECT_EQ(r->kv.num_blocks, 419104);
  text = FormatGpuMemoryReport(*r, c);
  EXPECT_NE(r->engine_refuses.find("one rank hosting every expert"), std::string::npos)
      << r->engine_refuses;
  EXPECT_NE(text.find("note: the engine refuses --dtype mxfp4 on more than one GPU"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("419104 blocks"), std::string::npos) << text;
  // On one GPU the engine runs it: no note.
  c.num_gpus = 1;
  r = PlanGpuMemory(kSmallV3, "small", c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->engine_refuses.empty()) << r->engine_refuses;
  EXPECT_EQ(r->dequant_scratch.total(), 2048 + 3072);

  // A GPU too small: the scratch is among the terms the error names.
  c.gpu_memory_mib = 256;
  r = PlanGpuMemory(kSmallV3, "small", c);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->fits());
  EXPECT_NE(r->error.find("dequant scratch 0.00 GiB"), std::string::npos) << r->error;
}

// DeepSeek-V3 (671B) in FP8 on 8 H200s and V4-Flash with MXFP4 experts on 2 (which the engine
// refuses today: the report says so).
TEST(MemoryPlanCommandTest, FullSizeModelsFitH200s) {
  MemoryPlanCommandConfig v3;
  v3.model = "dummy:" + Runfile("tools/bench/configs/deepseek_v3.json");
  v3.num_gpus = 8;
  std::ostringstream out, err;
  EXPECT_EQ(RunMemoryPlanCommand(v3, out, err), 0) << err.str() << out.str();
  EXPECT_NE(out.str().find("fits: KV cache"), std::string::npos) << out.str();
  // DeepSeek publishes 671B parameters for the main model (685B with the 14B MTP module,
  // whose copies of the embedding and head are not counted again here).
  std::ifstream in(Runfile("tools/bench/configs/deepseek_v3.json"));
  std::stringstream text;
  text << in.rdbuf();
  auto r = PlanGpuMemory(text.str(), "deepseek_v3.json", v3);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->parameters - r->mtp_parameters, 670.5e9);
  EXPECT_LT(r->parameters - r->mtp_parameters, 671.5e9);
  // FP8 scratch: the dense MLP's gate_up, 2 x 18432 x 7168 values as bf16, is V3's largest
  // matrix (q_b 128 x 192 x 7168 and o 7168 x 128 x 128 are smaller).
  EXPECT_EQ(r->dequant_scratch.fp8_bytes, int64_t{2} * 18432 * 7168 * 2);
  EXPECT_EQ(r->dequant_scratch.mxfp4_bytes, 0);
  EXPECT_NE(out.str().find("dequant scratch"), std::string::npos) << out.str();

  MemoryPlanCommandConfig v4 = v3;
  v4.model = "dummy:" + Runfile("tools/bench/configs/deepseek_v4_flash.json");
  v4.num_gpus = 2;
  v4.precision = "mxfp4";
  v4.fp8_scale = "ue8m0";
  std::ostringstream out4, err4;
  EXPECT_EQ(RunMemoryPlanCommand(v4, out4, err4), 0) << err4.str() << out4.str();
  // The cache terms are the model's KvCacheSpec (docs/model.md, "V4 cache kinds"): 20 CSA
  // layers x 640 B + 23 HCA layers x 16 B per token, 24,384 KiB of state per sequence.
  std::ifstream in4(Runfile("tools/bench/configs/deepseek_v4_flash.json"));
  std::stringstream text4;
  text4 << in4.rdbuf();
  auto r4 = PlanGpuMemory(text4.str(), "deepseek_v4_flash.json", v4);
  ASSERT_TRUE(r4.ok()) << r4.status();
  EXPECT_EQ(r4->kv_bytes_per_token, 20 * 640 + 23 * 16);
  EXPECT_EQ(r4->cache_state_bytes, int64_t{24384} * 1024 * v4.max_running);
  EXPECT_EQ(out4.str().find("estimate"), std::string::npos) << out4.str();
  // V4 reads its matrices bf16 (no FP8 scratch); an MXFP4 expert as bf16 is 3 x 4096 x 2048 x
  // 2 = 50331648 bytes, 21 of them within 1 GiB. Two GPUs: the engine refuses mxfp4 there.
  EXPECT_EQ(r4->dequant_scratch.fp8_bytes, 0);
  EXPECT_EQ(r4->dequant_scratch.mxfp4_bytes, int64_t{21} * 50331648);
  EXPECT_NE(out4.str().find("note: the engine refuses --dtype mxfp4"), std::string::npos)
      << out4.str();

  // V3 in bf16 does not fit on 8 (exit 3, with the reason).
  v3.precision = "bf16";
  std::ostringstream out3, err3;
  EXPECT_EQ(RunMemoryPlanCommand(v3, out3, err3), 3) << out3.str();
  EXPECT_NE(out3.str().find("does not fit"), std::string::npos) << out3.str();

  MemoryPlanCommandConfig missing;
  missing.model = "dummy:/nonexistent/config.json";
  std::ostringstream o, e;
  EXPECT_EQ(RunMemoryPlanCommand(missing, o, e), 1);
  EXPECT_NE(e.str().find("/nonexistent/config.json"), std::string::npos) << e.str();
}

}  // namespace
}  // namespace deepinfer
