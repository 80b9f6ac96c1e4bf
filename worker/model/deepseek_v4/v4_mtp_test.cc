// DeepSeek-V4's MTP modules (the release's `mtp.<i>.` tensors) loaded and kept: a checkpoint
// written here holds the dsv4_bf16 config's model (values recorded from the dummy source) plus
// one MTP module by the release's names, its e_proj FP8 with a UE8M0 block scale and its routed
// experts MXFP4, as the release stores them. Loading keeps the module (counts, shapes, a
// dequantised value of each format checked against what was written, DeviceBytes), a missing or
// misshaped MTP tensor is an error naming it unless no draft layers are asked for, and the model
// built through the registry keeps them and drafts with them.
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/deepseek_v4/v4_config.h"
#include "worker/model/deepseek_v4/v4_weights.h"
#include "worker/model/dummy_weight_source.h"
#include "worker/model/model_config.h"
#include "worker/model/model_loader.h"
#include "worker/model/safetensors_checkpoint.h"
#include "worker/model/safetensors_writer.h"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// dsv4_bf16's config with one MTP module.
std::string ConfigJson() {
  const char* src = std::getenv("TEST_SRCDIR");
  std::string json =
      ReadFile(std::string(src ? src : ".") + "/deepinfer/tests/fixtures/dsv4_bf16/config.json");
  const std::string key = "\"num_nextn_predict_layers\": 0";
  const size_t at = json.find(key);
  EXPECT_NE(at, std::string::npos);
  if (at != std::string::npos) json.replace(at, key.size(), "\"num_nextn_predict_layers\": 1");
  return json;
}

std::string TmpDir(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string d = std::string(dir ? dir : "/tmp") + "/" + name;
  ::mkdir(d.c_str(), 0755);
  return d;
}

// Every tensor a loader reads, with the dummy source's values.
// The loader reads on several threads: the records are written under a lock (the test reads
// them after the load has joined its threads).
class RecordingSource : public WeightSource {
 public:
  absl::Status ReadFloat32(const std::string& name, const std::vector<int64_t>& shape,
                           float* out) override {
    absl::Status st = dummy_.ReadFloat32(name, shape, out);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    absl::MutexLock lock(&mu_);
    floats[name] = {shape, std::vector<float>(out, out + n)};
    return st;
  }
  absl::Status ReadIndices(const std::string& name, const std::vector<int64_t>& shape,
                           int64_t bound, int32_t* out) override {
    absl::Status st = dummy_.ReadIndices(name, shape, bound, out);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    absl::MutexLock lock(&mu_);
    ints[name] = {shape, std::vector<int32_t>(out, out + n)};
    return st;
  }
  bool Contains(const std::string& name) const override { return true; }
  std::string description() const override { return "recording"; }

  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> floats;
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<int32_t>>> ints;

 private:
  absl::Mutex mu_;
  DummyWeightSource dummy_{5};
};

constexpr uint8_t kFp8One = 0x38, kFp8Two = 0x40;  // E4M3: 1.0, 2.0
constexpr uint8_t kScale8 = 130;                   // UE8M0: 2^3
constexpr uint8_t kScale2 = 128;                   // UE8M0: 2^1

