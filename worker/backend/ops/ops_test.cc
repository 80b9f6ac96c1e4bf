// Tests for the op providers: each runs the backend's fused op where the backend has one and
// otherwise a reference composition whose values are checked against host formulas or, for
// attention, against the other form of the same function.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/ops/attention_ops.h"
#include "worker/backend/ops/mlp_ops.h"
#include "worker/backend/ops/moe_ops.h"

namespace deepinfer {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// The CPU backend, with fused ops it may be told to have (doing nothing but being counted) and
// counts of the primitives the reference compositions use.
class SpyBackend : public CpuBackend {
 public:
  SpyBackend() : CpuBackend(1) {}
  bool has_fused = false;
  int fused_calls = 0, gemms = 0, norms = 0, silu_bf16 = 0, adds = 0, mha = 0;
  // What RoutedExperts writes when has_routed (a stand-in for the routed sum).
  bool has_routed = false;
  float routed_value = 0.0f;

  bool NormedDenseMlp(const DenseMlpArgs&) override { return Fused(); }
  bool GateUpSiluMulBf16(int64_t, int64_t, int64_t, ActivationView, int64_t, WeightView, int64_t,
                         float, uint16_t*) override {
    return Fused();
  }
  bool RoutedAndSharedExperts(const RoutedExpertsArgs&) override { return Fused(); }
  bool RoutedExperts(const RoutedExpertsArgs& a) override {
    if (!has_routed) return false;
    std::vector<float> v(a.num_tokens * a.hidden_size, routed_value);
    CopyToDevice(v.data(), v.size() * sizeof(float), a.out);
    return true;
  }
  bool MhaPrefillAttention(const MhaPrefillArgs& a) override {
    if (!has_fused) return false;
    ++mha;
    return CpuBackend::MhaPrefillAttention(a);
  }
  void Gemm(int64_t m, int64_t n, int64_t k, ActivationView a, int64_t lda, WeightView w,
            int64_t ldw, float* c, int64_t ldc, bool accumulate) override {
    ++gemms;
    CpuBackend::Gemm(m, n, k, a, lda, w, ldw, c, ldc, accumulate);
  }
  void AddRmsNorm(int64_t rows, int64_t dim, float* x, const float* y, const float* weight,
                  float eps, float* out, uint16_t* out_bf16) override {
    ++norms;
    CpuBackend::AddRmsNorm(rows, dim, x, y, weight, eps, out, out_bf16);
  }
  void SiluMulBf16(int64_t rows, int64_t inter, const float* x, uint16_t* out) override {
    ++silu_bf16;
    CpuBackend::SiluMulBf16(rows, inter, x, out);
  }
  void Add(int64_t n, const float* a, const float* b, float* out) override {
    ++adds;
    CpuBackend::Add(n, a, b, out);
  }

