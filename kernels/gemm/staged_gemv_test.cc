// StagedGemvBf16 against the CPU backend: kCopy (fp32 and bf16 rows, every m, one to four
// targets, one and several passes per row, partial passes, padded strides, accumulate) against
// CpuBackend::Gemm; kAddRmsNorm against CpuBackend::AddRmsNorm + Gemm (x updated bit for bit, c
// within the GEMM's bound plus a few bf16 roundings that a last-ulp difference of the norm can
// flip) and bit for bit against the GPU's unfused AddRmsNormF32 + the kCopy path; the counter
// is left at 0 (a second launch gives the same bits); each pass size (1, 2, 4, 6 and 8 chunks a
// lane) against CpuBackend::Gemm; a batch of products (kCopy) against CpuBackend::Gemm per
// product; refusals.
#include "kernels/gemm/staged_gemv.h"

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/norm/rms_norm.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/backend.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::DeviceArray;

// One weight matrix of a case, on the host and the device.
struct Target {
  int64_t n, ldw, ldc;
  std::vector<uint16_t> w;
  std::vector<float> c0;
  std::unique_ptr<DeviceArray<uint16_t>> dw;
  std::unique_ptr<DeviceArray<float>> dc;
};

std::vector<Target> MakeTargets(const std::vector<int64_t>& ns, int64_t m, int64_t k,
                                int64_t ldw_pad, int64_t ldc_pad, uint32_t seed) {
  std::vector<Target> ts;
  for (size_t t = 0; t < ns.size(); ++t) {
    Target tg;
    tg.n = ns[t], tg.ldw = k + ldw_pad, tg.ldc = ns[t] + ldc_pad;
    tg.w = FloatsToBf16Bits(testing::RandomFloats(tg.n * tg.ldw, seed + 10 + t));
    tg.c0 = testing::RandomFloats(m * tg.ldc, seed + 20 + t);
    tg.dw = std::make_unique<DeviceArray<uint16_t>>(tg.w);
    tg.dc = std::make_unique<DeviceArray<float>>(tg.c0);
    ts.push_back(std::move(tg));
  }
  return ts;
}

void SetTargets(std::vector<Target>& ts, bool accumulate, kernels::StagedGemvParams* p) {
  p->num_targets = static_cast<int>(ts.size());
  for (size_t t = 0; t < ts.size(); ++t) {
    kernels::StagedGemvTarget& tg = p->targets[t];
    tg.n = ts[t].n, tg.w = ts[t].dw->get(), tg.ldw = ts[t].ldw;
    tg.c = ts[t].dc->get(), tg.ldc = ts[t].ldc, tg.accumulate = accumulate;
  }
}

struct CopyCase {
  int64_t m, k;
  std::vector<int64_t> ns;
  int64_t lda_pad, ldw_pad, ldc_pad;
  bool accumulate;
};

