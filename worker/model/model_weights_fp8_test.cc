// ModelWeights with LoadOptions::keep_fp8 on the FP8-stored dsv3_yarn_nolora fixture: the
// matrices the checkpoint stores FP8 stay FP8 (their bytes and scales exactly as stored, the
// scale rows' stride padded to 4; gate and up, q_proj and kv_a stacked with their scale grids),
// the others (bf16 routed experts, kv_b, lm_head) are in the backend's dtype, and DeviceBytes
// (the memory plan) counts exactly what Load allocates. Runs on the CPU backend: loading only,
// no FP8 arithmetic.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/dtype_conversion.h"
#include "worker/model/model_config.h"
#include "worker/model/model_loader.h"
#include "worker/model/model_weights.h"
#include "worker/model/safetensors_checkpoint.h"

namespace deepinfer {
namespace {

std::string FixtureDir() {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/deepinfer/tests/fixtures/dsv3_yarn_nolora";
}

// Scale rows of `blocks` columns each, as the loader lays them out: a stride of `blocks`
// rounded up to 4, the padding zero (cuBLASLt's 128 x 128 block scales need it).
std::vector<float> PaddedScaleRows(const std::vector<float>& scales, int64_t blocks) {
  const int64_t stride = (blocks + 3) / 4 * 4, rows = static_cast<int64_t>(scales.size()) / blocks;
  std::vector<float> out(rows * stride, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) out[r * stride + b] = scales[r * blocks + b];
  }
  return out;
}

template <typename T>
std::vector<T> Read(Backend& be, const DeviceBuffer& b) {
  std::vector<T> v(b.size_bytes() / sizeof(T));
  be.CopyToHost(b.data(), b.size_bytes(), v.data());
  return v;
}

class ModelWeightsFp8Test : public ::testing::Test {
 protected:
  void SetUp() override {
    ModelConfig config;
    auto source = OpenWeightSource(FixtureDir(), &config);
    ASSERT_TRUE(source.ok()) << source.status();
    source_ = std::move(*source);
    config_ = config;
    keep_.keep_fp8 = [src = source_.get()](const std::string& name) {
      return src->StoresFp8(name);
    };
  }
  ModelConfig config_;
  std::unique_ptr<WeightSource> source_;
  LoadOptions keep_;
  CpuBackend be_{1, WeightDType::kBFloat16};
};

TEST_F(ModelWeightsFp8Test, StoredFp8MatricesStayFp8AndThePlanCountsThem) {
  auto w = ModelWeights::Load(config_, source_.get(), &be_, keep_);
  ASSERT_TRUE(w.ok()) << w.status();
  const ModelWeights& m = **w;
  EXPECT_EQ(m.device_bytes, ModelWeights::DeviceBytes(config_, WeightDType::kBFloat16, keep_));
  int64_t fp8_matrices = 0;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const LayerWeights& L = m.layers[l];
    EXPECT_TRUE(L.qkv_a.fp8());  // q_proj and kv_a_proj_with_mqa stacked
    EXPECT_EQ(L.q.data, nullptr);
    EXPECT_EQ(L.kv_a.data, nullptr);
    EXPECT_TRUE(L.o_proj.fp8());
    EXPECT_EQ(m.Matrix(L.o_proj).dtype, WeightDType::kFp8E4M3);
    fp8_matrices += 2;
    if (!L.moe) {
      EXPECT_TRUE(L.dense.gate_up.fp8());
      EXPECT_TRUE(L.dense.down.fp8());
      fp8_matrices += 2;
    } else {
      EXPECT_TRUE(L.shared.gate_up.fp8());
      EXPECT_TRUE(L.shared.down.fp8());
      fp8_matrices += 2;
      for (const auto& [e, mlp] : L.experts) {
        EXPECT_FALSE(mlp.gate_up.fp8()) << "expert " << e;  // stored BF16
        EXPECT_EQ(m.Matrix(mlp.gate_up).dtype, WeightDType::kBFloat16);
      }
    }
  }
  EXPECT_EQ(fp8_matrices, 4 * 2 + 2 * 2 + 2 * 2);