 private:
  bool Fused() {
    if (has_fused) ++fused_calls;
    return has_fused;
  }
};

// out[r] = down(silu(gate h[r]) * up h[r]) in double.
std::vector<double> HostSwiGlu(const std::vector<float>& h, int64_t rows, int64_t hidden,
                               int64_t inter, const std::vector<float>& gate_up,
                               const std::vector<float>& down) {
  std::vector<double> out(rows * hidden, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> act(inter);
    for (int64_t i = 0; i < inter; ++i) {
      double g = 0, u = 0;
      for (int64_t p = 0; p < hidden; ++p) {
        g += double(h[r * hidden + p]) * gate_up[i * hidden + p];
        u += double(h[r * hidden + p]) * gate_up[(inter + i) * hidden + p];
      }
      act[i] = g / (1.0 + std::exp(-g)) * u;
    }
    for (int64_t j = 0; j < hidden; ++j) {
      for (int64_t i = 0; i < inter; ++i) out[r * hidden + j] += act[i] * down[j * inter + i];
    }
  }
  return out;
}

struct Buffers {
  explicit Buffers(Backend* b) : backend(b) {}
  float* Upload(const std::vector<float>& v) {
    held.push_back(backend->Allocate(v.size() * sizeof(float)));
    backend->CopyToDevice(v.data(), v.size() * sizeof(float), held.back()->data());
    return held.back()->as<float>();
  }
  int32_t* Upload(const std::vector<int32_t>& v) {
    held.push_back(backend->Allocate(v.size() * sizeof(int32_t)));
    backend->CopyToDevice(v.data(), v.size() * sizeof(int32_t), held.back()->data());
    return held.back()->as<int32_t>();
  }
  std::vector<float> Read(const float* p, size_t n) {
    std::vector<float> v(n);
    backend->CopyToHost(p, n * sizeof(float), v.data());
    return v;
  }
  Backend* backend;
  std::vector<std::unique_ptr<DeviceBuffer>> held;
};

constexpr int64_t kRows = 3, kHidden = 16, kInter = 8;

TEST(MlpOpsTest, NormedSwiGluRunsTheFusedOpAloneWhereTheBackendHasIt) {
  SpyBackend be;
  be.has_fused = true;
  Buffers b(&be);
  DenseMlpArgs d;
  d.rows = kRows;
  d.hidden_size = kHidden;
  d.inter = kInter;
  d.x = b.Upload(Random(kRows * kHidden, 1));
  d.norm_weight = b.Upload(Random(kHidden, 2));
  d.normed = b.Upload(std::vector<float>(kRows * kHidden));
  d.gate_up = b.Upload(Random(2 * kInter * kHidden, 3));
  d.down = b.Upload(Random(kHidden * kInter, 4));
  d.out = b.Upload(std::vector<float>(kRows * kHidden));
  NormedSwiGlu(&be, d, nullptr);
  EXPECT_EQ(be.fused_calls, 1);
  EXPECT_EQ(be.gemms + be.norms, 0);
}

TEST(MlpOpsTest, NormedSwiGluReferenceAddsNormsAndRunsTheMlp) {
  SpyBackend be;
  Buffers b(&be);
  const auto x = Random(kRows * kHidden, 1), y = Random(kRows * kHidden, 5);
  const auto weight = Random(kHidden, 2), gate_up = Random(2 * kInter * kHidden, 3, 0.3f);
  const auto down = Random(kHidden * kInter, 4, 0.3f);
  DenseMlpArgs d;
  d.rows = kRows;
  d.hidden_size = kHidden;
  d.inter = kInter;
  d.x = b.Upload(x);
  d.y = b.Upload(y);
  d.norm_weight = b.Upload(weight);
  d.eps = 1e-6f;
  d.normed = b.Upload(std::vector<float>(kRows * kHidden));
  d.gate_up = b.Upload(gate_up);
  d.down = b.Upload(down);
  d.out = b.Upload(std::vector<float>(kRows * kHidden));
  NormedSwiGlu(&be, d, nullptr);
  EXPECT_EQ(be.norms, 1);
  EXPECT_EQ(be.gemms, 2);
  // Host: x + y, its RMS norm, the MLP of that.
  std::vector<float> sum(kRows * kHidden), normed(kRows * kHidden);
  for (int64_t r = 0; r < kRows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < kHidden; ++j) {
      sum[r * kHidden + j] = x[r * kHidden + j] + y[r * kHidden + j];
      ss += double(sum[r * kHidden + j]) * sum[r * kHidden + j];
    }
    const double inv = 1.0 / std::sqrt(ss / kHidden + 1e-6);
    for (int64_t j = 0; j < kHidden; ++j) {
      normed[r * kHidden + j] = static_cast<float>(sum[r * kHidden + j] * inv * weight[j]);
    }
  }
  const auto want = HostSwiGlu(normed, kRows, kHidden, kInter, gate_up, down);
  const auto got_x = b.Read(d.x, sum.size()), got = b.Read(d.out, want.size());
  for (size_t i = 0; i < sum.size(); ++i) EXPECT_FLOAT_EQ(got_x[i], sum[i]) << i;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4) << i;
}

