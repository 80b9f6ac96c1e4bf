// CublasLtFp8Gemm against the W8A8 product on the host: activations quantised on the host (the
// scheme of kernels/gemm/fp8_quantize.h with the loader's e4m3 encoder), both operands decoded by
// the loader's e4m3 decoding times their block scales, the sum in double. FP8 tensor cores sum
// products exactly within an instruction but keep fewer bits than fp32 when they accumulate
// (DeepSeek-V3's report: about 14), and the block scales force a promotion to fp32 every 128 k;
// so the bound is 2^-8 * sum_p |x_p w_p| (a 128-term block losing up to 2^-14 relative per term
// stays below 2^-7 of its magnitude, and in practice far below), plus half an ulp of a bf16
// output. A wrong scale, block or layout is off by about |want| ~ sum |x w| / sqrt(k), several
// times the bound for these k. Skips itself without a GPU, and off compute capability 9.0.
#include "worker/backend/cuda/cublaslt_fp8_gemm.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/fp8_test_util.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {
namespace {

using kernels::fp8_testing::DequantisedProduct;
using kernels::fp8_testing::HostFp8;
using kernels::fp8_testing::MakeWeight;
using testing::DeviceArray;

// The host's W8A8 activations: q bytes [m, k], scales [blocks][m], and q * scale per element.
struct HostQuantized {
  std::vector<uint8_t> q;
  std::vector<float> scales;
  std::vector<double> x;
};

HostQuantized Quantize(const std::vector<float>& a, int64_t m, int64_t k) {
  HostQuantized h;
  const int64_t blocks = kernels::Fp8ScaleCols(k);
  h.q.resize(m * k);
  h.scales.resize(blocks * m);
  h.x.resize(m * k);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t p0 = b * 128, p1 = std::min(k, p0 + 128);
      float amax = 0.0f;
      for (int64_t p = p0; p < p1; ++p) amax = std::max(amax, std::fabs(a[i * k + p]));
      const float s = std::max(amax / 448.0f, FLT_MIN);
      h.scales[b * m + i] = s;
      for (int64_t p = p0; p < p1; ++p) {
        h.q[i * k + p] = FloatToF8E4M3(a[i * k + p] / s);
        h.x[i * k + p] = static_cast<double>(F8E4M3ToFloat(h.q[i * k + p])) * s;
      }
    }
  }
  return h;
}

struct Case {
  int64_t m, n, k, split, extra_ldd;
  bool d_bf16, accumulate;
};

class CublasLtFp8GemmTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    DEEPINFER_SKIP_WITHOUT_GPU();
    if (!CublasLtFp8Gemm::DeviceSupports(0)) {
      GTEST_SKIP() << "cuBLASLt's block-scaled FP8 runs on compute capability 9.0 only";
    }
    ASSERT_EQ(cudaMalloc(&workspace_, kWorkspaceBytes), cudaSuccess);
    auto g = CublasLtFp8Gemm::Create(workspace_, kWorkspaceBytes);
    ASSERT_TRUE(g.ok()) << g.status();
    gemm_ = std::move(*g);
  }
  void TearDown() override {
    gemm_.reset();
    if (workspace_ != nullptr) cudaFree(workspace_);
  }
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;
  void* workspace_ = nullptr;
  std::unique_ptr<CublasLtFp8Gemm> gemm_;
};

