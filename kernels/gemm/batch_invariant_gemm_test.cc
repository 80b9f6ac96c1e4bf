// BatchInvariantGemmPipelined against a host reference: bf16 activations and weights, the sum in
// double. The products are exact on the tensor cores; only the summation rounds: each k16 MMA adds
// its products to the accumulator with at most two fp32 roundings (up to 2^-23 each) and up to
// eight split sums are added (eight more). So |got - want| <= (k / 4 + 64) * 2^-24 * sum_p
// |a_p w_p| for a correct kernel, while a wrong element, split or row is off by about |want| ~
// sum |a w| / sqrt(k), far more. Then the batch-invariant promise: a row's outputs are the same
// bits at m = 1, 7, 64, 128 and 256, at any place among the rows, with every tile the kernel has,
// and with accumulate they are the host's fp32 c + the sum. The shapes cover the split counts 1,
// 2, 4 and 8, k not a multiple of the 64-wide step, n not a multiple of the tile and a batch.
// Skips itself without a GPU.
#include <cmath>
#include <cstdint>
#include <iostream>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gemm/batch_invariant_gemm.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"

namespace deepinfer {
namespace kernels {
namespace {

using testing::DeviceArray;
using testing::SameBits;

constexpr int64_t kRows = 256;  // the full activation matrix; the launches take slices of it

struct Case {
  int64_t batch, n, k;
  int splits;  // BatchInvariantGemmSplits(batch, n, k), checked
};

// Every tile the kernel has.
std::vector<BatchInvariantGemmTile> AllTiles() {
  std::vector<BatchInvariantGemmTile> v;
  for (const int columns : {64, 128}) {
    for (const int rows : {16, 32, 64, 128}) v.push_back({rows, columns});
  }
  return v;
}

class BatchInvariantGemmPipelinedTest : public ::testing::TestWithParam<Case> {};

TEST_P(BatchInvariantGemmPipelinedTest, MatchesReferenceAndSameBitsAtEveryRowCount) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Case t = GetParam();
  ASSERT_EQ(BatchInvariantGemmSplits(t.batch, t.n, t.k), t.splits);
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " batch " << t.batch << " n " << t.n
                                    << " k " << t.k << " splits " << t.splits);
  const std::vector<uint16_t> a =
      FloatsToBf16Bits(testing::RandomFloats(t.batch * kRows * t.k, seed));
  const std::vector<uint16_t> w =
      FloatsToBf16Bits(testing::RandomFloats(t.batch * t.n * t.k, seed + 1, 0.05f));
  DeviceArray<uint16_t> da(a), dw(w);
  DeviceArray<float> dc(t.batch * kRows * t.n);
  ASSERT_TRUE(da.ok() && dw.ok() && dc.ok());

  // Products b of m rows starting at row `first` of a and c (strides of the full matrices).
  auto params = [&](int64_t m, int64_t first, bool accumulate) {
    BatchInvariantGemmParams p;
    p.m = m, p.n = t.n, p.k = t.k;
    p.a = da.get() + first * t.k, p.a_bf16 = true, p.lda = t.k;
    p.w = dw.get(), p.ldw = t.k;
    p.c = dc.get() + first * t.n, p.ldc = t.n;
    p.accumulate = accumulate;
    p.batch = t.batch, p.stride_a = kRows * t.k, p.stride_w = t.n * t.k, p.stride_c = kRows * t.n;
    return p;
  };

  // All 256 rows, tile picked: against the reference.
  std::vector<float> full;
  {
    const BatchInvariantGemmParams p = params(kRows, 0, false);
    ASSERT_TRUE(BatchInvariantGemmPipelinedSupports(p));
    dc.Poison();
    DEEPINFER_CUDA_OK(BatchInvariantGemmPipelined(p, nullptr));
    DEEPINFER_CUDA_OK(dc.Download(&full));
  }
  const double unit = std::ldexp(1.0, -24) * (t.k / 4.0 + 64.0);
  double worst = 0;
  for (int64_t b = 0; b < t.batch; ++b) {
    for (int64_t i = 0; i < kRows; ++i) {
      for (int64_t j = 0; j < t.n; ++j) {
        double want = 0, mag = 0;
        for (int64_t q = 0; q < t.k; ++q) {
          const double prod = static_cast<double>(Bf16BitsToFloat(a[(b * kRows + i) * t.k + q])) *
                              Bf16BitsToFloat(w[(b * t.n + j) * t.k + q]);
          want += prod;
          mag += std::abs(prod);
        }
        const float got = full[(b * kRows + i) * t.n + j];
        const double d = std::abs(static_cast<double>(got) - want);
        const double bound = unit * mag + 1e-30;
        ASSERT_LE(d, bound) << "product " << b << " row " << i << " column " << j << ": got "
                            << got << " want " << want;
        worst = std::max(worst, d / bound);
      }
    }
  }
  std::cout << "[batch-invariant pipelined] largest error " << worst << " of its bound\n";

