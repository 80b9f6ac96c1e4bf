// StagedGemvBf16 with FP8 weights (StagedGemvParams::fp8) against a host reference in double on
// the dequantised weights (kernels/testing/fp8_test_util.h): kCopy with fp32 rows (rounded to
// bf16 as they are staged) at m = 1, 2 and 4, one and two targets (a stacked [gate; up]-like
// grid among them), k not a multiple of 128, several passes per row, padded strides, accumulate,
// short rows (one and two chunks a lane); kAddRmsNorm at one row against the GPU's unfused
// AddRmsNormF32 bf16 rows (x updated bit for bit as that kernel does); the FP8 argument checks.
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gemm/staged_gemv.h"
#include "kernels/norm/rms_norm.h"
#include "kernels/testing/fp8_test_util.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"

namespace deepinfer {
namespace {

using kernels::fp8_testing::Bf16Rounded;
using kernels::fp8_testing::ExpectDenseMatches;
using kernels::fp8_testing::HostFp8;
using kernels::fp8_testing::MakeWeight;
using testing::DeviceArray;

// fp32 sums of exact products in another order than the double reference (as fp8_mma_gemm_test).
double Unit(int64_t k) { return std::ldexp(1.0, -24) * (k / 4.0 + 64.0); }

struct Fp8Target {
  HostFp8 w;
  int64_t ldc = 0;
  std::vector<float> c0;
  std::unique_ptr<DeviceArray<uint8_t>> dw;
  std::unique_ptr<DeviceArray<float>> ds, dc;
};

// Targets of ns[t] rows (split[t]: the scale grid's stacking row, 0: none), k columns, ldw = k +
// ldw_pad (a multiple of 16), ldc = n + ldc_pad.
std::vector<Fp8Target> MakeTargets(const std::vector<int64_t>& ns,
                                   const std::vector<int64_t>& split, int64_t m, int64_t k,
                                   int64_t ldw_pad, int64_t ldc_pad, std::mt19937* gen) {
  std::vector<Fp8Target> ts;
  for (size_t t = 0; t < ns.size(); ++t) {
    Fp8Target tg;
    tg.w = MakeWeight(ns[t], k, k + ldw_pad, split[t], gen);
    tg.ldc = ns[t] + ldc_pad;
    tg.c0 = testing::RandomFloats(m * tg.ldc, (*gen)());
    tg.dw = std::make_unique<DeviceArray<uint8_t>>(tg.w.data);
    tg.ds = std::make_unique<DeviceArray<float>>(tg.w.scales);
    tg.dc = std::make_unique<DeviceArray<float>>(tg.c0);
    ts.push_back(std::move(tg));
  }
  return ts;
}

void SetTargets(std::vector<Fp8Target>& ts, bool accumulate, kernels::StagedGemvParams* p) {
  p->fp8 = true;
  p->num_targets = static_cast<int>(ts.size());
  for (size_t t = 0; t < ts.size(); ++t) {
    kernels::StagedGemvTarget& tg = p->targets[t];
    tg.n = ts[t].w.n, tg.w8 = ts[t].dw->get(), tg.ldw = ts[t].w.ldw;
    tg.scales = ts[t].ds->get(), tg.scale_ld = ts[t].w.scale_ld, tg.split_rows = ts[t].w.split;
    tg.c = ts[t].dc->get(), tg.ldc = ts[t].ldc, tg.accumulate = accumulate;
  }
}

struct CopyCase {
  int64_t m, k;
  std::vector<int64_t> ns, split;
  int64_t ldw_pad, ldc_pad;
  bool accumulate;
};

TEST(StagedGemvFp8Test, CopyMatchesDequantisedReference) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const std::vector<CopyCase> cases = {
      {1, 2048, {3072, 576}, {0, 0}, 0, 0, false},  // Moonlight's q_proj + kv_a_proj
      {1, 2048, {300}, {150}, 16, 3, true},         // a stacked grid, padded strides, accumulate
      {2, 272, {65, 9}, {0, 0}, 0, 0, false},       // k not a multiple of 128
      {4, 1408, {130}, {0}, 32, 0, true},
      {1, 7168, {200}, {0}, 0, 0, false},  // several passes per row (k / 16 > 256 chunks)
      // Short rows: 2 chunks a lane (k 1024), 1 (k 512).
      {1, 1024, {777, 65}, {0, 0}, 0, 0, false},
      {1, 1024, {777}, {0}, 0, 0, true},
      {4, 1024, {130}, {0}, 16, 0, false},
      {2, 512, {300}, {0}, 0, 0, false},
  };
  for (const CopyCase& c : cases) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "m " << c.m << " k " << c.k << " n0 " << c.ns[0] << " seed " << seed);
    std::mt19937 gen(seed);
    std::vector<Fp8Target> ts = MakeTargets(c.ns, c.split, c.m, c.k, c.ldw_pad, c.ldc_pad, &gen);
    const int64_t lda = c.k + 4;
    const std::vector<float> a = testing::RandomFloats(c.m * lda, seed);
    DeviceArray<float> da(a);
    kernels::StagedGemvParams p;
    p.m = c.m, p.k = c.k;
    p.prologue = kernels::StagedGemvPrologue::kCopy;
    p.a = da.get(), p.a_bf16 = false, p.lda = lda;
    SetTargets(ts, c.accumulate, &p);
    ASSERT_TRUE(kernels::StagedGemvSupports(p));
    DEEPINFER_CUDA_OK(kernels::StagedGemvBf16(p, nullptr));
    for (Fp8Target& t : ts) {
      std::vector<float> got;
      DEEPINFER_CUDA_OK(t.dc->Download(&got));
      ExpectDenseMatches(got, t.c0, t.ldc, Bf16Rounded(a), lda, c.m, t.w, c.accumulate, Unit(c.k));
    }
  }
}