class V4MtpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = DeepseekV4Config::FromJson(ConfigJson(), "config.json");
    ASSERT_TRUE(c.ok()) << c.status();
    config_ = *c;
    config_.num_draft_layers = 1;
    ASSERT_EQ(config_.mtp_attention.size(), 1u);
    EXPECT_EQ(config_.mtp_attention[0], V4AttentionKind::kSliding);  // no entry past the layers
    auto recorded = DeepseekV4Weights::Load(config_, &recorded_, &backend_, LoadOptions());
    ASSERT_TRUE(recorded.ok()) << recorded.status();
  }

  // A checkpoint of every recorded tensor, MTP ones as the release stores them; `skip` is left
  // out, `misshape` written one element longer in its last dimension. With
  // `mxfp4_model_experts`, the model's fused experts ([E, rows, cols]) are MXFP4 too, packed
  // bytes and UE8M0 scales (`<name>_scale`) from MxBytes.
  std::string WriteCheckpoint(const std::string& name, const std::string& skip = "",
                              const std::string& misshape = "", bool mxfp4_model_experts = false) {
    const std::string dir = TmpDir(name);
    const int64_t H = config_.hidden_size;
    SafetensorsWriter w;
    for (const auto& [tensor, sv] : recorded_.floats) {
      if (tensor == skip) continue;
      std::vector<int64_t> shape = sv.first;
      std::vector<float> values = sv.second;
      if (tensor == misshape) {
        values.resize(values.size() / shape.back() * (shape.back() + 1));
        shape.back() += 1;
      }
      const bool expert = tensor.find(".ffn.experts.") != std::string::npos;
      const bool fused = tensor.find(".mlp.experts.") != std::string::npos;
      if (tensor == "mtp.0.e_proj.weight" && tensor != misshape) {
        // FP8 E4M3, one 128 x 128 block scale (UE8M0 bytes) under the release's name.
        std::vector<uint8_t> bytes(H * H, kFp8One);
        bytes[1 * H + 2] = kFp8Two;
        w.Add(tensor, DType::kF8E4M3, {H, H}, bytes);
        w.Add("mtp.0.e_proj.scale", DType::kU8, {1, 1}, {kScale8});
      } else if (expert && tensor != misshape) {
        // MXFP4: two E2M1 values a byte (even column low), one E8M0 scale per 32 of a row.
        const int64_t rows = shape[0], cols = shape[1];
        const bool up_of_3 = tensor == "mtp.0.ffn.experts.3.w3.weight";
        std::vector<uint8_t> packed(rows * cols / 2, up_of_3 ? 0x73 : 0x21);
        w.Add(tensor, DType::kU8, {rows, cols / 2}, packed);
        w.Add(tensor.substr(0, tensor.size() - 6) + "scale", DType::kU8, {rows, cols / 32},
              std::vector<uint8_t>(rows * cols / 32, kScale2));
      } else if (fused && mxfp4_model_experts) {
        const int64_t n = static_cast<int64_t>(values.size());
        w.Add(tensor, DType::kU8, {shape[0], shape[1], shape[2] / 2},
              MxBytes(tensor, n / 2, false));
        w.Add(tensor + "_scale", DType::kU8, {shape[0], shape[1], shape[2] / 32},
              MxBytes(tensor, n / 32, true));
      } else {
        w.AddFloat32(tensor, shape, values);
      }
    }
    for (const auto& [tensor, sv] : recorded_.ints) {
      std::vector<uint8_t> bytes(sv.second.size() * 4);
      std::memcpy(bytes.data(), sv.second.data(), bytes.size());
      w.Add(tensor, DType::kI32, sv.first, bytes);
    }
    EXPECT_TRUE(w.Write(dir + "/model.safetensors").ok());
    return dir;
  }

  // Bytes of the model's MXFP4 expert tensor `tensor`: n packed e2m1 bytes (every code, varied
  // by the tensor's name) or n UE8M0 scales, 2^-6 .. 2^5.
  static std::vector<uint8_t> MxBytes(const std::string& tensor, int64_t n, bool scales) {
    const uint8_t salt = static_cast<uint8_t>(std::hash<std::string>()(tensor));
    std::vector<uint8_t> b(n);
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t x = static_cast<uint8_t>(i * 37 + salt);
      b[i] = scales ? static_cast<uint8_t>(121 + x % 12) : x;
    }
    return b;
  }

  CpuBackend backend_{2};
  RecordingSource recorded_;
  DeepseekV4Config config_;
};