TEST(MlpOpsTest, GateUpSiluMulBf16IsTheFusedOpOrGemmThenSiluMul) {
  for (bool has_fused : {true, false}) {
    SpyBackend be;
    be.has_fused = has_fused;
    Buffers b(&be);
    auto out = be.Allocate(kRows * kInter * sizeof(uint16_t));
    GateUpSiluMulBf16(&be, kRows, kInter, kHidden, b.Upload(Random(kRows * kHidden, 1)), kHidden,
                      b.Upload(Random(2 * kInter * kHidden, 2)), kHidden, out->as<uint16_t>());
    EXPECT_EQ(be.fused_calls, has_fused ? 1 : 0);
    EXPECT_EQ(be.gemms, has_fused ? 0 : 1);
    EXPECT_EQ(be.silu_bf16, has_fused ? 0 : 1);
  }
}

TEST(MoeOpsTest, ExpertsOnDeviceRefusesWhereTheBackendHasNoDeviceExperts) {
  CpuBackend be(1);
  Buffers b(&be);
  const std::vector<float> before(kRows * kHidden, 7.0f);
  RoutedExpertsArgs a;
  a.num_tokens = kRows;
  a.hidden_size = kHidden;
  a.out = b.Upload(before);
  EXPECT_FALSE(ExpertsOnDevice(&be, a, ActivationView(a.out), OpMode{}));
  EXPECT_EQ(b.Read(a.out, before.size()), before);
}

// Routed experts (the spy's stand-in value), then the shared MLP added after them, in both op
// modes; with fused ops a backend's whole-block op replaces both.
TEST(MoeOpsTest, ExpertsOnDeviceAddsTheSharedMlpAfterTheRoutedSum) {
  const auto h = Random(kRows * kHidden, 1);
  const auto gate_up = Random(2 * kInter * kHidden, 2, 0.3f), down = Random(kHidden * kInter, 3);
  const auto shared = HostSwiGlu(h, kRows, kHidden, kInter, gate_up, down);
  for (bool fused : {true, false}) {
    for (bool has_fused : {true, false}) {
      SpyBackend be;
      be.has_fused = has_fused;
      be.has_routed = true;
      be.routed_value = 0.5f;
      Buffers b(&be);
      RoutedExpertsArgs a;
      a.num_tokens = kRows;
      a.hidden_size = kHidden;
      a.hidden = b.Upload(h);
      a.shared_inter = kInter;
      a.shared_gate_up = b.Upload(gate_up);
      a.shared_down = b.Upload(down);
      a.out = b.Upload(std::vector<float>(kRows * kHidden));
      ASSERT_TRUE(ExpertsOnDevice(&be, a, ActivationView(a.hidden), OpMode{fused, false}));
      if (fused && has_fused) {
        EXPECT_EQ(be.fused_calls, 1);
        EXPECT_EQ(be.gemms, 0);
        continue;
      }
      EXPECT_EQ(be.fused_calls, 0) << "the op-by-op mode keeps the separate shared-expert ops";
      EXPECT_EQ(be.adds, fused ? 0 : 1);
      const auto got = b.Read(a.out, shared.size());
      for (size_t i = 0; i < shared.size(); ++i) EXPECT_NEAR(got[i], 0.5 + shared[i], 1e-4) << i;
    }
  }
}