// Runs t on `gemm` and checks every output value against the host's W8A8 product; with
// timing_buffer, g.timing_d is set where the gemm asks for it (NeedsTimingBuffer).
void RunAndCheck(CublasLtFp8Gemm* gemm, const Case& t, bool timing_buffer = false) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " m " << t.m << " n " << t.n << " k "
                                    << t.k << " split " << t.split);
  std::mt19937 gen(seed);
  // Zeros in the scale rows' padding columns, as the loader leaves them.
  const HostFp8 w = MakeWeight(t.n, t.k, t.k, t.split, &gen, 0, 0.0f);
  const std::vector<float> a = testing::RandomFloats(t.m * t.k, seed + 1);
  const HostQuantized h = Quantize(a, t.m, t.k);
  const int64_t ldd = t.n + t.extra_ldd;
  const std::vector<float> d0 = testing::RandomFloats(t.m * ldd, seed + 2);
  std::vector<float> d0_exact = d0;  // as d holds it (bf16 output: rounded)
  if (t.d_bf16) {
    for (float& v : d0_exact) v = RoundToBf16(v);
  }

  DeviceArray<uint8_t> dw(w.data), dq(h.q);
  DeviceArray<float> dws(w.scales), dqs(h.scales);
  DeviceArray<float> dd32(d0);
  DeviceArray<uint16_t> dd16(FloatsToBf16Bits(d0));
  Fp8LtGemm g;
  g.m = t.m;
  g.n = t.n;
  g.k = t.k;
  g.q = dq.get();
  g.ldq = t.k;
  g.q_scales = dqs.get();
  g.w.data = dw.get();
  g.w.ldw = t.k;
  g.w.scales = dws.get();
  g.w.scale_ld = w.scale_ld;
  g.w.split_rows = t.split;
  g.d_bf16 = t.d_bf16;
  g.d = t.d_bf16 ? static_cast<void*>(dd16.get()) : static_cast<void*>(dd32.get());
  g.ldd = ldd;
  g.accumulate = t.accumulate;
  ASSERT_TRUE(CublasLtFp8Gemm::Takes(g));
  auto ready = gemm->Ready(g);
  ASSERT_TRUE(ready.ok()) << ready.status();
  DeviceArray<float> timing(t.m * ldd);  // room for either output type
  if (timing_buffer && gemm->NeedsTimingBuffer(g)) g.timing_d = timing.get();
  auto ran = gemm->Run(g, nullptr);
  ASSERT_TRUE(ran.ok()) << ran.status();
  ASSERT_TRUE(*ran) << "cuBLASLt offered no block-scaled FP8 algorithm on a compute capability "
                       "9.0 device: "
                    << gemm->Refusal(g);
  std::vector<float> got(t.m * ldd);
  if (t.d_bf16) {
    std::vector<uint16_t> bits;
    DEEPINFER_CUDA_OK(dd16.Download(&bits));
    for (size_t i = 0; i < bits.size(); ++i) got[i] = Bf16BitsToFloat(bits[i]);
  } else {
    DEEPINFER_CUDA_OK(dd32.Download(&got));
  }

  std::vector<double> want, mag;
  DequantisedProduct(h.x, t.k, t.m, w, &want, &mag);
  double worst = 0;
  for (int64_t i = 0; i < t.m; ++i) {
    for (int64_t j = 0; j < ldd; ++j) {
      const float v = got[i * ldd + j];
      if (j >= t.n) {
        ASSERT_EQ(v, d0_exact[i * ldd + j]) << "padding column " << j << " of row " << i;
        continue;
      }
      const double full = (t.accumulate ? d0_exact[i * ldd + j] : 0.0) + want[i * t.n + j];
      const double tol = std::ldexp(mag[i * t.n + j], -8) +
                         (t.d_bf16 ? std::ldexp(std::abs(full), -8) : 0.0) + 1e-30;
      const double err = std::abs(v - full);
      ASSERT_LE(err, tol) << "row " << i << " column " << j << " got " << v << " want " << full;
      worst = std::max(worst, err / std::max(mag[i * t.n + j], 1e-30));
    }
  }
  // For the record: the largest error relative to sum |x w| (the bound allows 2^-8 = 3.9e-3).
  std::printf("[cublaslt-fp8] m %ld n %ld k %ld: largest |err| / sum|xw| %.3e\n",
              static_cast<long>(t.m), static_cast<long>(t.n), static_cast<long>(t.k), worst);
}

TEST_P(CublasLtFp8GemmTest, MatchesW8A8ProductOnTheHost) { RunAndCheck(gemm_.get(), GetParam()); }

// Sizes of one class share the heuristic's algorithm and descriptors (one shape asked), each at
// its own m: prefill's expert GEMMs, whose m changes at every call.
TEST_F(CublasLtFp8GemmTest, SizesOfOneClassShareAShape) {
  ASSERT_EQ(CublasLtFp8Gemm::SizeClass(260), CublasLtFp8Gemm::SizeClass(500));
  ASSERT_EQ(CublasLtFp8Gemm::SizeClass(12), CublasLtFp8Gemm::SizeClass(16));
  ASSERT_NE(CublasLtFp8Gemm::SizeClass(12), CublasLtFp8Gemm::SizeClass(20));
  for (int64_t m : {500, 260, 12, 16, 4}) {
    SCOPED_TRACE(::testing::Message() << "m " << m);
    ASSERT_NO_FATAL_FAILURE(RunAndCheck(gemm_.get(), Case{m, 2816, 2048, 1408, 0, true, false}));
  }
  EXPECT_EQ(gemm_->shapes(), 3u);  // classes 512, 16 and 4
}