TEST_F(V4MtpTest, LoadsAndKeepsTheModule) {
  const int64_t H = config_.hidden_size, I = config_.moe_intermediate_size;
  const int64_t E = config_.n_routed_experts;
  // What the loader asked for under mtp.0: the release's block, MoE and MTP tensors.
  std::set<std::string> mtp;
  for (const auto& [name, sv] : recorded_.floats) {
    if (name.rfind("mtp.0.", 0) == 0) mtp.insert(name.substr(6));
  }
  for (const char* t : {"attn_norm.weight",
                        "ffn_norm.weight",
                        "hc_attn_fn",
                        "hc_attn_base",
                        "hc_attn_scale",
                        "hc_ffn_fn",
                        "hc_ffn_base",
                        "hc_ffn_scale",
                        "attn.wq_a.weight",
                        "attn.q_norm.weight",
                        "attn.wq_b.weight",
                        "attn.wkv.weight",
                        "attn.kv_norm.weight",
                        "attn.wo_a.weight",
                        "attn.wo_b.weight",
                        "attn.attn_sink",
                        "ffn.gate.weight",
                        "ffn.gate.bias",
                        "ffn.shared_experts.w1.weight",
                        "ffn.shared_experts.w2.weight",
                        "ffn.shared_experts.w3.weight",
                        "e_proj.weight",
                        "h_proj.weight",
                        "enorm.weight",
                        "hnorm.weight",
                        "norm.weight",
                        "hc_head_fn",
                        "hc_head_base",
                        "hc_head_scale"}) {
    EXPECT_TRUE(mtp.count(t)) << t;
  }
  EXPECT_EQ(mtp.size(), 29u + 3 * E);  // and each routed expert's w1, w2, w3
  EXPECT_EQ(recorded_.floats.at("mtp.0.hc_head_fn").first,
            (std::vector<int64_t>{config_.hc_mult, config_.hc_mult * H}));
  EXPECT_EQ(recorded_.floats.at("mtp.0.ffn.experts.15.w2.weight").first,
            (std::vector<int64_t>{H, I}));

  const std::string dir = WriteCheckpoint("mtp_full");
  auto ck = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  auto w = DeepseekV4Weights::Load(config_, ck->get(), &backend_, LoadOptions());
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ((*w)->mtp.size(), 1u);
  const V4MtpWeights& M = (*w)->mtp[0];
  EXPECT_EQ(static_cast<int64_t>(M.moe.experts.size()), E);
  EXPECT_EQ(M.e_proj->size_bytes(), static_cast<size_t>(H * H * 4));  // fp32 on this backend
  EXPECT_EQ(M.hc_head.fn->size_bytes(),
            static_cast<size_t>(config_.hc_mult * config_.hc_mult * H * 4));
  EXPECT_EQ(M.block.attention.q_b->size_bytes(),
            static_cast<size_t>(config_.num_heads * config_.head_dim * config_.q_lora_rank * 4));
  EXPECT_EQ(M.block.attention.compressor.kv_proj, nullptr);  // sliding: no compressor
  EXPECT_EQ(M.moe.experts.at(3).gate_up->size_bytes(), static_cast<size_t>(2 * I * H * 4));
  // FP8 e_proj: byte 0x38 (1.0) x 2^3 everywhere, 0x40 (2.0) x 2^3 at [1, 2].
  const float* e_proj = M.e_proj->as<float>();
  EXPECT_EQ(e_proj[0], 8.0f);
  EXPECT_EQ(e_proj[1 * H + 2], 16.0f);
  // MXFP4 experts: 0x21 = (0.5, 1.0) x 2, expert 3's up rows 0x73 = (1.5, 6.0) x 2.
  const float* gate_up = M.moe.experts.at(3).gate_up->as<float>();
  EXPECT_EQ(gate_up[0], 1.0f);
  EXPECT_EQ(gate_up[1], 2.0f);
  EXPECT_EQ(gate_up[I * H + 0], 3.0f);
  EXPECT_EQ(gate_up[I * H + 1], 12.0f);
  // A float tensor as written.
  EXPECT_EQ(M.hc_head.base->as<float>()[1], recorded_.floats.at("mtp.0.hc_head_base").second[1]);
  // The router bias is the release's `ffn.gate.bias`.
  EXPECT_EQ(M.moe.router_bias->as<float>()[4],
            recorded_.floats.at("mtp.0.ffn.gate.bias").second[4]);
  // What the memory plan counts is what was allocated, and the module is part of it.
  EXPECT_EQ((*w)->moe.device_bytes,
            DeepseekV4Weights::DeviceBytes(config_, WeightDType::kFloat32, LoadOptions()));
  DeepseekV4Config without = config_;
  without.num_draft_layers = 0;
  auto plain = DeepseekV4Weights::Load(without, ck->get(), &backend_, LoadOptions());
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE((*plain)->mtp.empty());
  EXPECT_EQ((*plain)->moe.device_bytes,
            DeepseekV4Weights::DeviceBytes(without, WeightDType::kFloat32, LoadOptions()));
  EXPECT_GT((*w)->moe.device_bytes - (*plain)->moe.device_bytes, E * 3 * I * H * 4);
  // A rank hosting two experts of every layer still holds every expert of the module.
  LoadOptions some;
  some.hosts_expert = [](int64_t, int64_t e) { return e < 2; };
  auto partial = DeepseekV4Weights::Load(config_, ck->get(), &backend_, some);
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_EQ(static_cast<int64_t>((*partial)->mtp[0].moe.experts.size()), E);
  EXPECT_EQ((*partial)->moe.device_bytes,
            DeepseekV4Weights::DeviceBytes(config_, WeightDType::kFloat32, some));
}

