// DeepseekV4Weights::Load through WeightLoader: dummy weights are made in place by the backend
// (Backend::FillDummy) and hold exactly the values the dummy source's host generator gives
// (DummyWeightSource::ReadFloat32, the path they took before), the same on every load; a
// checkpoint loaded on several threads with staging (WeightUploader's parallel path) holds
// exactly the bytes of a one-thread load, on both V4 fixtures (dsv4_bf16, dsv4_mix: sliding,
// HCA and CSA layers, hash-routed layers).
#include "worker/model/deepseek_v4/v4_weights.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/deepseek_v4/v4_config.h"
#include "worker/model/dummy_weight_source.h"
#include "worker/model/model_loader.h"
#include "worker/model/mxfp4_quantize.h"

namespace deepinfer {
namespace {

std::string Fixture(const std::string& name) {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/deepinfer/tests/fixtures/" + name;
}

// The dummy source without its recipes: every tensor is read through ReadFloat32 (the host
// generator), as a checkpoint's would be.
class HostGeneratedSource : public WeightSource {
 public:
  explicit HostGeneratedSource(uint64_t seed) : dummy_(seed) {}
  absl::Status ReadFloat32(const std::string& name, const std::vector<int64_t>& shape,
                           float* out) override {
    return dummy_.ReadFloat32(name, shape, out);
  }
  absl::Status ReadIndices(const std::string& name, const std::vector<int64_t>& shape,
                           int64_t bound, int32_t* out) override {
    return dummy_.ReadIndices(name, shape, bound, out);
  }
  // Every tensor but HF's fused expert tensors: the experts are read one by one, as a dummy
  // load makes them.
  bool Contains(const std::string& name) const override {
    return !absl::EndsWith(name, ".mlp.experts.gate_up_proj") &&
           !absl::EndsWith(name, ".mlp.experts.down_proj");
  }
  std::string description() const override { return "host " + dummy_.description(); }

 private:
  DummyWeightSource dummy_;
};

using Buffers = std::vector<std::pair<std::string, const DeviceBuffer*>>;

// Every buffer of `w` by a name, in a fixed order.
Buffers Collect(const DeepseekV4Weights& w) {
  Buffers out;
  auto add = [&](const std::string& name, const std::unique_ptr<DeviceBuffer>& b) {
    out.emplace_back(name, b.get());
  };
  auto hc = [&](const std::string& p, const V4HyperConnectionWeights& h) {
    add(p + "fn", h.fn);
    add(p + "base", h.base);
    add(p + "scale", h.scale);
  };
  auto compressor = [&](const std::string& p, const V4CompressorWeights& c) {
    add(p + "kv_proj", c.kv_proj);
    add(p + "gate_proj", c.gate_proj);
    add(p + "position_bias", c.position_bias);
    add(p + "kv_norm", c.kv_norm);
  };
  auto block = [&](const std::string& p, const V4LayerWeights& L) {
    add(p + "input_norm", L.input_norm);
    add(p + "post_attention_norm", L.post_attention_norm);
    hc(p + "attn_hc.", L.attn_hc);
    hc(p + "ffn_hc.", L.ffn_hc);
    const V4AttentionWeights& A = L.attention;
    for (const auto& [n, b] :
         {std::make_pair("q_a", &A.q_a), std::make_pair("q_a_norm", &A.q_a_norm),
          std::make_pair("q_b", &A.q_b), std::make_pair("kv_proj", &A.kv_proj),
          std::make_pair("kv_norm", &A.kv_norm), std::make_pair("o_a", &A.o_a),
          std::make_pair("o_b", &A.o_b), std::make_pair("sinks", &A.sinks),
          std::make_pair("index_q_b", &A.index_q_b),
          std::make_pair("index_weights", &A.index_weights)}) {
      add(p + n, *b);
    }
    compressor(p + "compressor.", A.compressor);
    compressor(p + "indexer.", A.indexer);
    add(p + "hash_table", L.hash_table);
  };
  auto moe = [&](const std::string& p, const LayerWeights& M) {
    add(p + "router", M.router);
    add(p + "router_bias", M.router_bias);
    add(p + "shared.gate_up", M.shared.gate_up.data);
    add(p + "shared.down", M.shared.down.data);
    for (const auto& [e, m] : M.experts) {
      add(absl::StrCat(p, "expert", e, ".gate_up"), m.gate_up.data);
      add(absl::StrCat(p, "expert", e, ".down"), m.down.data);
    }
  };
  add("embed", w.embed);
  add("final_norm", w.final_norm);
  add("lm_head", w.lm_head);
  hc("hc_head.", w.hc_head);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    block(absl::StrCat("layer", l, "."), w.layers[l]);
    moe(absl::StrCat("layer", l, ".moe."), w.moe.layers[l]);
  }
  for (size_t i = 0; i < w.mtp.size(); ++i) {
    const V4MtpWeights& M = w.mtp[i];
    const std::string p = absl::StrCat("mtp", i, ".");
    add(p + "e_proj", M.e_proj);
    add(p + "h_proj", M.h_proj);
    add(p + "enorm", M.enorm);
    add(p + "hnorm", M.hnorm);
    add(p + "norm", M.norm);
    hc(p + "hc_head.", M.hc_head);
    block(p + "block.", M.block);
    moe(p + "moe.", M.moe);
  }
  return out;
}

// The same buffers, byte for byte; returns how many were compared.
int ExpectSameBytes(Backend& be, const DeepseekV4Weights& want, const DeepseekV4Weights& got) {
  const Buffers a = Collect(want), b = Collect(got);
  EXPECT_EQ(a.size(), b.size());
  int compared = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    SCOPED_TRACE(a[i].first);
    EXPECT_EQ(a[i].second == nullptr, b[i].second == nullptr);
    if (a[i].second == nullptr || b[i].second == nullptr) continue;
    EXPECT_EQ(a[i].second->size_bytes(), b[i].second->size_bytes());
    if (a[i].second->size_bytes() != b[i].second->size_bytes()) continue;
    std::vector<char> x(a[i].second->size_bytes()), y(x.size());
    be.CopyToHost(a[i].second->data(), x.size(), x.data());
    be.CopyToHost(b[i].second->data(), y.size(), y.data());
    EXPECT_TRUE(x == y);
    ++compared;
  }
  EXPECT_EQ(got.moe.device_bytes, want.moe.device_bytes);
  return compared;
}