TEST(StagedGemvTest, CopyMatchesCpuGemm) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  const std::vector<CopyCase> cases = {
      {1, 2048, {3072, 576}, 0, 0, 0, false},   // q_proj + kv_a_proj
      {1, 2048, {2048}, 0, 0, 0, true},         // o_proj
      {1, 2816, {2048}, 0, 0, 0, true},         // shared down: two passes of 6 chunks
      {2, 11264, {129}, 8, 8, 3, false},        // six passes, the last partial
      {3, 512, {128, 7, 33}, 0, 0, 0, false},   // two chunks a lane
      {4, 128, {512}, 8, 0, 0, false},          // half the lanes idle
      {4, 40, {7}, 8, 8, 1, true},              // five chunks a row
      {2, 1032, {37}, 0, 0, 0, false},          // 129 chunks
      {1, 64, {5, 1, 300, 17}, 0, 8, 2, true},  // four targets
      {4, 8192, {1000}, 0, 0, 0, false},        // 64 KiB of staged activation
  };
  for (const CopyCase& c : cases) {
    for (bool a_bf16 : {false, true}) {
      const uint32_t seed = testing::FreshSeed();
      SCOPED_TRACE(::testing::Message()
                   << "m " << c.m << " k " << c.k << " targets " << c.ns.size() << " n0 " << c.ns[0]
                   << " a_bf16 " << a_bf16 << " seed " << seed);
      const int64_t lda = c.k + c.lda_pad;
      std::vector<float> a = testing::RandomFloats(c.m * lda, seed, 2.0f);
      if (a_bf16) {
        for (float& v : a) v = RoundToBf16(v);
      }
      std::vector<Target> ts = MakeTargets(c.ns, c.m, c.k, c.ldw_pad, c.ldc_pad, seed);
      DeviceArray<float> da(a);
      DeviceArray<uint16_t> da16(FloatsToBf16Bits(a));
      kernels::StagedGemvParams p;
      p.m = c.m, p.k = c.k;
      p.prologue = kernels::StagedGemvPrologue::kCopy;
      p.a = a_bf16 ? static_cast<const void*>(da16.get()) : da.get();
      p.a_bf16 = a_bf16;
      p.lda = lda;
      SetTargets(ts, c.accumulate, &p);
      ASSERT_TRUE(kernels::StagedGemvSupports(p));
      DEEPINFER_CUDA_OK(kernels::StagedGemvBf16(p, nullptr));
      for (Target& t : ts) {
        std::vector<float> want = t.c0;
        cpu.Gemm(c.m, t.n, c.k, a.data(), lda, WeightView(t.w.data(), WeightDType::kBFloat16),
                 t.ldw, want.data(), t.ldc, c.accumulate);
        std::vector<float> got;
        DEEPINFER_CUDA_OK(t.dc->Download(&got));
        // Exact products, fp32 sums in another order: a few ulp of sqrt(k)-sized sums.
        EXPECT_TRUE(AllClose(got, want, 2e-5 * std::sqrt(static_cast<double>(c.k)), 1e-5));
        for (int64_t i = 0; i < c.m; ++i) {
          for (int64_t j = t.n; j < t.ldc; ++j) {
            ASSERT_EQ(got[i * t.ldc + j], t.c0[i * t.ldc + j]) << "padding written";
          }
        }
      }
    }
  }
}

struct NormCase {
  int64_t m, k;
  std::vector<int64_t> ns;
  bool with_y;
};