// Two sequences over a paged latent cache: the absorbed form (the reference, which a backend
// without the non-absorbed op gets) and the CPU's non-absorbed form compute one function.
TEST(AttentionOpsTest, AbsorbedReferenceEqualsTheNonAbsorbedOp) {
  const int64_t nh = 2, nope = 4, rope = 2, vd = 3, kvl = 8, H = 5, bs = 4;
  const std::vector<MlaSequenceSpan> spans = {{0, 3, 5}, {3, 2, 2}};  // 2 cached + 3 new; 2 new
  const int64_t T = 5;
  const std::vector<int32_t> table = {1, 0, 2, 3};  // [2 sequences, 2 blocks]
  const std::vector<int32_t> token_seq = {0, 0, 0, 1, 1}, context_len = {3, 4, 5, 1, 2};
  const auto cache = Random(4 * bs * (kvl + rope), 1);
  const auto q = Random(T * nh * (nope + rope), 2);
  const auto kv_b = Random(nh * (nope + vd) * kvl, 3, 0.5f);
  const auto o_proj = Random(H * nh * vd, 4, 0.5f);
  // W_uk of head h is [latent, nope]: the transpose of kv_b's K_nope rows of that head.
  std::vector<float> w_uk(nh * kvl * nope);
  for (int64_t h = 0; h < nh; ++h) {
    for (int64_t c = 0; c < kvl; ++c) {
      for (int64_t i = 0; i < nope; ++i) {
        w_uk[(h * kvl + c) * nope + i] = kv_b[(h * (nope + vd) + i) * kvl + c];
      }
    }
  }
  std::vector<std::vector<float>> outs;
  for (bool has_mha : {true, false}) {
    SpyBackend be;
    be.has_fused = has_mha;
    Buffers b(&be);
    MlaOutputArgs a;
    a.tokens = T;
    a.heads = nh;
    a.nope_dim = nope;
    a.rope_dim = rope;
    a.v_dim = vd;
    a.hidden_size = H;
    a.q = b.Upload(q);
    a.cache.cache = b.Upload(cache);
    a.cache.block_size = bs;
    a.cache.latent_dim = kvl;
    a.cache.rope_dim = rope;
    a.block_tables = b.Upload(table);
    a.max_blocks_per_seq = 2;
    a.token_seq = b.Upload(token_seq);
    a.context_len = b.Upload(context_len);
    a.sequences = spans.data();
    a.num_sequences = 2;
    a.softmax_scale = 0.3f;
    a.w_uk = b.Upload(w_uk);
    a.kv_b = b.Upload(kv_b);
    a.o_proj = b.Upload(o_proj);
    a.non_absorbed = true;
    a.out = b.Upload(std::vector<float>(T * H));
    MlaAttentionOutput(&be, a);
    ASSERT_TRUE(be.status().ok()) << be.status();
    EXPECT_EQ(be.mha, has_mha ? 1 : 0);
    outs.push_back(b.Read(a.out, T * H));
  }
  for (int64_t i = 0; i < T * H; ++i) EXPECT_NEAR(outs[0][i], outs[1][i], 1e-4) << i;
}

