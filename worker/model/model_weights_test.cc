// ModelWeights::Load on the HF-made fixtures: with several loading threads (WeightUploader's
// parallel path: staging, uploads as tensors become ready) every device buffer holds exactly the
// bytes of a one-thread load, for fp32 and bf16 matrices, a one-file checkpoint
// (dsv3_qlora_rope, with its MTP layer generated: a second source kind) and a two-shard one with
// FP8 matrices kept FP8 (dsv3_yarn_nolora).
#include "worker/model/model_weights.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

std::string Fixture(const std::string& name) {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/deepinfer/tests/fixtures/" + name;
}

// Every buffer of `w` by a name, in a fixed order.
void Collect(const ModelWeights& w, std::vector<std::pair<std::string, const DeviceBuffer*>>* out) {
  auto add = [&](const std::string& name, const std::unique_ptr<DeviceBuffer>& b) {
    out->emplace_back(name, b.get());
  };
  auto matrix = [&](const std::string& name, const MatrixBuffer& m) {
    add(name, m.data);
    add(name + ".scales", m.fp8_scales);
  };
  auto mlp = [&](const std::string& name, const MlpWeights& m) {
    matrix(name + ".gate_up", m.gate_up);
    matrix(name + ".down", m.down);
  };
  add("embed", w.embed);
  add("final_norm", w.final_norm);
  add("lm_head", w.lm_head);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    const std::string p = absl::StrCat("layer", l, ".");
    add(p + "input_norm", L.input_norm);
    add(p + "post_attention_norm", L.post_attention_norm);
    matrix(p + "q_a", L.q_a);
    matrix(p + "q_b", L.q_b);
    matrix(p + "q", L.q);
    add(p + "q_a_norm", L.q_a_norm);
    matrix(p + "kv_a", L.kv_a);
    matrix(p + "qkv_a", L.qkv_a);
    add(p + "kv_a_norm", L.kv_a_norm);
    add(p + "kv_b", L.kv_b);
    add(p + "w_uk_t", L.w_uk_t);
    matrix(p + "o_proj", L.o_proj);
    mlp(p + "dense", L.dense);
    add(p + "router", L.router);
    add(p + "router_bias", L.router_bias);
    mlp(p + "shared", L.shared);
    for (const auto& [e, m] : L.experts) mlp(absl::StrCat(p, "expert", e), m);
  }
  for (size_t i = 0; i < w.mtp.size(); ++i) {
    const MtpWeights& M = w.mtp[i];
    const std::string p = absl::StrCat("mtp", i, ".");
    add(p + "enorm", M.enorm);
    add(p + "hnorm", M.hnorm);
    add(p + "eh_proj", M.eh_proj);
    add(p + "head_norm", M.head_norm);
  }
}

void ExpectSameBytes(Backend& be, const ModelWeights& want, const ModelWeights& got) {
  std::vector<std::pair<std::string, const DeviceBuffer*>> a, b;
  Collect(want, &a);
  Collect(got, &b);
  ASSERT_EQ(a.size(), b.size());
  int compared = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].first);
    ASSERT_EQ(a[i].second == nullptr, b[i].second == nullptr);
    if (a[i].second == nullptr) continue;
    ASSERT_EQ(a[i].second->size_bytes(), b[i].second->size_bytes());
    std::vector<char> x(a[i].second->size_bytes()), y(x.size());
    be.CopyToHost(a[i].second->data(), x.size(), x.data());
    be.CopyToHost(b[i].second->data(), y.size(), y.data());
    EXPECT_TRUE(x == y);
    ++compared;
  }
  EXPECT_GT(compared, 20);
  EXPECT_EQ(got.device_bytes, want.device_bytes);
}

TEST(ModelWeightsTest, ParallelLoadGivesTheBytesOfASerialOne) {
  struct Case {
    std::string fixture;
    WeightDType dtype;
    bool keep_fp8;
    int64_t draft_layers;
  };
  for (const Case& c : {Case{"dsv3_qlora_rope", WeightDType::kFloat32, false, 0},
                        Case{"dsv3_qlora_rope", WeightDType::kBFloat16, false, 0},
                        Case{"dsv3_yarn_nolora", WeightDType::kBFloat16, true, 0},
                        Case{"dsv3_yarn_nolora", WeightDType::kFloat32, false, 0}}) {
    SCOPED_TRACE(absl::StrCat(c.fixture, " ", WeightDTypeName(c.dtype), c.keep_fp8 ? " fp8" : ""));
    CpuBackend be(1, c.dtype);
    ModelConfig config;
    auto source = OpenWeightSource(Fixture(c.fixture), &config);
    ASSERT_TRUE(source.ok()) << source.status();
    LoadOptions options;
    if (c.keep_fp8) {
      options.keep_fp8 = [src = source->get()](const std::string& name) {
        return src->StoresFp8(name);
      };
    }
    options.load_threads = 1;
    auto serial = ModelWeights::Load(config, source->get(), &be, options);
    ASSERT_TRUE(serial.ok()) << serial.status();
    for (int threads : {2, 6}) {
      for (int64_t staging : {int64_t{1} << 30, int64_t{64} << 10}) {
        SCOPED_TRACE(absl::StrCat(threads, " threads, staging ", staging));
        options.load_threads = threads;
        options.staging_bytes = staging;
        auto parallel = ModelWeights::Load(config, source->get(), &be, options);
        ASSERT_TRUE(parallel.ok()) << parallel.status();
        ExpectSameBytes(be, **serial, **parallel);
      }
    }
  }
}

// A checkpoint that lacks a tensor fails the parallel load with the serial load's error.
TEST(ModelWeightsTest, ParallelLoadReportsAMissingTensor) {
  CpuBackend be(1);
  ModelConfig config;
  auto source = OpenWeightSource(Fixture("dsv3_qlora_rope"), &config);
  ASSERT_TRUE(source.ok()) << source.status();
  config.num_draft_layers = 1;  // the fixture has no MTP layer (HF drops it)
  LoadOptions options;
  options.load_threads = 1;
  auto serial = ModelWeights::Load(config, source->get(), &be, options);
  options.load_threads = 4;
  auto parallel = ModelWeights::Load(config, source->get(), &be, options);
  ASSERT_FALSE(serial.ok());
  ASSERT_FALSE(parallel.ok());
  EXPECT_EQ(parallel.status().code(), serial.status().code());
  EXPECT_NE(parallel.status().message().find("model.layers."), std::string::npos)
      << parallel.status();
}

}  // namespace
}  // namespace deepinfer