TEST(StagedGemvTest, AddRmsNormMatchesCpuAndTheUnfusedKernels) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  DeviceArray<unsigned int> counter(std::vector<unsigned int>{0});
  const float eps = 1e-6f;
  const std::vector<NormCase> cases = {
      {1, 2048, {3072, 576}, true}, {1, 2048, {3072, 576}, false}, {2, 2048, {64, 1}, true},
      {4, 2048, {300}, true},       {4, 7168, {1536, 576}, true},  {1, 1000, {9}, true},
  };
  for (const NormCase& c : cases) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "m " << c.m << " k " << c.k << " n0 " << c.ns[0]
                                      << " with_y " << c.with_y << " seed " << seed);
    const int64_t mk = c.m * c.k;
    const std::vector<float> x = testing::RandomFloats(mk, seed, 3.0f);
    const std::vector<float> y = testing::RandomFloats(mk, seed + 1);
    std::vector<float> gamma = testing::RandomFloats(c.k, seed + 2, 0.2f);
    for (float& g : gamma) g += 1.0f;
    std::vector<Target> ts = MakeTargets(c.ns, c.m, c.k, 0, 0, seed);
    DeviceArray<float> dx(x), dy(y), dgamma(gamma);
    kernels::StagedGemvParams p;
    p.m = c.m, p.k = c.k;
    p.prologue = kernels::StagedGemvPrologue::kAddRmsNorm;
    p.x = dx.get(), p.y = c.with_y ? dy.get() : nullptr, p.norm_weight = dgamma.get(), p.eps = eps;
    p.counter = counter.get();
    SetTargets(ts, false, &p);
    ASSERT_TRUE(kernels::StagedGemvSupports(p));
    DEEPINFER_CUDA_OK(kernels::StagedGemvBf16(p, nullptr));

    // The CPU backend: x += y, the norm rounded to bf16, the GEMMs.
    std::vector<float> cpu_x = x;
    std::vector<uint16_t> cpu_act(mk);
    cpu.AddRmsNorm(c.m, c.k, cpu_x.data(), c.with_y ? y.data() : nullptr, gamma.data(), eps,
                   nullptr, cpu_act.data());
    std::vector<float> got_x;
    DEEPINFER_CUDA_OK(dx.Download(&got_x));
    EXPECT_TRUE(AllClose(got_x, cpu_x, 0, 0));  // one fp32 add per element, or none
    std::vector<unsigned int> got_counter;
    DEEPINFER_CUDA_OK(counter.Download(&got_counter));
    EXPECT_EQ(got_counter[0], 0u);

    // The GPU's unfused sequence: AddRmsNormF32's bf16 rows, then the kCopy path.
    DeviceArray<float> ux(x);
    DeviceArray<uint16_t> uact(mk);
    DEEPINFER_CUDA_OK(kernels::AddRmsNormF32(c.m, c.k, ux.get(), c.with_y ? dy.get() : nullptr,
                                             dgamma.get(), eps, nullptr, uact.get(), nullptr));
    std::vector<Target> uts = MakeTargets(c.ns, c.m, c.k, 0, 0, seed);
    kernels::StagedGemvParams u;
    u.m = c.m, u.k = c.k;
    u.prologue = kernels::StagedGemvPrologue::kCopy;
    u.a = uact.get(), u.a_bf16 = true, u.lda = c.k;
    SetTargets(uts, false, &u);
    DEEPINFER_CUDA_OK(kernels::StagedGemvBf16(u, nullptr));

    // A second fused launch (the counter reused) from the same x.
    DeviceArray<float> dx2(x);
    std::vector<Target> ts2 = MakeTargets(c.ns, c.m, c.k, 0, 0, seed);
    kernels::StagedGemvParams p2 = p;
    p2.x = dx2.get();
    SetTargets(ts2, false, &p2);
    DEEPINFER_CUDA_OK(kernels::StagedGemvBf16(p2, nullptr));

    for (size_t t = 0; t < ts.size(); ++t) {
      const Target& tg = ts[t];
      std::vector<float> want(c.m * tg.ldc);
      cpu.Gemm(c.m, tg.n, c.k, ActivationView::Bf16(cpu_act.data()), c.k,
               WeightView(tg.w.data(), WeightDType::kBFloat16), tg.ldw, want.data(), tg.ldc, false);
      std::vector<float> got, unfused, again;
      DEEPINFER_CUDA_OK(tg.dc->Download(&got));
      DEEPINFER_CUDA_OK(uts[t].dc->Download(&unfused));
      DEEPINFER_CUDA_OK(ts2[t].dc->Download(&again));
      EXPECT_TRUE(AllClose(got, unfused, 0, 0));
      EXPECT_TRUE(AllClose(again, got, 0, 0));
      // Against the CPU: the GEMM's bound, plus up to 4 activation values a bf16 ulp apart
      // (the GPU's sum of squares runs in another order, so the last bit of the norm may differ).
      for (int64_t i = 0; i < c.m; ++i) {
        double max_term = 0.0;
        for (int64_t pp = 0; pp < c.k; ++pp) {
          max_term = std::max(
              max_term, std::abs(static_cast<double>(Bf16BitsToFloat(cpu_act[i * c.k + pp]))));
        }
        for (int64_t j = 0; j < tg.n; ++j) {
          double max_w = 0.0;
          for (int64_t pp = 0; pp < c.k; ++pp) {
            max_w = std::max(max_w,
                             std::abs(static_cast<double>(Bf16BitsToFloat(tg.w[j * tg.ldw + pp]))));
          }
          const double tol = 2e-5 * std::sqrt(static_cast<double>(c.k)) +
                             1e-5 * std::abs(want[i * tg.ldc + j]) +
                             4 * std::ldexp(max_term * max_w, -8);
          ASSERT_LE(std::abs(got[i * tg.ldc + j] - want[i * tg.ldc + j]), tol)
              << "row " << i << " column " << j << " of target " << t;
        }
      }
    }
  }
}