  // The o_proj of layer 1 as stored: [128, 128] bytes, one scale.
  auto stored = source_->ReadFp8("model.layers.1.self_attn.o_proj.weight", {128, 128});
  ASSERT_TRUE(stored.ok() && stored->has_value());
  EXPECT_EQ(Read<uint8_t>(be_, *m.layers[1].o_proj.data), (*stored)->data);
  EXPECT_EQ(Read<float>(be_, *m.layers[1].o_proj.fp8_scales),
            PaddedScaleRows((*stored)->scales, 1));
  EXPECT_EQ(m.layers[1].o_proj.scale_ld, 4);
  EXPECT_EQ(m.layers[1].o_proj.split_rows, 0);

  // The dense MLP's [gate; up] (intermediate 256, hidden 128): bytes and grids stacked at 256.
  const MatrixBuffer& gu = m.layers[0].dense.gate_up;
  auto gate = source_->ReadFp8("model.layers.0.mlp.gate_proj.weight", {256, 128});
  auto up = source_->ReadFp8("model.layers.0.mlp.up_proj.weight", {256, 128});
  ASSERT_TRUE(gate.ok() && gate->has_value() && up.ok() && up->has_value());
  std::vector<uint8_t> bytes = (*gate)->data;
  bytes.insert(bytes.end(), (*up)->data.begin(), (*up)->data.end());
  std::vector<float> scales = (*gate)->scales;
  scales.insert(scales.end(), (*up)->scales.begin(), (*up)->scales.end());
  EXPECT_EQ(Read<uint8_t>(be_, *gu.data), bytes);
  EXPECT_EQ(Read<float>(be_, *gu.fp8_scales), PaddedScaleRows(scales, 1));
  EXPECT_EQ(gu.split_rows, 256);
  const WeightView v = m.Matrix(gu);
  EXPECT_EQ(v.fp8.split_rows, 256);
  EXPECT_EQ(v.fp8.scale_ld, 4);
}

// q_proj [4 heads x 48, 128] and kv_a_proj_with_mqa [64 + 16, 128] as one matrix: the bytes
// and the scale grids one after the other, the second grid starting at row 192 (q's 192 rows
// end inside a 128-row block).
TEST_F(ModelWeightsFp8Test, QueryAndKvAStackWithTheirScaleGrids) {
  auto w = ModelWeights::Load(config_, source_.get(), &be_, keep_);
  ASSERT_TRUE(w.ok()) << w.status();
  const MatrixBuffer& qkv = (*w)->layers[1].qkv_a;
  auto q = source_->ReadFp8("model.layers.1.self_attn.q_proj.weight", {192, 128});
  auto kv = source_->ReadFp8("model.layers.1.self_attn.kv_a_proj_with_mqa.weight", {80, 128});
  ASSERT_TRUE(q.ok() && q->has_value() && kv.ok() && kv->has_value());
  ASSERT_EQ((*q)->scales.size(), 2u);
  ASSERT_EQ((*kv)->scales.size(), 1u);
  std::vector<uint8_t> bytes = (*q)->data;
  bytes.insert(bytes.end(), (*kv)->data.begin(), (*kv)->data.end());
  std::vector<float> scales = (*q)->scales;
  scales.insert(scales.end(), (*kv)->scales.begin(), (*kv)->scales.end());
  EXPECT_EQ(Read<uint8_t>(be_, *qkv.data), bytes);
  EXPECT_EQ(Read<float>(be_, *qkv.fp8_scales), PaddedScaleRows(scales, 1));
  EXPECT_EQ(qkv.split_rows, 192);
  EXPECT_EQ(qkv.scale_ld, 4);
}

