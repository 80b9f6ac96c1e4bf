// Fp8TiledGemm against a host reference on the dequantised weights (kernels/testing/
// fp8_test_util.h: the loader's e4m3 decoding times the block scale, bf16 activations, the sum in
// double). The products are exact (bf16 x e4m3 widened to bf16); only the summation rounds: each
// k16 MMA adds to the block's fresh sum with at most two fp32 roundings (up to 2^-23 each), each
// 128-wide block's sum is scaled and added by one fma (one rounding) and up to 16 k ranges are
// added (16). Along any path that is at most k / 8 + k / 128 + 16 roundings of 2^-23 relative to
// the magnitudes summed, so |got - want| <= (k / 4 + k / 16 + 64) * 2^-24 * sum_p |a_p w_p|
// holds for a correct kernel, while a wrong scale, block, element or row is off by about |want| ~
// sum |a w| / sqrt(k), far more. Skips itself without a GPU.
#include "kernels/gemm/fp8_tiled_gemm.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/fp8_test_util.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"

namespace deepinfer {
namespace kernels {
namespace {

using fp8_testing::Bf16Rounded;
using fp8_testing::DequantisedProduct;
using fp8_testing::HostFp8;
using fp8_testing::MakeWeight;
using fp8_testing::WithinBound;
using testing::DeviceArray;
using testing::SameBits;

double Unit(int64_t k) { return std::ldexp(1.0, -24) * (k / 4.0 + k / 16.0 + 64.0); }

struct Case {
  int64_t m, n, k, extra_lda, extra_ldc, split;
  bool accumulate;
};

// One problem on the device: activations, weights, the initial c and room for a workspace.
class Problem {
 public:
  Problem(const Case& t, const HostFp8& w, uint32_t seed)
      : t_(t),
        lda_(t.k + t.extra_lda),
        ldc_(t.n + t.extra_ldc),
        a_(testing::RandomFloats(t.m * lda_, seed + 1)),
        c0_(testing::RandomFloats(t.m * ldc_, seed + 2)),
        da_(FloatsToBf16Bits(a_)),
        dw_(w.data),
        ds_(w.scales),
        w_(w) {}

  Fp8TiledGemmParams Params(int64_t m) const {
    Fp8TiledGemmParams p;
    p.m = m, p.n = t_.n, p.k = t_.k, p.a = da_.get(), p.lda = lda_;
    p.w.data = dw_.get(), p.w.ldw = w_.ldw, p.w.scales = ds_.get(), p.w.scale_ld = w_.scale_ld;
    p.w.split_rows = t_.split;
    p.ldc = ldc_, p.accumulate = t_.accumulate;
    return p;
  }

  // c ([m, ldc], from c0) after Fp8TiledGemm(p) with a workspace of the size it asks for.
  std::vector<float> Run(Fp8TiledGemmParams p) const {
    DeviceArray<float> dc(c0_);
    p.c = dc.get();
    const size_t bytes = Fp8TiledGemmWorkspaceBytes(p);
    std::unique_ptr<DeviceArray<float>> ws;
    if (bytes > 0) {
      ws = std::make_unique<DeviceArray<float>>(std::vector<float>(bytes / sizeof(float), NAN));
      p.workspace = ws->get();
    }
    std::vector<float> got;
    EXPECT_TRUE(Fp8TiledGemmSupports(p));
    EXPECT_EQ(Fp8TiledGemm(p, nullptr), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(dc.Download(&got), cudaSuccess);
    got.resize(p.m * ldc_);
    return got;
  }

  // got against the reference (c0 + the product with accumulate), the padding columns untouched.
  void Check(const std::vector<float>& got) {
    if (want_.empty()) DequantisedProduct(Bf16Rounded(a_), lda_, t_.m, w_, &want_, &mag_);
    const int64_t n = t_.n;
    std::vector<float> got_c(t_.m * n);
    std::vector<double> want_c(t_.m * n), tol_c(t_.m * n);
    for (int64_t i = 0; i < t_.m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const int64_t e = i * n + j;
        got_c[e] = got[i * ldc_ + j];
        want_c[e] = (t_.accumulate ? c0_[i * ldc_ + j] : 0.0) + want_[e];
        tol_c[e] = Unit(t_.k) * mag_[e] + std::ldexp(std::abs(want_c[e]), -24) + 1e-30;
      }
      for (int64_t j = n; j < ldc_; ++j) {
        ASSERT_EQ(got[i * ldc_ + j], c0_[i * ldc_ + j]) << "padding column " << j << " row " << i;
      }
    }
    EXPECT_TRUE(WithinBound(got_c, want_c, tol_c));
  }