// One row through the norm prologue (with and without y): the activation bit for bit the bf16
// row AddRmsNormF32 writes, so the product is checked against that row.
TEST(StagedGemvFp8Test, AddRmsNormMatchesTheUnfusedNorm) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  DeviceArray<unsigned int> counter(std::vector<unsigned int>{0});
  const float eps = 1e-6f;
  const int64_t k = 2048;
  for (const bool with_y : {true, false}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "with_y " << with_y << " seed " << seed);
    std::mt19937 gen(seed);
    const std::vector<float> x = testing::RandomFloats(k, seed, 3.0f);
    const std::vector<float> y = testing::RandomFloats(k, seed + 1);
    std::vector<float> gamma = testing::RandomFloats(k, seed + 2, 0.2f);
    for (float& g : gamma) g += 1.0f;
    std::vector<Fp8Target> ts = MakeTargets({3072, 576}, {0, 0}, 1, k, 0, 0, &gen);
    DeviceArray<float> dx(x), dy(y), dgamma(gamma);
    kernels::StagedGemvParams p;
    p.m = 1, p.k = k;
    p.prologue = kernels::StagedGemvPrologue::kAddRmsNorm;
    p.x = dx.get(), p.y = with_y ? dy.get() : nullptr, p.norm_weight = dgamma.get(), p.eps = eps;
    p.counter = counter.get();
    SetTargets(ts, false, &p);
    ASSERT_TRUE(kernels::StagedGemvSupports(p));
    DEEPINFER_CUDA_OK(kernels::StagedGemvBf16(p, nullptr));

    DeviceArray<float> ux(x);
    DeviceArray<uint16_t> uact(k);
    DEEPINFER_CUDA_OK(kernels::AddRmsNormF32(1, k, ux.get(), with_y ? dy.get() : nullptr,
                                             dgamma.get(), eps, nullptr, uact.get(), nullptr));
    std::vector<float> got_x, want_x;
    DEEPINFER_CUDA_OK(dx.Download(&got_x));
    DEEPINFER_CUDA_OK(ux.Download(&want_x));
    ASSERT_EQ(got_x, want_x);
    std::vector<uint16_t> act16;
    DEEPINFER_CUDA_OK(uact.Download(&act16));
    std::vector<double> act(k);
    for (int64_t i = 0; i < k; ++i) act[i] = Bf16BitsToFloat(act16[i]);
    for (Fp8Target& t : ts) {
      std::vector<float> got;
      DEEPINFER_CUDA_OK(t.dc->Download(&got));
      ExpectDenseMatches(got, t.c0, t.ldc, act, k, 1, t.w, false, Unit(k));
    }
  }
}

TEST(StagedGemvFp8Test, RefusesWhatItCannotRun) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  DeviceArray<float> a(64), c(64), s(16);
  DeviceArray<uint8_t> w(1024);
  kernels::StagedGemvParams p;
  p.m = 1, p.k = 32;
  p.prologue = kernels::StagedGemvPrologue::kCopy;
  p.a = a.get(), p.lda = 32;
  p.fp8 = true;
  p.num_targets = 1;
  p.targets[0].n = 4, p.targets[0].w8 = w.get(), p.targets[0].ldw = 32;
  p.targets[0].scales = s.get(), p.targets[0].scale_ld = 1;
  p.targets[0].c = c.get(), p.targets[0].ldc = 4;
  EXPECT_TRUE(kernels::StagedGemvSupports(p));
  kernels::StagedGemvParams q = p;
  q.k = 24, q.lda = 24, q.targets[0].ldw = 32;
  EXPECT_FALSE(kernels::StagedGemvSupports(q)) << "k not a multiple of 16";
  q = p;
  q.targets[0].ldw = 40;
  EXPECT_FALSE(kernels::StagedGemvSupports(q)) << "ldw not a multiple of 16";
  q = p;
  q.targets[0].scales = nullptr;
  EXPECT_FALSE(kernels::StagedGemvSupports(q)) << "no scales";
  q = p;
  q.targets[0].scale_ld = 0;
  EXPECT_FALSE(kernels::StagedGemvSupports(q)) << "short scale stride";
  q = p;
  q.targets[0].w8 = w.get() + 8;
  EXPECT_FALSE(kernels::StagedGemvSupports(q)) << "misaligned weights";
  q = p;
  q.batch = 2, q.stride_a = 32, q.stride_w = 4 * 32, q.stride_c = 4;
  EXPECT_FALSE(kernels::StagedGemvSupports(q)) << "a batch (bf16 weights only)";
  q = p;
  q.targets[0].w8 = nullptr;
  EXPECT_FALSE(kernels::StagedGemvSupports(q)) << "no weights";
  EXPECT_EQ(kernels::StagedGemvBf16(q, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace deepinfer
