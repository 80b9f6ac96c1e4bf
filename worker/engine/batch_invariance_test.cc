// The CPU backend computes every row on its own: the checks of batch_invariance_checks.h on a
// small DeepSeek-V3 config (bf16 weights, a bf16 cache and an FP8 one, dummy weights, one MTP
// module), prompts of up to 40 tokens and up to 8 new ones, with the absorbed prefill attention
// (--prefill-attention absorbed). With `auto` the model picks the non-absorbed form for each
// sequence that brings kMhaPrefillMinTokens new tokens or more, so a prompt prefilled in one
// chunk can round differently from the same prompt in shorter chunks (docs/engine.md, "Batch
// invariance").
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/engine/batch_invariance_checks.h"
#include "worker/model/attention/prefill_attention.h"

namespace deepinfer {
namespace {

constexpr char kSmallConfig[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512,
  "moe_intermediate_size": 64, "num_hidden_layers": 3, "num_nextn_predict_layers": 1,
  "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": null,
  "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 32,
  "n_routed_experts": 16, "n_shared_experts": 2, "num_experts_per_tok": 6, "n_group": 1,
  "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": true,
  "routed_scaling_factor": 2.446, "first_k_dense_replace": 1, "moe_layer_freq": 1,
  "rms_norm_eps": 1e-05, "max_position_embeddings": 8192, "rope_theta": 50000.0,
  "rope_scaling": null, "tie_word_embeddings": false})";

class BatchInvarianceCpuTest : public testing::BatchInvarianceTest {
 protected:
  static void SetUpTestSuite() {
    backend_ = new CpuBackend(2, WeightDType::kBFloat16);
    BuildModels(kSmallConfig);
    plain_->SetPrefillAttention(PrefillAttention::kAbsorbed);
    drafting_->SetPrefillAttention(PrefillAttention::kAbsorbed);
  }
};

TEST_F(BatchInvarianceCpuTest, ARequestAloneAndAmong255OthersGivesTheSameBits) {
  CheckAloneAndAmong255(/*vocab=*/1024, /*max_prompt=*/40, /*max_new=*/8);
}

TEST_F(BatchInvarianceCpuTest, OverAnFp8CacheARequestAloneAndAmong255OthersGivesTheSameBits) {
  cache_dtype_ = WeightDType::kFp8E4M3;
  CheckAloneAndAmong255(/*vocab=*/1024, /*max_prompt=*/40, /*max_new=*/8);
}

TEST_F(BatchInvarianceCpuTest, MtpDraftsGiveTheGreedyTokensOfPlainDecoding) {
  CheckMtpGreedy(/*vocab=*/1024);
}

}  // namespace
}  // namespace deepinfer