DeepseekV4Config ConfigOf(const std::string& fixture, int64_t draft_layers = 0) {
  ModelConfig model;
  auto source = OpenWeightSource(Fixture(fixture), &model);
  EXPECT_TRUE(source.ok()) << source.status();
  model.num_draft_layers = draft_layers;
  auto c = DeepseekV4Config::FromModelConfig(model);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : DeepseekV4Config();
}

TEST(V4WeightsTest, DummyWeightsAreTheHostGeneratorsValuesOnEveryLoad) {
  for (const std::string fixture : {"dsv4_bf16", "dsv4_mix"}) {
    for (WeightDType dtype : {WeightDType::kFloat32, WeightDType::kBFloat16}) {
      SCOPED_TRACE(absl::StrCat(fixture, " ", WeightDTypeName(dtype)));
      const DeepseekV4Config c = ConfigOf(fixture);
      ASSERT_GT(c.num_layers, 0);
      CpuBackend be(2, dtype);
      DummyWeightSource dummy(7);
      HostGeneratedSource host(7);
      LoadOptions options;
      auto filled = DeepseekV4Weights::Load(c, &dummy, &be, options);
      ASSERT_TRUE(filled.ok()) << filled.status();
      auto again = DeepseekV4Weights::Load(c, &dummy, &be, options);
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_GT(ExpectSameBytes(be, **filled, **again), 40);
      options.load_threads = 1;
      auto read = DeepseekV4Weights::Load(c, &host, &be, options);
      ASSERT_TRUE(read.ok()) << read.status();
      EXPECT_GT(ExpectSameBytes(be, **read, **filled), 40);
      EXPECT_EQ((*filled)->moe.device_bytes,
                DeepseekV4Weights::DeviceBytes(c, dtype, LoadOptions()));
      // Another seed, other values.
      DummyWeightSource other(8);
      auto different = DeepseekV4Weights::Load(c, &other, &be, options);
      ASSERT_TRUE(different.ok()) << different.status();
      std::vector<char> x((*filled)->lm_head->size_bytes()), y(x.size());
      be.CopyToHost((*filled)->lm_head->data(), x.size(), x.data());
      be.CopyToHost((*different)->lm_head->data(), y.size(), y.data());
      EXPECT_NE(x, y);
    }
  }
}