  // m rows starting at `first`, with every tile: the same bits as those rows of `full`; the rows
  // outside the slice stay unwritten (poisoned).
  for (const int64_t m : {1, 7, 64, 128, 256}) {
    std::set<int64_t> firsts = {0, kRows - m, (kRows - m) / 2 + (m == 1 ? 3 : 0)};
    for (const int64_t first : firsts) {
      for (const BatchInvariantGemmTile& tile : AllTiles()) {
        SCOPED_TRACE(::testing::Message() << "m " << m << " first row " << first << " tile "
                                          << tile.rows << " x " << tile.columns);
        dc.Poison();
        DEEPINFER_CUDA_OK(BatchInvariantGemmPipelined(params(m, first, false), nullptr, tile));
        std::vector<float> got;
        DEEPINFER_CUDA_OK(dc.Download(&got));
        for (int64_t b = 0; b < t.batch; ++b) {
          const size_t at = static_cast<size_t>((b * kRows + first) * t.n);
          ASSERT_TRUE(SameBits(full.data() + at, got.data() + at, static_cast<size_t>(m * t.n)))
              << "product " << b;
          const size_t begin = static_cast<size_t>(b * kRows * t.n);
          for (size_t e = begin; e < begin + static_cast<size_t>(kRows * t.n); ++e) {
            if (e >= at && e < at + static_cast<size_t>(m * t.n)) continue;
            ASSERT_TRUE(std::isnan(got[e])) << "row outside the slice written at " << e;
          }
        }
      }
    }
  }

  // accumulate: c + the sum, one fp32 addition (the host's), at 7 rows with the tile picked.
  {
    const int64_t m = 7, first = 100;
    const std::vector<float> c0 = testing::RandomFloats(t.batch * kRows * t.n, seed + 2);
    dc.Upload(c0);
    DEEPINFER_CUDA_OK(BatchInvariantGemmPipelined(params(m, first, true), nullptr));
    std::vector<float> got;
    DEEPINFER_CUDA_OK(dc.Download(&got));
    std::vector<float> want = c0;
    for (int64_t b = 0; b < t.batch; ++b) {
      for (int64_t e = (b * kRows + first) * t.n; e < (b * kRows + first + m) * t.n; ++e) {
        want[e] = c0[e] + full[e];
      }
    }
    EXPECT_TRUE(SameBits(want, got, want.size()));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, BatchInvariantGemmPipelinedTest,
    ::testing::Values(Case{1, 8200, 256, 1},    // 129 tiles of 64 columns: no split, n % 64 = 8
                      Case{1, 4100, 512, 2},    // 65 tiles: 2 splits of 4 steps
                      Case{1, 2000, 1024, 4},   // 32 tiles: 4 splits of 4 steps
                      Case{1, 200, 2056, 8},    // 4 tiles: 8 splits, the last step 8 wide
                      Case{4, 96, 520, 2},      // a batch of 4: 8 tiles, 9 steps in 2 splits
                      Case{1, 1030, 512, 2}));  // rows of c not 16-byte aligned: scalar stores

TEST(BatchInvariantGemmPipelinedTest, RefusesWhatItDoesNotTake) {
  BatchInvariantGemmParams p;
  p.m = 1, p.n = 64, p.k = 64, p.lda = 64, p.ldw = 64, p.ldc = 64;
  alignas(16) static uint16_t a[64], w[64 * 64];
  alignas(16) static float c[64];
  p.a = a, p.w = w, p.c = c, p.a_bf16 = true;
  BatchInvariantGemmParams q = p;
  q.a_bf16 = false;  // fp32 activations: the caller rounds them first
  EXPECT_FALSE(BatchInvariantGemmPipelinedSupports(q));
  q = p;
  q.k = 60, q.lda = 60, q.ldw = 60;  // k not a multiple of 8
  EXPECT_FALSE(BatchInvariantGemmPipelinedSupports(q));
  q = p;
  q.lda = 68;  // rows not 16-byte aligned
  EXPECT_FALSE(BatchInvariantGemmPipelinedSupports(q));
  EXPECT_EQ(BatchInvariantGemmPipelined(q, nullptr), cudaErrorInvalidValue);
}

// The Moonlight shapes' splits (docs/engine.md, "Batch invariance").
TEST(BatchInvariantGemmSplitsTest, MoonlightShapes) {
  EXPECT_EQ(BatchInvariantGemmSplits(1, 3072, 2048), 4);    // q_proj
  EXPECT_EQ(BatchInvariantGemmSplits(1, 576, 2048), 8);     // kv_a_proj
  EXPECT_EQ(BatchInvariantGemmSplits(1, 2048, 2048), 4);    // o_proj
  EXPECT_EQ(BatchInvariantGemmSplits(1, 5632, 2048), 2);    // shared gate_up
  EXPECT_EQ(BatchInvariantGemmSplits(1, 2048, 2816), 4);    // shared down
  EXPECT_EQ(BatchInvariantGemmSplits(1, 22528, 2048), 1);   // dense gate_up
  EXPECT_EQ(BatchInvariantGemmSplits(1, 2048, 11264), 4);   // dense down
  EXPECT_EQ(BatchInvariantGemmSplits(1, 129280, 2048), 1);  // lm_head
  EXPECT_EQ(BatchInvariantGemmSplits(16, 512, 128), 1);     // absorb W_uk: 128 tiles
  EXPECT_EQ(BatchInvariantGemmSplits(16, 128, 512), 2);     // lift W_uv: 8 steps
}

}  // namespace
}  // namespace kernels
}  // namespace deepinfer
