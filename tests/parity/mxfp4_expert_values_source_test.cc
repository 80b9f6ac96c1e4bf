// cuda_v4_mxfp4_test's reference: DeepSeek-V4 loaded in fp32 through Mxfp4ExpertValuesSource
// holds, for every routed expert of every layer, exactly the values a `--dtype mxfp4` load of the
// same source keeps (LoadOptions::mxfp4_experts; its bytes and scales dequantised, [gate; up] and
// down): on dsv4_bf16's config with dummy weights (generated per expert), the dsv4_bf16
// checkpoint (fused bf16 experts, quantised at load) and dsv4_mix (experts stored MXFP4).
#include "tests/parity/mxfp4_expert_values_source.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/parity/hf_fixture.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/deepseek_v4/v4_config.h"
#include "worker/model/deepseek_v4/v4_weights.h"
#include "worker/model/model_loader.h"
#include "worker/model/mxfp4_quantize.h"

namespace deepinfer {
namespace {

// An MXFP4 matrix's values (rows of scale_ld * 32 values, packed two a byte, low nibble first).
std::vector<float> Dequantised(Backend& be, const MatrixBuffer& m) {
  std::vector<uint8_t> packed(m->size_bytes()), scales(m.mx_scales->size_bytes());
  be.CopyToHost(m->data(), packed.size(), packed.data());
  be.CopyToHost(m.mx_scales->data(), scales.size(), scales.data());
  std::vector<float> v(2 * packed.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const uint8_t code = i % 2 == 0 ? packed[i / 2] & 0xF : packed[i / 2] >> 4;
    v[i] = E2m1Value(code) * std::ldexp(1.0f, static_cast<int>(scales[i / kMxfp4Block]) - 127);
  }
  return v;
}

std::vector<float> Floats(Backend& be, const DeviceBuffer& b) {
  std::vector<float> v(b.size_bytes() / sizeof(float));
  be.CopyToHost(b.data(), b.size_bytes(), v.data());
  return v;
}

TEST(Mxfp4ExpertValuesSourceTest, ExpertsAreTheValuesAnMxfp4LoadKeeps) {
  for (const std::string fixture : {"dummy_dsv4_bf16", "dsv4_bf16", "dsv4_mix"}) {
    SCOPED_TRACE(fixture);
    const std::string model = fixture == "dummy_dsv4_bf16"
                                  ? "dummy:" + LoadFixture("dsv4_bf16").dir + "/config.json@5"
                                  : LoadFixture(fixture).dir;
    ModelConfig config;
    auto source = OpenWeightSource(model, &config);
    ASSERT_TRUE(source.ok()) << source.status();
    auto c = DeepseekV4Config::FromModelConfig(config);
    ASSERT_TRUE(c.ok()) << c.status();
    CpuBackend cpu16(2, WeightDType::kBFloat16), cpu32(2, WeightDType::kFloat32);
    LoadOptions mxfp4;
    mxfp4.mxfp4_experts = true;
    auto kept = DeepseekV4Weights::Load(*c, source->get(), &cpu16, mxfp4);
    ASSERT_TRUE(kept.ok()) << kept.status();
    Mxfp4ExpertValuesSource values(source->get());
    auto reference = DeepseekV4Weights::Load(*c, &values, &cpu32, LoadOptions());
    ASSERT_TRUE(reference.ok()) << reference.status();
    int64_t matrices = 0, differing = 0;
    std::string first;
    for (int64_t l = 0; l < c->num_layers; ++l) {
      const LayerWeights& K = (*kept)->moe.layers[l];
      const LayerWeights& R = (*reference)->moe.layers[l];
      ASSERT_EQ(K.experts.size(), R.experts.size());
      for (const auto& [e, k] : K.experts) {
        const MlpWeights& r = R.experts.at(e);
        ASSERT_TRUE(k.gate_up.mxfp4() && k.down.mxfp4());
        const std::pair<const char*, std::pair<const MatrixBuffer*, const MatrixBuffer*>> parts[] =
            {{"gate_up", {&k.gate_up, &r.gate_up}}, {"down", {&k.down, &r.down}}};
        for (const auto& [part, m] : parts) {
          ++matrices;
          if (Dequantised(cpu16, *m.first) == Floats(cpu32, *m.second->data)) continue;
          if (differing++ == 0) first = absl::StrCat("layer ", l, " expert ", e, " ", part);
        }
      }
    }
    EXPECT_EQ(matrices, 2 * c->num_layers * c->n_routed_experts);
    EXPECT_EQ(differing, 0) << "of " << matrices << " expert matrices, the first " << first;
  }
}

}  // namespace
}  // namespace deepinfer
