// WeightInventory against parameter counts and byte totals worked out by hand for small V3 and
// V4 configs (the arithmetic is in the comments), and the V3 tensors and V4's MTP tensors against
// those the loaders read.
#include "worker/engine/weight_inventory.h"

#include <algorithm>
#include <map>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/deepseek_v4/v4_config.h"
#include "worker/model/deepseek_v4/v4_weights.h"
#include "worker/model/model_config.h"
#include "worker/model/model_weights.h"
#include "worker/model/weight_source.h"

namespace deepinfer {
namespace {

// hidden 16, 2 layers (layer 0 dense), 2 heads, q_lora 12, kv_lora 8, nope 4, rope 2, v 4,
// 4 routed experts of 8, 1 shared, vocab 100, one MTP layer.
constexpr char kSmallV3[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "vocab_size": 100, "hidden_size": 16, "intermediate_size": 32, "moe_intermediate_size": 8,
  "num_hidden_layers": 2, "num_attention_heads": 2, "q_lora_rank": 12, "kv_lora_rank": 8,
  "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 4, "n_routed_experts": 4,
  "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
  "first_k_dense_replace": 1, "num_nextn_predict_layers": 1, "max_position_embeddings": 64,
  "rope_theta": 10000, "tie_word_embeddings": false})";

// Per layer: attention 804 = norms 16+16, q_a 12x16=192, q_a_norm 12, q_b 12x12=144,
// kv_a 10x16=160, kv_a_norm 8, kv_b 16x8=128, o 16x8=128. Dense MLP 3 x 32x16 = 1536. MoE 1988 =
// router 4x16=64, bias 4, experts 4 x 3 x 8x16 = 1536, shared 3 x 8x16 = 384. Embedding,
// head 1600 each, final norm 16. MTP layer: 804 + 1988 + enorm, hnorm, shared_head.norm 3x16 +
// eh_proj 16x32=512 = 3352.
TEST(WeightInventoryTest, SmallV3ParameterCount) {
  auto inv = InventoryFromConfigJson(kSmallV3, "small", /*include_mtp=*/false);
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->parameters(), 3216 + 2 * 804 + 1536 + 1988);  // 8348
  EXPECT_EQ(inv->moe_layers, 1);
  auto with_mtp = InventoryFromConfigJson(kSmallV3, "small", /*include_mtp=*/true);
  ASSERT_TRUE(with_mtp.ok());
  EXPECT_EQ(with_mtp->parameters(), 8348 + 3352);
  EXPECT_EQ(with_mtp->moe_layers, 2);
}

// Records every tensor the engine's loader asks for (zeros for values). The loader reads on
// several threads: the record is written under a lock (read after the load joined them).
class RecordingSource : public WeightSource {
 public:
  absl::Status ReadFloat32(const std::string& name, const std::vector<int64_t>& shape,
                           float* out) override {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::fill(out, out + n, 0.0f);
    absl::MutexLock lock(&mu_);
    read[name] = n;
    return absl::OkStatus();
  }
  absl::Status ReadIndices(const std::string& name, const std::vector<int64_t>& shape,
                           int64_t bound, int32_t* out) override {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::fill(out, out + n, 0);
    absl::MutexLock lock(&mu_);
    read[name] = n;
    return absl::OkStatus();
  }
  bool Contains(const std::string& name) const override { return true; }
  std::string description() const override { return "recording"; }
  std::map<std::string, int64_t> read;  // name -> elements

 private:
  absl::Mutex mu_;
};

// The inventory holds exactly the tensors ModelWeights::Load reads (the model without MTP).
// Also without q_lora, with a tied head, and MoE in every other layer.
TEST(WeightInventoryTest, V3MatchesWhatTheLoaderReads) {
  std::string variant = kSmallV3;
  variant.replace(variant.find("\"q_lora_rank\": 12"), 17, "\"q_lora_rank\": 0");
  variant.replace(variant.find("\"tie_word_embeddings\": false"), 28,
                  "\"tie_word_embeddings\": true");
  variant.replace(variant.find("\"num_hidden_layers\": 2"), 22,
                  "\"num_hidden_layers\": 5, \"moe_layer_freq\": 2");
  for (const std::string& json : {std::string(kSmallV3), variant}) {
    SCOPED_TRACE(json);
    auto config = ModelConfig::FromJson(json, "small");
    ASSERT_TRUE(config.ok()) << config.status();
    RecordingSource source;
    CpuBackend backend(1);
    auto weights = ModelWeights::Load(*config, &source, &backend, LoadOptions());
    ASSERT_TRUE(weights.ok()) << weights.status();
    int64_t elements = 0;
    for (const auto& [name, n] : source.read) elements += n;
    auto inv = InventoryFromConfigJson(json, "small", false);
    ASSERT_TRUE(inv.ok()) << inv.status();
    int64_t tensors = 0;
    for (const ParamGroup& g : inv->groups) tensors += g.count;
    EXPECT_EQ(static_cast<int64_t>(source.read.size()), tensors);
    EXPECT_EQ(elements, inv->parameters());
  }
}