TEST(V4WeightsTest, ParallelLoadGivesTheBytesOfASerialOne) {
  for (const std::string fixture : {"dsv4_bf16", "dsv4_mix"}) {
    for (WeightDType dtype : {WeightDType::kFloat32, WeightDType::kBFloat16}) {
      SCOPED_TRACE(absl::StrCat(fixture, " ", WeightDTypeName(dtype)));
      ModelConfig model;
      auto source = OpenWeightSource(Fixture(fixture), &model);
      ASSERT_TRUE(source.ok()) << source.status();
      auto c = DeepseekV4Config::FromModelConfig(model);
      ASSERT_TRUE(c.ok()) << c.status();
      CpuBackend be(2, dtype);
      LoadOptions options;
      options.load_threads = 1;
      auto serial = DeepseekV4Weights::Load(*c, source->get(), &be, options);
      ASSERT_TRUE(serial.ok()) << serial.status();
      for (int threads : {2, 6}) {
        for (int64_t staging : {int64_t{1} << 30, int64_t{64} << 10}) {
          SCOPED_TRACE(absl::StrCat(threads, " threads, staging ", staging));
          options.load_threads = threads;
          options.staging_bytes = staging;
          auto parallel = DeepseekV4Weights::Load(*c, source->get(), &be, options);
          ASSERT_TRUE(parallel.ok()) << parallel.status();
          EXPECT_GT(ExpectSameBytes(be, **serial, **parallel), 40);
        }
      }
      // A rank hosting some experts only: the same bytes for those.
      options.hosts_expert = [](int64_t, int64_t e) { return e % 2 == 1; };
      options.load_threads = 1;
      auto some_serial = DeepseekV4Weights::Load(*c, source->get(), &be, options);
      ASSERT_TRUE(some_serial.ok()) << some_serial.status();
      options.load_threads = 4;
      auto some_parallel = DeepseekV4Weights::Load(*c, source->get(), &be, options);
      ASSERT_TRUE(some_parallel.ok()) << some_parallel.status();
      EXPECT_GT(ExpectSameBytes(be, **some_serial, **some_parallel), 40);
      EXPECT_LT((*some_serial)->moe.device_bytes, (*serial)->moe.device_bytes);
    }
  }
}

// --dtype mxfp4 with the dummy format: every routed expert (hash-routed layers' too) MXFP4,
// [gate; up] packed [2I, H / 2] with UE8M0 scales [2I, H / 32], down [H, I / 2] and [H, I / 32],
// quantised on the host from the host generator's values (QuantizeMxfp4 of gate_proj / up_proj /
// down_proj); the shared experts and the rest in the backend's dtype; DeviceBytes counts it.
TEST(V4WeightsTest, Mxfp4DummyExpertsAreTheHostQuantisedValues) {
  for (const std::string fixture : {"dsv4_bf16", "dsv4_mix"}) {
    SCOPED_TRACE(fixture);
    const DeepseekV4Config c = ConfigOf(fixture);
    ASSERT_GT(c.num_layers, 0);
    const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
    CpuBackend be(2, WeightDType::kBFloat16);
    DummyWeightSource dummy(7);
    LoadOptions options;
    options.mxfp4_experts = true;
    auto w = DeepseekV4Weights::Load(c, &dummy, &be, options);
    ASSERT_TRUE(w.ok()) << w.status();
    auto bytes = [&](const DeviceBuffer& b) {
      std::vector<uint8_t> v(b.size_bytes());
      be.CopyToHost(b.data(), v.size(), v.data());
      return v;
    };
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const LayerWeights& L = (*w)->moe.layers[l];
      ASSERT_EQ(static_cast<int64_t>(L.experts.size()), c.n_routed_experts);
      for (const auto& [e, m] : L.experts) {
        SCOPED_TRACE(absl::StrCat("layer ", l, " expert ", e));
        ASSERT_TRUE(m.gate_up.mxfp4() && m.down.mxfp4());
        EXPECT_EQ(m.inter, I);
        EXPECT_EQ(m.gate_up->size_bytes(), static_cast<size_t>(2 * I * H / 2));
        EXPECT_EQ(m.gate_up.mx_scales->size_bytes(), static_cast<size_t>(2 * I * H / 32));
        EXPECT_EQ(m.down->size_bytes(), static_cast<size_t>(H * I / 2));
        EXPECT_EQ(m.down.mx_scales->size_bytes(), static_cast<size_t>(H * I / 32));
        EXPECT_EQ(m.gate_up.scale_ld, H / 32);
        EXPECT_EQ(m.down.scale_ld, I / 32);
        if (e % 5 != 1) continue;  // the values of a few experts a layer
        const std::string p = absl::StrCat("model.layers.", l, ".mlp.experts.", e, ".");
        std::vector<float> gu(2 * I * H), dn(H * I);
        ASSERT_TRUE(dummy.ReadFloat32(p + "gate_proj.weight", {I, H}, gu.data()).ok());
        ASSERT_TRUE(dummy.ReadFloat32(p + "up_proj.weight", {I, H}, gu.data() + I * H).ok());
        ASSERT_TRUE(dummy.ReadFloat32(p + "down_proj.weight", {H, I}, dn.data()).ok());
        std::vector<uint8_t> packed(2 * I * H / 2), scales(2 * I * H / 32);
        ASSERT_TRUE(QuantizeMxfp4(gu.data(), 2 * I, H, packed.data(), scales.data(), "gu").ok());
        EXPECT_EQ(bytes(*m.gate_up.data), packed);
        EXPECT_EQ(bytes(*m.gate_up.mx_scales), scales);
        packed.resize(H * I / 2);
        scales.resize(H * I / 32);
        ASSERT_TRUE(QuantizeMxfp4(dn.data(), H, I, packed.data(), scales.data(), "dn").ok());
        EXPECT_EQ(bytes(*m.down.data), packed);
        EXPECT_EQ(bytes(*m.down.mx_scales), scales);
      }
      EXPECT_FALSE(L.shared.gate_up.mxfp4());
      EXPECT_EQ(L.shared.gate_up->size_bytes(), static_cast<size_t>(2 * I * H * 2));
    }
    EXPECT_EQ((*w)->moe.device_bytes,
              DeepseekV4Weights::DeviceBytes(c, WeightDType::kBFloat16, options));
    EXPECT_LT((*w)->moe.device_bytes,
              DeepseekV4Weights::DeviceBytes(c, WeightDType::kBFloat16, LoadOptions()));
  }
}

