// The CUDA backend's batch-invariant mode (CudaTuning::batch_invariant, docs/engine.md "Batch
// invariance") through the Engine, on dummy weights of a Moonlight-shaped DeepSeek-V3 config
// (Moonlight's widths, heads, latent and rope sizes, 64 experts of which 6 per token, vocabulary;
// 4 layers: one dense, three MoE; one MTP module), bf16, decode steps from CUDA graphs, the
// worker's default prefill attention (auto): the checks of batch_invariance_checks.h, with
// prompts of up to 200 tokens and up to 24 new ones, over a bf16 cache and an FP8 one. Skips
// without a GPU.
#include <string>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/engine/batch_invariance_checks.h"

namespace deepinfer {
namespace {

// Moonlight-16B-A3B's config.json with 4 layers and one MTP module.
constexpr char kMoonlightShapedConfig[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "vocab_size": 163840, "hidden_size": 2048, "intermediate_size": 11264,
  "moe_intermediate_size": 1408, "num_hidden_layers": 4, "num_nextn_predict_layers": 1,
  "num_attention_heads": 16, "num_key_value_heads": 16, "q_lora_rank": null,
  "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
  "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "n_group": 1,
  "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": true,
  "routed_scaling_factor": 2.446, "first_k_dense_replace": 1, "moe_layer_freq": 1,
  "rms_norm_eps": 1e-05, "max_position_embeddings": 8192, "rope_theta": 50000.0,
  "rope_scaling": null, "tie_word_embeddings": false})";

class BatchInvarianceGpuTest : public testing::BatchInvarianceTest {
 protected:
  static void SetUpTestSuite() {
    if (!testing::HasCudaDevice()) return;
    CudaTuning tuning;
    tuning.batch_invariant = true;
    auto backend = CudaBackend::Create(0, WeightDType::kBFloat16, tuning);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = backend->release();
    BuildModels(kMoonlightShapedConfig);
  }
  void SetUp() override {
    if (backend_ == nullptr) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(BatchInvarianceGpuTest, ARequestAloneAndAmong255OthersGivesTheSameBits) {
  CheckAloneAndAmong255(/*vocab=*/163840, /*max_prompt=*/200, /*max_new=*/24);
}

// The same over an FP8 latent cache (--kv-cache-dtype fp8: entries written in e4m3 with a scale
// per token, read by the decode kernels directly).
TEST_F(BatchInvarianceGpuTest, OverAnFp8CacheARequestAloneAndAmong255OthersGivesTheSameBits) {
  cache_dtype_ = WeightDType::kFp8E4M3;
  CheckAloneAndAmong255(/*vocab=*/163840, /*max_prompt=*/200, /*max_new=*/24);
}

TEST_F(BatchInvarianceGpuTest, MtpDraftsGiveTheGreedyTokensOfPlainDecoding) {
  CheckMtpGreedy(/*vocab=*/163840);
}

}  // namespace
}  // namespace deepinfer