TEST(WeightInventoryTest, SmallV3BytesPerPrecision) {
  auto inv = InventoryFromConfigJson(kSmallV3, "small", false);
  ASSERT_TRUE(inv.ok());
  // bf16: every parameter 2 bytes, the correction bias (4) fp32: 8348 x 2 + 4 x 2.
  WeightBytes bf16 = PerGpuWeightBytes(*inv, 1, WeightPrecision::kBf16, Fp8ScaleFormat::kFloat32);
  EXPECT_EQ(bf16.weights, 16704);
  EXPECT_EQ(bf16.scales, 0);
  EXPECT_EQ(bf16.parameters, 8348);
  // fp8: 28 projection matrices (5 attention x 2 layers, 3 dense, 12 expert, 3 shared) of
  // 4960 values, one 128x128 block each (a 4-byte scale, its row padded to 4 scales: 16 bytes);
  // the other 3384 bf16 + 4 fp32.
  WeightBytes fp8 = PerGpuWeightBytes(*inv, 1, WeightPrecision::kFp8, Fp8ScaleFormat::kFloat32);
  EXPECT_EQ(fp8.weights, 4960 + 3384 * 2 + 16);
  EXPECT_EQ(fp8.scales, 28 * 16);
  WeightBytes ue8m0 = PerGpuWeightBytes(*inv, 1, WeightPrecision::kFp8, Fp8ScaleFormat::kUe8m0);
  EXPECT_EQ(ue8m0.scales, 28);
  // mxfp4 on 2 GPUs: 2 of the 4 experts here. An expert: gate and up 8x16 (64 bytes of values,
  // 8 scales each), down 16x8 (64 bytes, 16 scales) = 192 + 32. The rest as fp8 without the
  // 1536 expert values and their 12 scales (16 bytes each).
  WeightBytes mx =
      PerGpuWeightBytes(*inv, 2, WeightPrecision::kMxfp4Experts, Fp8ScaleFormat::kFloat32);
  EXPECT_EQ(mx.weights, (4960 - 1536) + 3384 * 2 + 16 + 2 * 192);
  EXPECT_EQ(mx.scales, 16 * 16 + 2 * 32);
  EXPECT_EQ(mx.parameters, 8348 - 1536 + 768);
}

// The memory plan's fp8 precision and the loader's own count (ModelWeights::DeviceBytes with
// LoadOptions::keep_fp8) agree on what keeping FP8 saves over bf16, for the matrices the loader
// keeps FP8: every projection but kv_b_proj (dequantised for the absorbed attention) and the
// MTP eh_proj. Scales are float32 on the device whatever the file's scale format, so the plan is
// taken with float32 scales. One GPU with the MTP layer; two GPUs (rank 0 hosting experts 0
// and 1 of 4) without it.
TEST(WeightInventoryTest, Fp8MatricesAgreeWithTheLoadersCount) {
  auto kept_by_loader = [](const std::string& name) {
    const bool matrix = (name.size() > 12 && name.rfind("_proj.weight") == name.size() - 12) ||
                        name.find("_proj_with_mqa.weight") != std::string::npos;
    return matrix && name.find("kv_b_proj") == std::string::npos &&
           name.find("eh_proj") == std::string::npos;
  };
  for (const int gpus : {1, 2}) {
    SCOPED_TRACE(gpus);
    const bool mtp = gpus == 1;
    auto config = ModelConfig::FromJson(kSmallV3, "small");
    ASSERT_TRUE(config.ok());
    config->num_draft_layers = mtp ? 1 : 0;
    LoadOptions plain;
    if (gpus == 2) plain.hosts_expert = [](int64_t, int64_t e) { return e < 2; };
    LoadOptions fp8 = plain;
    fp8.keep_fp8 = kept_by_loader;
    const int64_t loader_saves = ModelWeights::DeviceBytes(*config, WeightDType::kBFloat16, plain) -
                                 ModelWeights::DeviceBytes(*config, WeightDType::kBFloat16, fp8);

    auto inv = InventoryFromConfigJson(kSmallV3, "small", mtp);
    ASSERT_TRUE(inv.ok());
    WeightInventory kept = *inv;
    kept.groups.clear();
    int64_t kept_groups = 0;
    for (const ParamGroup& g : inv->groups) {
      // Group names spell layers as {a..b}; the loader's rule looks only at the suffix.
      if (!g.linear || !kept_by_loader(g.name)) continue;
      kept.groups.push_back(g);
      ++kept_groups;
    }
    ASSERT_GT(kept_groups, 0);
    const int64_t plan_saves =
        PerGpuWeightBytes(kept, gpus, WeightPrecision::kBf16, Fp8ScaleFormat::kFloat32).total() -
        PerGpuWeightBytes(kept, gpus, WeightPrecision::kFp8, Fp8ScaleFormat::kFloat32).total();
    EXPECT_GT(loader_saves, 0);
    EXPECT_EQ(loader_saves, plan_saves);
  }
}