// --dtype mxfp4 on a checkpoint whose routed experts are MXFP4 (the model's fused
// [E, 2I, H / 2] tensors and the MTP module's per-expert w1 / w3 / w2 with `.scale`): every
// expert keeps the stored bytes and scales as they are (a dequantise / requantise round trip
// would rewrite them: 0x21 x 2^1 = (1.0, 2.0) requantises to 0x64 x 2^-1), stacked [gate; up];
// the shared experts and the rest stay in the matrix dtype; DeviceBytes counts what was made.
TEST_F(V4MtpTest, Mxfp4ExpertsKeepTheCheckpointsBytes) {
  const int64_t H = config_.hidden_size, I = config_.moe_intermediate_size;
  const int64_t E = config_.n_routed_experts;
  const std::string dir = WriteCheckpoint("mtp_mxfp4", "", "", /*mxfp4_model_experts=*/true);
  auto ck = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  const std::string gu0 = "model.layers.0.mlp.experts.gate_up_proj";
  EXPECT_TRUE((*ck)->StoresMxfp4(gu0));
  EXPECT_TRUE((*ck)->StoresMxfp4("mtp.0.ffn.experts.3.w1.weight"));
  EXPECT_FALSE((*ck)->StoresMxfp4("mtp.0.e_proj.weight"));  // FP8
  EXPECT_FALSE((*ck)->StoresMxfp4("model.layers.0.mlp.shared_experts.down_proj.weight"));
  LoadOptions options;
  options.mxfp4_experts = true;
  auto w = DeepseekV4Weights::Load(config_, ck->get(), &backend_, options);
  ASSERT_TRUE(w.ok()) << w.status();
  auto bytes = [&](const DeviceBuffer& b) {
    std::vector<uint8_t> v(b.size_bytes());
    backend_.CopyToHost(b.data(), v.size(), v.data());
    return v;
  };
  auto slice = [](const std::vector<uint8_t>& all, int64_t e, int64_t n) {
    return std::vector<uint8_t>(all.begin() + e * n, all.begin() + (e + 1) * n);
  };
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    SCOPED_TRACE(absl::StrCat("layer ", l));
    const std::string m = absl::StrCat("model.layers.", l, ".mlp.experts.");
    const std::vector<uint8_t> gu = MxBytes(m + "gate_up_proj", E * 2 * I * H / 2, false);
    const std::vector<uint8_t> gu_s = MxBytes(m + "gate_up_proj", E * 2 * I * H / 32, true);
    const std::vector<uint8_t> dn = MxBytes(m + "down_proj", E * H * I / 2, false);
    const std::vector<uint8_t> dn_s = MxBytes(m + "down_proj", E * H * I / 32, true);
    const LayerWeights& L = (*w)->moe.layers[l];
    ASSERT_EQ(static_cast<int64_t>(L.experts.size()), E);
    for (const auto& [e, x] : L.experts) {
      ASSERT_TRUE(x.gate_up.mxfp4() && x.down.mxfp4()) << e;
      EXPECT_EQ(x.gate_up.scale_ld, H / 32);
      EXPECT_EQ(x.down.scale_ld, I / 32);
      EXPECT_EQ(bytes(*x.gate_up.data), slice(gu, e, 2 * I * H / 2)) << e;
      EXPECT_EQ(bytes(*x.gate_up.mx_scales), slice(gu_s, e, 2 * I * H / 32)) << e;
      EXPECT_EQ(bytes(*x.down.data), slice(dn, e, H * I / 2)) << e;
      EXPECT_EQ(bytes(*x.down.mx_scales), slice(dn_s, e, H * I / 32)) << e;
    }
    EXPECT_FALSE(L.shared.gate_up.mxfp4());
    EXPECT_EQ(L.shared.gate_up->size_bytes(), static_cast<size_t>(2 * I * H * 4));
  }
  // The MTP module's experts: 0x21 everywhere, expert 3's up rows 0x73; scales 2^1.
  const MlpWeights& x = (*w)->mtp[0].moe.experts.at(3);
  ASSERT_TRUE(x.gate_up.mxfp4() && x.down.mxfp4());
  std::vector<uint8_t> want(2 * I * H / 2, 0x21);
  std::fill(want.begin() + I * H / 2, want.end(), 0x73);
  EXPECT_EQ(bytes(*x.gate_up.data), want);
  EXPECT_EQ(bytes(*x.gate_up.mx_scales), std::vector<uint8_t>(2 * I * H / 32, kScale2));
  EXPECT_EQ(bytes(*x.down.data), std::vector<uint8_t>(H * I / 2, 0x21));
  EXPECT_EQ((*w)->moe.device_bytes,
            DeepseekV4Weights::DeviceBytes(config_, WeightDType::kFloat32, options));
  EXPECT_LT((*w)->moe.device_bytes,
            DeepseekV4Weights::DeviceBytes(config_, WeightDType::kFloat32, LoadOptions()));
}