// Classes from kTimedMinRows rows take the fastest of the heuristic's candidates, timed at their
// first Run (at most one timing per class; with accumulate only where the caller gives a timing
// buffer, d left as it was): every size of the class, and the later calls, still the host's
// product (an accumulating timing that touched d would add the product more than once).
TEST_F(CublasLtFp8GemmTest, TimedClassesStayCorrect) {
  const int64_t m0 = CublasLtFp8Gemm::kTimedMinRows + 76;
  ASSERT_EQ(CublasLtFp8Gemm::SizeClass(m0), CublasLtFp8Gemm::SizeClass(m0 + 100));
  for (int64_t m : {m0, m0 + 100, m0}) {
    SCOPED_TRACE(::testing::Message() << "m " << m);
    ASSERT_NO_FATAL_FAILURE(RunAndCheck(gemm_.get(), Case{m, 512, 1408, 0, 0, true, false}));
  }
  const size_t plain_timed = gemm_->timed_shapes();
  EXPECT_LE(plain_timed, 1u);
  const Case acc{m0, 512, 1408, 0, 0, false, true};
  ASSERT_NO_FATAL_FAILURE(RunAndCheck(gemm_.get(), acc));  // no buffer: not timed yet
  EXPECT_EQ(gemm_->timed_shapes(), plain_timed);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(::testing::Message() << "accumulate with a timing buffer, round " << round);
    ASSERT_NO_FATAL_FAILURE(RunAndCheck(gemm_.get(), acc, /*timing_buffer=*/true));
  }
  EXPECT_LE(gemm_->timed_shapes(), plain_timed + 1);
  EXPECT_EQ(gemm_->shapes(), 2u);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CublasLtFp8GemmTest,
    ::testing::Values(
        Case{4, 256, 256, 0, 0, false, false}, Case{12, 160, 384, 80, 4, false, true},
        // Moonlight: q (3072 x 2048), the experts' [gate; up] stacked at 1408 (a multiple of
        // 128: one GEMM) and down (k = 1408: 11 scale columns, stride 12).
        Case{64, 3072, 2048, 0, 0, false, false}, Case{256, 2816, 2048, 1408, 0, true, false},
        Case{96, 2048, 1408, 0, 0, false, true},
        // DeepSeek-V3: kv_a (576 x 7168), q_b (24576 x 1536) at a prefill size.
        Case{128, 576, 7168, 0, 0, false, false}, Case{512, 1024, 1536, 0, 8, true, false}));

// The size classes (no GPU needed): powers of two from 4 up to 256, then multiples of 256.
TEST(CublasLtFp8GemmSizeClassTest, PowersOfTwoThenMultiplesOf256) {
  const std::vector<std::pair<int64_t, int64_t>> want = {
      {1, 4},     {4, 4},       {5, 8},       {8, 8},       {12, 16},      {100, 128},
      {128, 128}, {129, 256},   {256, 256},   {257, 512},   {500, 512},    {512, 512},
      {513, 768}, {3000, 3072}, {3072, 3072}, {3073, 3328}, {32768, 32768}};
  for (const auto& [m, c] : want) EXPECT_EQ(CublasLtFp8Gemm::SizeClass(m), c) << "m " << m;
}

TEST(CublasLtFp8GemmTakesTest, NamesTheLayoutsItNeeds) {
  Fp8LtGemm g;
  alignas(16) static float scales[64];
  g.m = 8;
  g.n = 256;
  g.k = 256;
  g.q = reinterpret_cast<const uint8_t*>(uintptr_t{1} << 20);
  g.ldq = 256;
  g.q_scales = scales;
  g.w.data = g.q;
  g.w.ldw = 256;
  g.w.scales = scales;
  g.w.scale_ld = kernels::Fp8ScaleLd(256);
  g.d = scales;
  g.ldd = 256;
  EXPECT_TRUE(CublasLtFp8Gemm::Takes(g));
  Fp8LtGemm b = g;
  b.m = 6;  // not a multiple of 4
  EXPECT_FALSE(CublasLtFp8Gemm::Takes(b));
  b = g;
  b.w.scale_ld = 2;  // the 2D scales' stride must be the padded one
  EXPECT_FALSE(CublasLtFp8Gemm::Takes(b));
  b = g;
  b.k = b.ldq = b.w.ldw = 200;  // k not a multiple of 16
  EXPECT_FALSE(CublasLtFp8Gemm::Takes(b));
  b = g;
  b.w.split_rows = 70;  // a part's first output column not 16-byte aligned
  EXPECT_FALSE(CublasLtFp8Gemm::Takes(b));
  b.w.split_rows = 80;
  EXPECT_TRUE(CublasLtFp8Gemm::Takes(b));
}

}  // namespace
}  // namespace deepinfer