// dsv4_mix stores its routed experts MXFP4 as a V4 release does (U8 e2m1 pairs, U8 UE8M0 scales):
// with mxfp4_experts every expert holds the stored bytes and scales, [gate; up] stacked.
TEST(V4WeightsTest, Mxfp4CheckpointExpertsAreKeptAsStored) {
  ModelConfig model;
  auto source = OpenWeightSource(Fixture("dsv4_mix"), &model);
  ASSERT_TRUE(source.ok()) << source.status();
  auto c = DeepseekV4Config::FromModelConfig(model);
  ASSERT_TRUE(c.ok()) << c.status();
  const int64_t H = c->hidden_size, I = c->moe_intermediate_size;
  CpuBackend be(2, WeightDType::kBFloat16);
  LoadOptions options;
  options.mxfp4_experts = true;
  auto w = DeepseekV4Weights::Load(*c, source->get(), &be, options);
  ASSERT_TRUE(w.ok()) << w.status();
  auto bytes = [&](const DeviceBuffer& b) {
    std::vector<uint8_t> v(b.size_bytes());
    be.CopyToHost(b.data(), v.size(), v.data());
    return v;
  };
  int checked = 0;
  for (int64_t l = 0; l < c->num_layers; ++l) {
    for (const auto& [e, m] : (*w)->moe.layers[l].experts) {
      SCOPED_TRACE(absl::StrCat("layer ", l, " expert ", e));
      const std::string p = absl::StrCat("model.layers.", l, ".mlp.experts.", e, ".");
      ASSERT_TRUE((*source)->StoresMxfp4(p + "gate_proj.weight"));
      auto gate = (*source)->ReadMxfp4(p + "gate_proj.weight", {I, H});
      auto up = (*source)->ReadMxfp4(p + "up_proj.weight", {I, H});
      auto down = (*source)->ReadMxfp4(p + "down_proj.weight", {H, I});
      ASSERT_TRUE(gate.ok() && up.ok() && down.ok());
      ASSERT_TRUE(gate->has_value() && up->has_value() && down->has_value());
      std::vector<uint8_t> packed = (*gate)->packed, scales = (*gate)->scales;
      packed.insert(packed.end(), (*up)->packed.begin(), (*up)->packed.end());
      scales.insert(scales.end(), (*up)->scales.begin(), (*up)->scales.end());
      ASSERT_TRUE(m.gate_up.mxfp4() && m.down.mxfp4());
      EXPECT_EQ(bytes(*m.gate_up.data), packed);
      EXPECT_EQ(bytes(*m.gate_up.mx_scales), scales);
      EXPECT_EQ(bytes(*m.down.data), (*down)->packed);
      EXPECT_EQ(bytes(*m.down.mx_scales), (*down)->scales);
      ++checked;
    }
  }
  EXPECT_EQ(checked, c->num_layers * c->n_routed_experts);
  EXPECT_EQ((*w)->moe.device_bytes,
            DeepseekV4Weights::DeviceBytes(*c, WeightDType::kBFloat16, options));
}

}  // namespace
}  // namespace deepinfer