// A step of decodes, prompts and a short chunk (sequences of 1, 4, 1, 3 and 2 new tokens) with
// the non-absorbed form from 3 new tokens: the long sequences' rows equal the non-absorbed op's
// over the whole step, the others' rows the absorbed form's, bit for bit (the CPU computes each
// row on its own); a backend without the op gets the absorbed form for every row.
TEST(AttentionOpsTest, MixedStepTakesEachSequencesForm) {
  const int64_t nh = 2, nope = 4, rope = 2, vd = 3, kvl = 8, H = 5, bs = 4, T = 11;
  // {first token, new tokens, context}: decode after 5 cached; prompt of 4; decode after 2;
  // 3 new after 2 cached; 2 new after 1 cached.
  const std::vector<MlaSequenceSpan> spans = {
      {0, 1, 6}, {1, 4, 4}, {5, 1, 3}, {6, 3, 5}, {9, 2, 3}};
  const std::vector<int32_t> table = {0, 1, 2, 7, 3, 7, 4, 5, 6, 7};  // [5 sequences, 2 blocks]
  const std::vector<int32_t> token_seq = {0, 1, 1, 1, 1, 2, 3, 3, 3, 4, 4};
  const std::vector<int32_t> context_len = {6, 1, 2, 3, 4, 3, 3, 4, 5, 2, 3};
  const auto cache = Random(8 * bs * (kvl + rope), 11);
  const auto q = Random(T * nh * (nope + rope), 12);
  const auto kv_b = Random(nh * (nope + vd) * kvl, 13, 0.5f);
  const auto o_proj = Random(H * nh * vd, 14, 0.5f);
  std::vector<float> w_uk(nh * kvl * nope);
  for (int64_t h = 0; h < nh; ++h) {
    for (int64_t c = 0; c < kvl; ++c) {
      for (int64_t i = 0; i < nope; ++i) {
        w_uk[(h * kvl + c) * nope + i] = kv_b[(h * (nope + vd) + i) * kvl + c];
      }
    }
  }
  // non_absorbed_min_tokens < 0: the absorbed form only. pad > 0: q's tokens at a stride of
  // that many more values (as within the rows of a stacked q and kv GEMM), the gaps 1e4.
  auto run = [&](bool has_mha, int32_t min_tokens, int* mha_calls, int64_t pad = 0) {
    SpyBackend be;
    be.has_fused = has_mha;
    Buffers b(&be);
    MlaOutputArgs a;
    a.tokens = T;
    a.heads = nh;
    a.nope_dim = nope;
    a.rope_dim = rope;
    a.v_dim = vd;
    a.hidden_size = H;
    const int64_t qdim = nh * (nope + rope);
    std::vector<float> strided(T * (qdim + pad), 1e4f);
    for (int64_t t = 0; t < T; ++t) {
      std::copy(q.begin() + t * qdim, q.begin() + (t + 1) * qdim,
                strided.begin() + t * (qdim + pad));
    }
    a.q = b.Upload(strided);
    a.q_token_stride = pad > 0 ? qdim + pad : 0;
    a.cache.cache = b.Upload(cache);
    a.cache.block_size = bs;
    a.cache.latent_dim = kvl;
    a.cache.rope_dim = rope;
    a.block_tables = b.Upload(table);
    a.max_blocks_per_seq = 2;
    a.token_seq = b.Upload(token_seq);
    a.context_len = b.Upload(context_len);
    a.sequences = spans.data();
    a.num_sequences = static_cast<int32_t>(spans.size());
    a.softmax_scale = 0.3f;
    a.w_uk = b.Upload(w_uk);
    a.kv_b = b.Upload(kv_b);
    a.o_proj = b.Upload(o_proj);
    a.non_absorbed = min_tokens >= 0;
    a.non_absorbed_min_tokens = min_tokens;
    a.out = b.Upload(std::vector<float>(T * H, 7.0f));
    MlaAttentionOutput(&be, a);
    EXPECT_TRUE(be.status().ok()) << be.status();
    *mha_calls = be.mha;
    return b.Read(a.out, T * H);
  };
  int calls = 0;
  const auto absorbed = run(true, -1, &calls);
  EXPECT_EQ(calls, 0);
  const auto non_absorbed = run(true, 0, &calls);
  EXPECT_EQ(calls, 1);
  const auto mixed = run(true, 3, &calls);
  EXPECT_EQ(calls, 2) << "one call per run of long sequences";
  const std::vector<bool> long_token = {false, true, true, true,  true, false,
                                        true,  true, true, false, false};
  for (int64_t t = 0; t < T; ++t) {
    const auto& want = long_token[t] ? non_absorbed : absorbed;
    for (int64_t i = 0; i < H; ++i) {
      EXPECT_EQ(mixed[t * H + i], want[t * H + i]) << "token " << t << " column " << i;
      EXPECT_NE(mixed[t * H + i], 7.0f) << "token " << t << " not written";
    }
  }
  // The forms differ somewhere, so the check above tells them apart.
  EXPECT_NE(absorbed, non_absorbed);
  EXPECT_EQ(run(false, 3, &calls), absorbed);
  EXPECT_EQ(calls, 0);
  // Strided queries: the same values in each form.
  EXPECT_EQ(run(true, -1, &calls, 5), absorbed);
  EXPECT_EQ(run(true, 0, &calls, 5), non_absorbed);
  EXPECT_EQ(run(true, 3, &calls, 5), mixed);
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace deepinfer
