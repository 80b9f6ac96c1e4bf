// ModelWeights with LoadOptions::mxfp4_experts (`--dtype mxfp4`) on the FP8-stored
// dsv3_yarn_nolora fixture: every routed expert is MXFP4 (packed [gate; up] and down with their
// UE8M0 scales), each element the nearest value of the OCP Microscaling spec's E2M1 table
// (written out here) to the checkpoint's value over its block's scale; the FP8 matrices stay FP8
// with keep_fp8; and DeviceBytes (the memory plan) counts exactly what Load allocates. Runs on the
// CPU backend: loading only.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/model_config.h"
#include "worker/model/model_loader.h"
#include "worker/model/model_weights.h"

namespace deepinfer {
namespace {

constexpr double kE2m1[16] = {0.0,  0.5,  1.0,  1.5,  2.0,  3.0,  4.0,  6.0,
                              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};

std::string FixtureDir() {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/deepinfer/tests/fixtures/dsv3_yarn_nolora";
}

std::vector<uint8_t> Bytes(Backend& be, const DeviceBuffer& b) {
  std::vector<uint8_t> v(b.size_bytes());
  be.CopyToHost(b.data(), b.size_bytes(), v.data());
  return v;
}

// Every element of the MXFP4 matrix (data, scales) [rows, cols] against the values `want`: the
// table value chosen is the nearest one to want / scale, and want / scale is below 8 (the scale
// is the block's).
void ExpectNearestTableValues(Backend& be, const MatrixBuffer& m, int64_t rows, int64_t cols,
                              const std::vector<float>& want) {
  ASSERT_TRUE(m.mxfp4());
  ASSERT_EQ(m.scale_ld, cols / 32);
  const std::vector<uint8_t> data = Bytes(be, *m.data), scales = Bytes(be, *m.mx_scales);
  ASSERT_EQ(static_cast<int64_t>(data.size()), rows * cols / 2);
  ASSERT_EQ(static_cast<int64_t>(scales.size()), rows * cols / 32);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t p = 0; p < cols; ++p) {
      const uint8_t byte = data[r * cols / 2 + p / 2];
      const double got = kE2m1[p % 2 == 0 ? byte & 0xF : byte >> 4];
      const double x = want[r * cols + p] /
                       std::ldexp(1.0, static_cast<int>(scales[r * cols / 32 + p / 32]) - 127);
      ASSERT_LT(std::abs(x), 8.0) << r << ", " << p;
      for (double t : kE2m1) {
        ASSERT_LE(std::abs(got - x), std::abs(t - x) + 1e-12) << r << ", " << p << ": " << x;
      }
    }
  }
}

TEST(ModelWeightsMxfp4Test, RoutedExpertsAreMxfp4AndThePlanCountsThem) {
  ModelConfig config;
  auto source = OpenWeightSource(FixtureDir(), &config);
  ASSERT_TRUE(source.ok()) << source.status();
  LoadOptions options;
  options.keep_fp8 = [src = source->get()](const std::string& name) {
    return src->StoresFp8(name);
  };
  options.mxfp4_experts = true;
  CpuBackend be(1, WeightDType::kBFloat16);
  auto w = ModelWeights::Load(config, source->get(), &be, options);
  ASSERT_TRUE(w.ok()) << w.status();
  const ModelWeights& m = **w;
  EXPECT_EQ(m.device_bytes, ModelWeights::DeviceBytes(config, WeightDType::kBFloat16, options));
  const int64_t H = config.hidden_size, I = config.moe_intermediate_size;
  int64_t experts = 0;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const LayerWeights& L = m.layers[l];
    if (!L.moe) continue;
    EXPECT_TRUE(L.shared.gate_up.fp8()) << "layer " << l;  // the shared experts stay FP8
    EXPECT_FALSE(L.shared.gate_up.mxfp4()) << "layer " << l;
    for (const auto& [e, mlp] : L.experts) {
      SCOPED_TRACE("layer " + std::to_string(l) + " expert " + std::to_string(e));
      ++experts;
      const std::string p =
          "model.layers." + std::to_string(l) + ".mlp.experts." + std::to_string(e) + ".";
      std::vector<float> gate_up(2 * I * H), down(H * I);
      ASSERT_TRUE((*source)->ReadFloat32(p + "gate_proj.weight", {I, H}, gate_up.data()).ok());
      ASSERT_TRUE(
          (*source)->ReadFloat32(p + "up_proj.weight", {I, H}, gate_up.data() + I * H).ok());
      ASSERT_TRUE((*source)->ReadFloat32(p + "down_proj.weight", {H, I}, down.data()).ok());
      ExpectNearestTableValues(be, mlp.gate_up, 2 * I, H, gate_up);
      ExpectNearestTableValues(be, mlp.down, H, I, down);
    }
  }
  EXPECT_EQ(experts, 2 * config.n_routed_experts);  // two MoE layers of the fixture
  // The plan without MXFP4 counts the (BF16-stored) experts at two bytes a value instead of half
  // a byte and a byte per 32.
  LoadOptions fp8_only = options;
  fp8_only.mxfp4_experts = false;
  const int64_t n = 3 * I * H;
  EXPECT_EQ(ModelWeights::DeviceBytes(config, WeightDType::kBFloat16, fp8_only) -
                ModelWeights::DeviceBytes(config, WeightDType::kBFloat16, options),
            experts * (2 * n - n / 2 - n / 32));
}

}  // namespace
}  // namespace deepinfer