// The memory plan's mxfp4 precision and the loader's count with LoadOptions::mxfp4_experts
// (`--dtype mxfp4`) agree on what MXFP4 routed experts save over bf16 ones (the small config with
// hidden 64 and expert intermediate 32, multiples of the 32-value scale block), with the MTP
// layer.
TEST(WeightInventoryTest, Mxfp4ExpertsAgreeWithTheLoadersCount) {
  std::string json = kSmallV3;
  auto replace = [&](const std::string& from, const std::string& to) {
    const size_t at = json.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    json.replace(at, from.size(), to);
  };
  replace("\"hidden_size\": 16", "\"hidden_size\": 64");
  replace("\"moe_intermediate_size\": 8", "\"moe_intermediate_size\": 32");
  auto config = ModelConfig::FromJson(json, "small");
  ASSERT_TRUE(config.ok()) << config.status();
  config->num_draft_layers = 1;
  LoadOptions plain, mx;
  mx.mxfp4_experts = true;
  const int64_t loader_saves = ModelWeights::DeviceBytes(*config, WeightDType::kBFloat16, plain) -
                               ModelWeights::DeviceBytes(*config, WeightDType::kBFloat16, mx);
  auto inv = InventoryFromConfigJson(json, "small", /*mtp=*/true);
  ASSERT_TRUE(inv.ok()) << inv.status();
  WeightInventory experts = *inv;
  experts.groups.clear();
  for (const ParamGroup& g : inv->groups) {
    if (g.routed_experts > 0 && g.linear) experts.groups.push_back(g);
  }
  ASSERT_FALSE(experts.groups.empty());
  const int64_t plan_saves =
      PerGpuWeightBytes(experts, 1, WeightPrecision::kBf16, Fp8ScaleFormat::kFloat32).total() -
      PerGpuWeightBytes(experts, 1, WeightPrecision::kMxfp4Experts, Fp8ScaleFormat::kFloat32)
          .total();
  EXPECT_GT(loader_saves, 0);
  EXPECT_EQ(loader_saves, plan_saves);
}

TEST(WeightInventoryTest, BlockScalesRoundUp) {
  ParamGroup g;
  g.shape = {300, 129};
  g.linear = true;
  // fp8: 3 x 2 blocks of 128; float32 scale rows padded to 4 (the CUDA loader's stride).
  WeightBytes fp8 = GroupBytes(g, 1, WeightPrecision::kFp8, Fp8ScaleFormat::kFloat32);
  EXPECT_EQ(fp8.weights, 300 * 129);
  EXPECT_EQ(fp8.scales, 3 * 4 * 4);
  EXPECT_EQ(GroupBytes(g, 2, WeightPrecision::kFp8, Fp8ScaleFormat::kUe8m0).scales, 12);
  // mxfp4 applies to routed experts only: 65 bytes a row (129 values), 5 scales a row.
  g.routed_experts = 8;
  WeightBytes mx = GroupBytes(g, 1, WeightPrecision::kMxfp4Experts, Fp8ScaleFormat::kFloat32);
  EXPECT_EQ(mx.weights, 300 * 65);
  EXPECT_EQ(mx.scales, 300 * 5);
  // A vector is never quantised.
  ParamGroup v;
  v.shape = {300};
  v.dtype = DType::kF32;
  EXPECT_EQ(GroupBytes(v, 1, WeightPrecision::kMxfp4Experts, Fp8ScaleFormat::kFloat32).weights,
            1200);
}

// hidden 8, 3 layers (HCA + hash router, CSA, sliding), 2 heads of 16, q_lora 4, o_groups 2 x
// o_lora 4, 4 experts of 8, 1 shared, index 2 heads x 4, rates 4 / 8, window 6, hc_mult 2.
constexpr char kSmallV4[] = R"({
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "vocab_size": 50, "hidden_size": 8, "num_hidden_layers": 3, "num_attention_heads": 2,
  "head_dim": 16, "q_lora_rank": 4, "o_groups": 2, "o_lora_rank": 4, "n_routed_experts": 4,
  "n_shared_experts": 1, "moe_intermediate_size": 8, "num_experts_per_tok": 2,
  "index_n_heads": 2, "index_head_dim": 4, "sliding_window": 6, "hc_mult": 2,
  "num_nextn_predict_layers": 0, "tie_word_embeddings": false,
  "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
  "layer_types": ["heavily_compressed_attention", "compressed_sparse_attention",
                  "sliding_attention"],
  "mlp_layer_types": ["hash_moe", "moe", "moe"]})";