// Where only one of the two is kept FP8 they stay two matrices.
TEST_F(ModelWeightsFp8Test, QueryAndKvAOfDifferentFormsStayApart) {
  LoadOptions options;
  options.keep_fp8 = [src = source_.get()](const std::string& name) {
    return src->StoresFp8(name) && name.find("kv_a_proj") == std::string::npos;
  };
  auto w = ModelWeights::Load(config_, source_.get(), &be_, options);
  ASSERT_TRUE(w.ok()) << w.status();
  for (const LayerWeights& L : (*w)->layers) {
    EXPECT_EQ(L.qkv_a.data, nullptr);
    EXPECT_TRUE(L.q.fp8());
    ASSERT_NE(L.kv_a.data, nullptr);
    EXPECT_FALSE(L.kv_a.fp8());
  }
  EXPECT_EQ((*w)->device_bytes,
            ModelWeights::DeviceBytes(config_, WeightDType::kBFloat16, options));
}

TEST_F(ModelWeightsFp8Test, DequantScratchIsTheLargestMatrixInBf16) {
  // dsv3_yarn_nolora: the dense [gate; up] (2 x 256 x 128) is its largest projection or MLP.
  EXPECT_EQ(ModelWeights::Fp8DequantScratchBytes(config_, keep_), 2 * 256 * 128 * 2);
  EXPECT_EQ(ModelWeights::Fp8DequantScratchBytes(config_, {}), 0);
}

TEST_F(ModelWeightsFp8Test, WithoutKeepFp8EverythingIsTheBackendsDtype) {
  auto w = ModelWeights::Load(config_, source_.get(), &be_, {});
  ASSERT_TRUE(w.ok()) << w.status();
  for (const LayerWeights& L : (*w)->layers) {
    ASSERT_NE(L.qkv_a.data, nullptr);
    EXPECT_FALSE(L.qkv_a.fp8());
    EXPECT_FALSE(L.o_proj.fp8());
  }
  EXPECT_EQ((*w)->device_bytes, ModelWeights::DeviceBytes(config_, WeightDType::kBFloat16, {}));
  // FP8 saves a byte per element of the FP8 matrices, less 4 bytes per 128 x 128 block.
  EXPECT_LT(ModelWeights::DeviceBytes(config_, WeightDType::kBFloat16, keep_), (*w)->device_bytes);
}

TEST(SafetensorsFp8Test, ReadFp8OnlyForFp8Tensors) {
  auto ckpt = SafetensorsCheckpoint::Open(FixtureDir());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE((*ckpt)->StoresFp8("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_FALSE((*ckpt)->StoresFp8("lm_head.weight"));  // BF16
  EXPECT_FALSE((*ckpt)->StoresFp8("model.layers.0.input_layernorm.weight"));
  EXPECT_FALSE((*ckpt)->StoresFp8("no.such.tensor"));
  auto bf16 = (*ckpt)->ReadFp8("lm_head.weight", {1000, 128});
  ASSERT_TRUE(bf16.ok());
  EXPECT_FALSE(bf16->has_value());
  auto bad = (*ckpt)->ReadFp8("model.layers.0.self_attn.q_proj.weight", {192, 64});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  // The stored values times their scales are what ReadFloat32 gives.
  auto q = (*ckpt)->ReadFp8("model.layers.0.self_attn.q_proj.weight", {192, 128});
  ASSERT_TRUE(q.ok() && q->has_value());
  ASSERT_EQ((*q)->scales.size(), 2u);
  std::vector<float> f(192 * 128);
  ASSERT_TRUE(
      (*ckpt)->ReadFloat32("model.layers.0.self_attn.q_proj.weight", {192, 128}, f.data()).ok());
  for (int64_t r = 0; r < 192; r += 37) {
    for (int64_t c = 0; c < 128; c += 11) {
      EXPECT_EQ(F8E4M3ToFloat((*q)->data[r * 128 + c]) * (*q)->scales[r / 128], f[r * 128 + c]);
    }
  }
}

}  // namespace
}  // namespace deepinfer