// Each pass size a lane can load (StagedGemvLaneChunks) against the CPU.
TEST(StagedGemvTest, EachPassSizeMatchesCpuGemm) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  const std::vector<std::pair<CopyCase, int>> cases = {
      {{3, 256, {300}, 0, 0, 0, false}, 1},         // 32 chunks: one a lane
      {{4, 512, {129, 64}, 0, 8, 0, false}, 2},     // 64 chunks
      {{1, 1024, {1000, 300}, 0, 0, 0, false}, 4},  // q_b + index_q_b's k
      {{2, 1024, {517}, 8, 0, 3, true}, 4},         // padded strides, accumulate
      {{1, 1408, {64}, 0, 0, 0, false}, 6},         // 176 chunks: half the lanes 5, half 6
      {{1, 1032, {70}, 0, 0, 0, false}, 6},         // 129 chunks: lane 0 5, the others 4
      {{1, 4096, {300}, 0, 0, 0, true}, 8},         // two passes a row
  };
  for (const auto& [c, lane_chunks] : cases) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "m " << c.m << " k " << c.k << " n0 " << c.ns[0] << " seed " << seed);
    const int64_t lda = c.k + c.lda_pad;
    const std::vector<float> a = testing::RandomFloats(c.m * lda, seed, 2.0f);
    DeviceArray<float> da(a);
    std::vector<Target> ts = MakeTargets(c.ns, c.m, c.k, c.ldw_pad, c.ldc_pad, seed);
    kernels::StagedGemvParams p;
    p.m = c.m, p.k = c.k;
    p.prologue = kernels::StagedGemvPrologue::kCopy;
    p.a = da.get(), p.lda = lda;
    SetTargets(ts, c.accumulate, &p);
    ASSERT_TRUE(kernels::StagedGemvSupports(p));
    EXPECT_EQ(kernels::StagedGemvLaneChunks(p), lane_chunks);
    DEEPINFER_CUDA_OK(kernels::StagedGemvBf16(p, nullptr));
    for (Target& t : ts) {
      std::vector<float> want = t.c0;
      cpu.Gemm(c.m, t.n, c.k, a.data(), lda, WeightView(t.w.data(), WeightDType::kBFloat16), t.ldw,
               want.data(), t.ldc, c.accumulate);
      std::vector<float> got;
      DEEPINFER_CUDA_OK(t.dc->Download(&got));
      EXPECT_TRUE(AllClose(got, want, 2e-5 * std::sqrt(static_cast<double>(c.k)), 1e-5));
    }
  }
}

struct BatchCase {
  int64_t batch, m, n, k;
  bool a_bf16, accumulate;
};

// batch products in one launch: product b's activation, weights and outputs at their strides.
TEST(StagedGemvTest, BatchMatchesCpuGemmPerProduct) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  const std::vector<BatchCase> cases = {
      {8, 1, 256, 4096, false, false},  // o_a's layout (8 groups, k 4096), fewer rows
      {3, 2, 100, 1024, true, true},
      {5, 1, 37, 2056, false, false},  // 257 chunks: two passes, the last partial
  };
  for (const BatchCase& c : cases) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "batch " << c.batch << " m " << c.m << " n " << c.n
                                      << " k " << c.k << " seed " << seed);
    // Padded strides: activation rows lda = k + 8 apart, products stride_a = m * lda + 16 apart;
    // weight products n * k + 8 apart; outputs ldc = n + 3, stride_c = m * ldc + 5.
    const int64_t lda = c.k + 8, stride_a = c.m * lda + 16;
    const int64_t stride_w = c.n * c.k + 8;
    const int64_t ldc = c.n + 3, stride_c = c.m * ldc + 5;
    std::vector<float> a = testing::RandomFloats(c.batch * stride_a, seed, 2.0f);
    if (c.a_bf16) {
      for (float& v : a) v = RoundToBf16(v);
    }
    const std::vector<uint16_t> w =
        FloatsToBf16Bits(testing::RandomFloats(c.batch * stride_w, seed + 1));
    const std::vector<float> c0 = testing::RandomFloats(c.batch * stride_c, seed + 2);
    DeviceArray<float> da(a);
    DeviceArray<uint16_t> da16(FloatsToBf16Bits(a));
    DeviceArray<uint16_t> dw(w);
    DeviceArray<float> dc(c0);
    kernels::StagedGemvParams p;
    p.m = c.m, p.k = c.k;
    p.prologue = kernels::StagedGemvPrologue::kCopy;
    p.a = c.a_bf16 ? static_cast<const void*>(da16.get()) : da.get();
    p.a_bf16 = c.a_bf16, p.lda = lda;
    p.num_targets = 1;
    p.targets[0] = {c.n, dw.get(), c.k, dc.get(), ldc, c.accumulate};
    p.batch = c.batch, p.stride_a = stride_a, p.stride_w = stride_w, p.stride_c = stride_c;
    ASSERT_TRUE(kernels::StagedGemvSupports(p));
    DEEPINFER_CUDA_OK(kernels::StagedGemvBf16(p, nullptr));
    std::vector<float> want = c0;
    for (int64_t b = 0; b < c.batch; ++b) {
      cpu.Gemm(c.m, c.n, c.k, a.data() + b * stride_a, lda,
               WeightView(w.data() + b * stride_w, WeightDType::kBFloat16), c.k,
               want.data() + b * stride_c, ldc, c.accumulate);
    }
    std::vector<float> got;
    DEEPINFER_CUDA_OK(dc.Download(&got));
    // Outside the products' outputs (row padding, gaps between products) c0 is left as it was.
    EXPECT_TRUE(AllClose(got, want, 2e-5 * std::sqrt(static_cast<double>(c.k)), 1e-5));
    for (int64_t b = 0; b < c.batch; ++b) {
      for (int64_t i = b * stride_c; i < (b + 1) * stride_c; ++i) {
        const int64_t in = i - b * stride_c;
        if (in >= c.m * ldc || in % ldc >= c.n) {
          ASSERT_EQ(got[i], c0[i]) << "written outside product " << b;
        }
      }
    }
  }
}