TEST_F(V4MtpTest, MissingOrMisshapedTensorIsNamed) {
  for (const std::string tensor : {"mtp.0.hnorm.weight", "mtp.0.attn.wkv.weight",
                                   "mtp.0.ffn.experts.7.w2.weight", "mtp.0.hc_head_fn"}) {
    SCOPED_TRACE(tensor);
    const std::string dir = WriteCheckpoint(absl::StrCat("missing_", tensor), tensor);
    auto ck = SafetensorsCheckpoint::Open(dir);
    ASSERT_TRUE(ck.ok()) << ck.status();
    absl::Status st = DeepseekV4Weights::Load(config_, ck->get(), &backend_, {}).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(tensor));
    EXPECT_THAT(std::string(st.message()), HasSubstr("MTP module 0"));
    // Asking for no draft layers reads none of them.
    DeepseekV4Config none = config_;
    none.num_draft_layers = 0;
    EXPECT_TRUE(DeepseekV4Weights::Load(none, ck->get(), &backend_, {}).ok());
  }
  for (const std::string tensor :
       {"mtp.0.enorm.weight", "mtp.0.h_proj.weight", "mtp.0.ffn.gate.bias"}) {
    SCOPED_TRACE(tensor);
    const std::string dir = WriteCheckpoint(absl::StrCat("misshaped_", tensor), "", tensor);
    auto ck = SafetensorsCheckpoint::Open(dir);
    ASSERT_TRUE(ck.ok()) << ck.status();
    absl::Status st = DeepseekV4Weights::Load(config_, ck->get(), &backend_, {}).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(tensor));
  }
}