// Model: embedding, head 400 each, norm 8, hc_head 2x16 + 2 + 1 = 843. Every layer 1788:
// norms 16; two hyper-connections of fn 8x16, base 8, scale 3 = 278; attention 502 = q_a 4x8,
// q_a_norm 4, q_b 32x4, kv 16x8, kv_norm 16, o_a 8x16, o_b 8x8, sinks 2; MoE 992 = router 4x8,
// experts 4 x 3 x 8x8, shared 3 x 8x8. Layer 0: HCA compressor kv, gate 16x8, position bias
// 8x16, norm 16 = 400, token table 50x2 = 100. Layer 1: CSA compressor kv, gate 32x8,
// position bias 4x32, norm 16 = 656; indexer kv, gate 8x8, position bias 4x8, norm 4,
// q_b 8x4, weights 2x8 = 212; correction bias 4. Layer 2: correction bias 4.
TEST(WeightInventoryTest, SmallV4ParameterCount) {
  auto inv = InventoryFromConfigJson(kSmallV4, "small4", false);
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->architecture, "DeepseekV4ForCausalLM");
  EXPECT_EQ(inv->parameters(), 843 + (1788 + 500) + (1788 + 656 + 212 + 4) + (1788 + 4));
  EXPECT_EQ(inv->moe_layers, 3);
}

// With its MTP module (the release's names, what DeepseekV4Weights loads): a block with
// sliding attention and learned routing, 1788 + correction bias 4, then e_proj and h_proj 2 x
// 8x8, enorm, hnorm, norm 3 x 8 and its hc head 2x16 + 2 + 1: 1979.
TEST(WeightInventoryTest, SmallV4WithMtp) {
  std::string json = kSmallV4;
  json.replace(json.find("\"num_nextn_predict_layers\": 0"), 29, "\"num_nextn_predict_layers\": 1");
  auto inv = InventoryFromConfigJson(json, "small4", /*include_mtp=*/true);
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->parameters(), 843 + 2288 + 2660 + 1792 + 1979);
  EXPECT_EQ(inv->moe_layers, 4);

  // Every MTP tensor the loader reads, and no other, with its shape.
  auto v4 = DeepseekV4Config::FromJson(json, "small4");
  ASSERT_TRUE(v4.ok()) << v4.status();
  v4->num_draft_layers = 1;
  RecordingSource source;
  CpuBackend backend(1);
  auto weights = DeepseekV4Weights::Load(*v4, &source, &backend, LoadOptions());
  ASSERT_TRUE(weights.ok()) << weights.status();
  int64_t mtp_tensors = 0, mtp_elements = 0;
  for (const auto& [name, n] : source.read) {
    if (name.rfind("mtp.", 0) != 0) continue;
    ++mtp_tensors;
    mtp_elements += n;
  }
  int64_t tensors = 0, elements = 0;
  for (const ParamGroup& g : inv->groups) {
    if (g.name.rfind("mtp.", 0) != 0) continue;
    tensors += g.count;
    elements += g.count * g.elements();
  }
  EXPECT_EQ(mtp_tensors, tensors);
  EXPECT_EQ(mtp_elements, elements);
  EXPECT_EQ(elements, 1979);
}

TEST(WeightInventoryTest, BadV4ConfigNamesField) {
  std::string bad = kSmallV4;
  bad.replace(bad.find("\"sliding_attention\""), 19, "\"full_attention\"");
  auto inv = InventoryFromConfigJson(bad, "bad4.json", false);
  ASSERT_FALSE(inv.ok());
  EXPECT_NE(inv.status().message().find("bad4.json"), std::string::npos) << inv.status();
  EXPECT_NE(inv.status().message().find("layer_types"), std::string::npos) << inv.status();
  EXPECT_NE(inv.status().message().find("full_attention"), std::string::npos) << inv.status();
  std::string short_list = kSmallV4;
  short_list.replace(short_list.find("\"hash_moe\", "), 12, "");
  EXPECT_FALSE(InventoryFromConfigJson(short_list, "s", false).ok());
  EXPECT_FALSE(ParseWeightPrecision("int4").ok());
  EXPECT_FALSE(ParseFp8ScaleFormat("f16").ok());
}

}  // namespace
}  // namespace deepinfer