TEST(StagedGemvTest, RefusesWhatItCannotRun) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  DeviceArray<float> a(64 * 1024), c(64 * 1024);
  DeviceArray<uint16_t> w(64 * 1024);
  kernels::StagedGemvParams p;
  p.m = 1, p.k = 64, p.a = a.get(), p.lda = 64;
  p.num_targets = 1;
  p.targets[0].n = 16, p.targets[0].w = w.get(), p.targets[0].ldw = 64;
  p.targets[0].c = c.get(), p.targets[0].ldc = 16;
  EXPECT_TRUE(kernels::StagedGemvSupports(p));
  kernels::StagedGemvParams bad = p;
  bad.m = kernels::kStagedGemvMaxRows + 1;
  EXPECT_FALSE(kernels::StagedGemvSupports(bad));
  EXPECT_EQ(kernels::StagedGemvBf16(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.k = 60;  // not a multiple of 8
  EXPECT_FALSE(kernels::StagedGemvSupports(bad));
  bad = p;
  bad.targets[0].w = w.get() + 1;  // not 16-byte aligned
  EXPECT_FALSE(kernels::StagedGemvSupports(bad));
  bad = p;
  bad.num_targets = 0;
  EXPECT_FALSE(kernels::StagedGemvSupports(bad));
  bad = p;
  bad.m = 4, bad.k = 8200, bad.lda = 8200, bad.targets[0].ldw = 8200;  // over 64 KiB staged
  EXPECT_FALSE(kernels::StagedGemvSupports(bad));
  bad = p;
  bad.prologue = kernels::StagedGemvPrologue::kAddRmsNorm;
  bad.x = a.get(), bad.norm_weight = a.get(), bad.y = c.get();  // y without a counter
  EXPECT_FALSE(kernels::StagedGemvSupports(bad));
  kernels::StagedGemvParams batched = p;
  batched.batch = 2, batched.stride_a = 64, batched.stride_w = 16 * 64, batched.stride_c = 16;
  EXPECT_TRUE(kernels::StagedGemvSupports(batched));
  bad = batched;
  bad.stride_a = 2;  // not 16-byte aligned
  EXPECT_FALSE(kernels::StagedGemvSupports(bad));
  bad = batched;
  bad.num_targets = 2;  // a batch of one target only
  bad.targets[1] = bad.targets[0];
  EXPECT_FALSE(kernels::StagedGemvSupports(bad));
  bad = batched;
  bad.prologue = kernels::StagedGemvPrologue::kAddRmsNorm;  // a batch of kCopy only
  bad.x = a.get(), bad.norm_weight = a.get();
  EXPECT_FALSE(kernels::StagedGemvSupports(bad));
}

}  // namespace
}  // namespace deepinfer