 private:
  Case t_;
  int64_t lda_, ldc_;
  std::vector<float> a_, c0_;
  DeviceArray<uint16_t> da_;
  DeviceArray<uint8_t> dw_;
  DeviceArray<float> ds_;
  HostFp8 w_;
  std::vector<double> want_, mag_;
};

class Fp8TiledGemmTest : public ::testing::TestWithParam<Case> {};

// The default launch, then every block row tile at splits 1, 2, 3 and the largest it takes:
// each against the reference, and at one split every tile's bits equal (the same sums in the
// same order), as are the first rows computed alone.
TEST_P(Fp8TiledGemmTest, MatchesDequantisedReference) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Case t = GetParam();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " m " << t.m << " n " << t.n << " k "
                                    << t.k << " accumulate " << t.accumulate);
  std::mt19937 gen(seed);
  Problem problem(t, MakeWeight(t.n, t.k, t.k, t.split, &gen), seed);
  {
    SCOPED_TRACE("default");
    problem.Check(problem.Run(problem.Params(t.m)));
  }
  const int64_t blocks = (t.k + 127) / 128;
  for (const int32_t split : {1, 2, 3, kFp8TiledMaxKSplit}) {
    if (split > blocks) continue;
    std::vector<float> first;
    for (const int32_t bm : kFp8TiledBlockRows) {
      SCOPED_TRACE(::testing::Message() << "block rows " << bm << " k split " << split);
      Fp8TiledGemmParams p = problem.Params(t.m);
      p.block_rows = bm, p.k_split = split;
      const std::vector<float> got = problem.Run(p);
      problem.Check(got);
      if (first.empty()) {
        first = got;
      } else {
        EXPECT_TRUE(SameBits(first, got, got.size()));
      }
    }
    SCOPED_TRACE(::testing::Message() << "the first 5 rows alone, k split " << split);
    Fp8TiledGemmParams p = problem.Params(5);
    p.k_split = split;
    const std::vector<float> alone = problem.Run(p);
    EXPECT_TRUE(SameBits(first, alone, alone.size()));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8TiledGemmTest,
    ::testing::Values(
        // Decode batches at Moonlight's kv_a (576: a partial weight tile), o_proj and q_proj.
        Case{17, 576, 2048, 0, 3, 0, false}, Case{33, 2048, 2048, 8, 0, 0, true},
        Case{100, 3072, 2048, 0, 5, 0, false}, Case{128, 2048, 1408, 0, 0, 0, true},
        Case{200, 576, 2048, 16, 1, 0, true}, Case{256, 3072, 1024, 0, 0, 0, false},
        // k a multiple of 16 only (a partial last k block), one k block, n below one tile.
        Case{40, 300, 400, 8, 2, 0, false}, Case{17, 130, 128, 0, 0, 0, true},
        Case{64, 77, 720, 0, 0, 0, false},
        // [gate; up] stacked at 200 rows (two scale grids inside one 128-row tile).
        Case{48, 576, 512, 0, 0, 200, false}));

TEST(Fp8TiledGemmSupportsTest, RejectsWhatItCannotTake) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  std::mt19937 gen(1);
  const Case t{40, 256, 1024, 0, 0, 0, false};
  Problem problem(t, MakeWeight(t.n, t.k, t.k, 0, &gen), 1);
  DeviceArray<float> c(std::vector<float>(t.m * t.n));
  Fp8TiledGemmParams p = problem.Params(t.m);
  p.c = c.get();
  p.k_split = 4;
  ASSERT_GT(Fp8TiledGemmWorkspaceBytes(p), 0u);
  EXPECT_FALSE(Fp8TiledGemmSupports(p)) << "a split without a workspace";
  p.k_split = 1;
  EXPECT_TRUE(Fp8TiledGemmSupports(p));
  Fp8TiledGemmParams q = p;
  q.k = 1000;  // not a multiple of 16
  EXPECT_FALSE(Fp8TiledGemmSupports(q));
  q = p;
  q.block_rows = 48;
  EXPECT_FALSE(Fp8TiledGemmSupports(q));
  q = p;
  q.k_split = kFp8TiledMaxKSplit + 1;
  EXPECT_FALSE(Fp8TiledGemmSupports(q));
  q = p;
  q.lda = t.k + 4;  // rows not 16-byte aligned
  EXPECT_FALSE(Fp8TiledGemmSupports(q));
  EXPECT_EQ(Fp8TiledGemm(q, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kernels
}  // namespace deepinfer