// Through the registry: ModelConfig::num_draft_layers asks for the modules (as for DeepSeek-V3),
// the model keeps them (a cache layer each) and steps as without them; Draft runs module 0 over
// a step's residual streams and refuses rows of the wrong width.
TEST_F(V4MtpTest, TheModelKeepsTheModulesAndDrafts) {
  auto config = ModelConfig::FromJson(ConfigJson(), "config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_nextn_predict_layers, 1);
  const std::string dir = WriteCheckpoint("mtp_model");
  auto ck = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  config->num_draft_layers = 1;
  auto model = BuildModel(*config, ck->get(), &backend_);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->num_draft_layers(), 1);
  KvBlockPoolOptions o{(*model)->CacheSpec(), 8, 16};
  auto pool = KvBlockPool::Create(&backend_, o);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*model)->CacheSpec().num_layers(), config_.num_layers + 1);
  EXPECT_TRUE((*model)->Draft({}, pool->get()).ok());
  SequenceStep s;
  s.tokens = {3, 14, 15, 92};
  s.block_table = {0};
  s.return_hidden = true;
  ASSERT_TRUE((*pool)->Allocate(1).ok());
  auto step = (*model)->Step({s}, pool->get());
  ASSERT_TRUE(step.ok()) << step.status();
  const size_t width = config_.hc_mult * config_.hidden_size;
  ASSERT_EQ(step->hidden.size(), 1u);
  EXPECT_EQ(step->hidden[0].size(), 4 * width);
  DraftStep d;
  d.tokens = {14, 15, 92, 65};
  d.hidden = step->hidden[0];
  d.block_table = {0};
  auto draft = (*model)->Draft({d}, pool->get());
  ASSERT_TRUE(draft.ok()) << draft.status();
  ASSERT_EQ(draft->token.size(), 1u);
  EXPECT_GE(draft->token[0], 0);
  EXPECT_LT(draft->token[0], config_.vocab_size);
  EXPECT_GT(draft->probability[0], 0.0f);
  EXPECT_EQ(draft->hidden[0].size(), width);
  d.hidden.resize(4 * config_.hidden_size);  // one stream per row instead of hc_mult
  absl::Status narrow = (*model)->Draft({d}, pool->get()).status();
  EXPECT_EQ(narrow.code(), absl::StatusCode::kInvalidArgument) << narrow;
  EXPECT_THAT(std::string(narrow.message()), HasSubstr("residual streams"));
  d.hidden = step->hidden[0];
  d.module = 1;
  EXPECT_EQ((*model)->Draft({d}, pool->get()).status().code(), absl::StatusCode::kInvalidArgument);
  // More modules than the checkpoint has.
  config->num_draft_layers = 2;
  absl::Status st = BuildModel(*config, ck->get(), &backend_).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("num_nextn_predict_layers"));
  // `dummy:` weights generate the module too.
  config->num_draft_layers = 1;
  DummyWeightSource dummy(3);
  auto generated = BuildModel(*config, &dummy, &backend_);
  ASSERT_TRUE(generated.ok()) << generated.status();
  EXPECT_EQ((*generated)->num_draft_layers(), 1);
}

// The release's per-layer compress ratios go on past the model's layers for its MTP modules.
TEST(V4MtpConfigTest, ModuleKindFromTheReleaseList) {
  const std::string json = R"({"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2,
    "num_attention_heads": 2, "head_dim": 16, "q_lora_rank": 8, "o_groups": 2, "o_lora_rank": 4,
    "index_n_heads": 2, "index_head_dim": 8, "qk_rope_head_dim": 4,
    "num_nextn_predict_layers": 2, "compress_ratios": [4, 128, 0, 128]})";
  auto c = DeepseekV4Config::FromJson(json, "c.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attention.size(), 2u);
  ASSERT_EQ(c->mtp_attention.size(), 2u);
  EXPECT_EQ(c->mtp_attention[0], V4AttentionKind::kSliding);
  EXPECT_EQ(c->mtp_attention[1], V4AttentionKind::kCompressed);
  EXPECT_EQ(c->mtp_compress_rate[1], 128);
  // A config without the key: HF's default, one module.
  auto d = DeepseekV4Config::FromJson(R"({"vocab_size": 64, "hidden_size": 16,
    "num_hidden_layers": 1, "num_attention_heads": 2})",
                                      "d.json");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->num_nextn_predict_layers, 1);
}

}  // namespace
}  // namespace deepinfer
