// The FP8 block-scaled GEMM kernels against a host reference on the dequantised weights: each
// weight value is e4m3 (decoded by the checkpoint loader's F8E4M3ToFloat) times its block's
// fp32 scale, each activation rounded to bf16 first, the sum in double. The kernel's products
// are exact in fp32 (bf16 x e4m3: 8 + 4 significant bits); it differs only by fp32 rounding of
// its sums and of the scale multiplication, at most (k / 16 + 16 + 8 + 2) roundings along any
// path, so |got - want| <= (k / 16 + 26) * 2^-24 * sum_p |a_p w_p| (+ a tiny absolute term) is
// a bound that holds for a correct kernel and fails for a wrong scale, block or element.
// Skips itself without a GPU.
#include "kernels/gemm/fp8_block_gemm.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/fp8_test_util.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {
namespace kernels {
namespace {

using fp8_testing::Bf16Rounded;
using fp8_testing::ExpectDenseMatches;
using fp8_testing::ExpectGroupedMatches;
using fp8_testing::GroupedOperands;
using fp8_testing::HostFp8;
using fp8_testing::MakeGroupedOperands;
using fp8_testing::MakeWeight;
using testing::DeviceArray;

// The bound of the header comment, per unit of sum_p |a_p w_p|.
double Unit(int64_t k) { return std::ldexp(1.0, -24) * (k / 16.0 + 26.0); }

struct SmallMCase {
  int64_t m, n, k, extra_lda, extra_ldw, split;
  bool a_bf16, accumulate;
  Fp8GemvForm form = Fp8GemvForm::kAuto;
};

class Fp8SmallMGemmTest : public ::testing::TestWithParam<SmallMCase> {};

TEST_P(Fp8SmallMGemmTest, MatchesDequantisedReference) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const SmallMCase t = GetParam();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  const int64_t lda = t.k + t.extra_lda, ldw = t.k + t.extra_ldw, ldc = t.n + 3;
  const HostFp8 w = MakeWeight(t.n, t.k, ldw, t.split, &gen);
  std::vector<float> a = testing::RandomFloats(t.m * lda, seed + 1);
  std::vector<float> c0 = testing::RandomFloats(t.m * ldc, seed + 2);

  DeviceArray<uint8_t> dw(w.data);
  DeviceArray<float> ds(w.scales);
  DeviceArray<float> da(a);
  DeviceArray<uint16_t> da16(FloatsToBf16Bits(a));
  DeviceArray<float> dc(c0);
  Fp8SmallMGemmParams p;
  p.m = t.m;
  p.n = t.n;
  p.k = t.k;
  p.a_bf16 = t.a_bf16;
  p.a = t.a_bf16 ? static_cast<const void*>(da16.get()) : da.get();
  p.lda = lda;
  p.w.data = dw.get();
  p.w.ldw = ldw;
  p.w.scales = ds.get();
  p.w.scale_ld = w.scale_ld;
  p.w.split_rows = t.split;
  p.c = dc.get();
  p.ldc = ldc;
  p.accumulate = t.accumulate;
  p.gemv_form = t.form;
  ASSERT_TRUE(Fp8SmallMGemmSupports(p));
  DEEPINFER_CUDA_OK(Fp8SmallMGemm(p, nullptr));
  std::vector<float> got;
  DEEPINFER_CUDA_OK(dc.Download(&got));

  ExpectDenseMatches(got, c0, ldc, Bf16Rounded(a), lda, t.m, w, t.accumulate, Unit(t.k));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8SmallMGemmTest,
    ::testing::Values(
        // m = 1..11 (8 rows a launch), k a multiple of 128, of 16 only (vector path, block
        // straddling the end), and of neither (scalar path); n not a multiple of 8 or 128.
        SmallMCase{1, 576, 1024, 0, 0, 0, false, false},
        SmallMCase{1, 200, 384, 0, 0, 0, true, false},
        SmallMCase{2, 77, 2048, 0, 0, 0, false, true},
        SmallMCase{3, 130, 208, 0, 0, 0, false, false},
        SmallMCase{4, 1000, 128, 0, 0, 0, true, true},
        SmallMCase{5, 96, 100, 0, 0, 0, false, false},
        SmallMCase{8, 300, 720, 8, 16, 0, false, false},
        SmallMCase{11, 129, 4112, 4, 0, 0, true, false},
        // [gate; up] stacked at 80 rows (two scale grids) and at a multiple of 128.
        SmallMCase{1, 160, 256, 0, 0, 80, false, false},
        SmallMCase{6, 512, 256, 0, 0, 256, true, false},
        // Unaligned strides: the scalar path.
        SmallMCase{2, 65, 160, 1, 3, 0, false, true},
        // Decode shapes at m = 1 and 2 (the multi-column vector kernel: n not a multiple of its
        // 4 columns, k split over 1..8 warps): Moonlight q_proj, kv_a, o_proj; DeepSeek-V3 q_a,
        // q_b, o_proj, kv_a.
        SmallMCase{1, 3072, 2048, 0, 0, 0, true, false},
        SmallMCase{2, 3072, 2048, 0, 0, 0, false, false},
        SmallMCase{1, 576, 2048, 0, 0, 0, false, true},
        SmallMCase{2, 576, 2048, 0, 0, 0, true, false},
        SmallMCase{1, 2048, 2048, 0, 0, 0, false, false},
        SmallMCase{2, 2048, 2048, 0, 0, 0, true, true},
        SmallMCase{1, 1536, 7168, 0, 0, 0, true, false},
        SmallMCase{2, 1536, 7168, 0, 0, 0, false, false},
        SmallMCase{1, 24576, 1536, 0, 0, 0, false, false},
        SmallMCase{2, 24576, 1536, 0, 0, 0, true, false},
        SmallMCase{1, 7168, 16384, 0, 0, 0, true, false},
        SmallMCase{2, 7168, 16384, 0, 0, 0, false, true},
        SmallMCase{1, 576, 7168, 0, 0, 0, false, false},
        SmallMCase{2, 576, 7168, 0, 0, 0, true, false},
        SmallMCase{2, 1023, 2064, 16, 32, 0, false, false},
        SmallMCase{1, 4098, 496, 0, 0, 2050, true, false},
        SmallMCase{10, 301, 1024, 0, 0, 0, false, false},
        // Fewer rows than a warp's 4 and a single chunk or three of k.
        SmallMCase{1, 3, 16, 0, 0, 0, false, false}, SmallMCase{2, 5, 48, 0, 0, 0, true, true},
        // Each 1-2 row form of the vector kernel (the cases above take kAuto's): blocks walking
        // several tiles with k split over 8 warps (o_proj), over one warp with a part-filled
        // last batch (q_b), stacked grids split mid-warp, strides past k.
        SmallMCase{1, 7168, 16384, 0, 0, 0, true, false, Fp8GemvForm::kPipelined1},
        SmallMCase{2, 7168, 16384, 0, 0, 0, false, true, Fp8GemvForm::kPipelined2},
        SmallMCase{1, 24576, 1536, 0, 0, 0, false, false, Fp8GemvForm::kPipelined1},
        SmallMCase{2, 24576, 1536, 0, 0, 0, false, false, Fp8GemvForm::kPipelined2},
        SmallMCase{1, 4098, 496, 0, 0, 2050, false, true, Fp8GemvForm::kPipelined1},
        SmallMCase{2, 4098, 496, 0, 0, 2050, true, false, Fp8GemvForm::kPipelined2},
        SmallMCase{2, 1023, 2064, 16, 32, 0, true, true, Fp8GemvForm::kPipelined1},
        SmallMCase{1, 1023, 2064, 16, 32, 0, false, false, Fp8GemvForm::kPipelined2},
        SmallMCase{1, 36864, 7168, 0, 0, 18432, true, false, Fp8GemvForm::kAuto},
        SmallMCase{1, 7168, 18432, 0, 0, 0, false, false, Fp8GemvForm::kAuto}));

struct GroupedCase {
  int32_t groups;
  std::vector<int32_t> rows_per_group;
  int64_t n, k, split;
};

class Fp8GroupedGemmTest : public ::testing::TestWithParam<GroupedCase> {};

TEST_P(Fp8GroupedGemmTest, MatchesPerGroupReference) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const GroupedCase t = GetParam();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  ASSERT_EQ(t.rows_per_group.size(), static_cast<size_t>(t.groups));
  const GroupedOperands g = MakeGroupedOperands(t.rows_per_group, t.n, t.k, t.split, &gen);
  std::vector<float> a = testing::RandomFloats(static_cast<size_t>(g.max_rows) * t.k, seed + 1);
  DeviceArray<float> da(a);
  DeviceArray<float> dc(static_cast<size_t>(g.max_rows) * t.n);
  dc.Poison();
  Fp8GroupedGemmParams p;
  p.num_groups = t.groups;
  p.max_rows = g.max_rows;
  p.offsets = g.doff->get();
  p.n = t.n;
  p.k = t.k;
  p.a = da.get();
  p.weights = g.dwp->get();
  p.scales = g.dsp->get();
  p.scale_ld = g.w[0].scale_ld;
  p.split_rows = t.split;
  p.c = dc.get();
  ASSERT_TRUE(Fp8GroupedGemmSupports(p));
  DEEPINFER_CUDA_OK(Fp8GroupedGemm(p, nullptr));
  std::vector<float> got;
  DEEPINFER_CUDA_OK(dc.Download(&got));
  ExpectGroupedMatches(got, Bf16Rounded(a), g, t.n, t.k, Unit(t.k));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8GroupedGemmTest,
    ::testing::Values(
        // Fewer rows than groups (decode: one block row per group start), with empty groups.
        GroupedCase{16, {0, 1, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 3}, 256, 384, 128},
        // More rows than groups (a block row per group), groups above 8 rows (several chunks).
        GroupedCase{4, {9, 0, 17, 3}, 96, 256, 48},
        // k not a multiple of 16 (scalar path), n and k not multiples of 128.
        GroupedCase{5, {1, 2, 0, 1, 1}, 70, 200, 35},
        // The gate_up and down shapes of a small MoE (inter 32 stacked).
        GroupedCase{8, {1, 0, 1, 1, 0, 0, 1, 0}, 64, 128, 32},
        GroupedCase{8, {1, 0, 1, 1, 0, 0, 1, 0}, 128, 32, 0}));

TEST(Fp8DequantToBf16Test, RoundsEachDequantisedValue) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  for (const auto& [n, k, ldw, split] : std::vector<std::array<int64_t, 4>>{
           {300, 200, 208, 0}, {256, 128, 128, 128}, {70, 33, 40, 35}}) {
    const HostFp8 w = MakeWeight(n, k, ldw, split, &gen);
    DeviceArray<uint8_t> dw(w.data);
    DeviceArray<float> ds(w.scales);
    DeviceArray<uint16_t> out(n * k);
    out.Poison();
    Fp8BlockWeight v;
    v.data = dw.get();
    v.ldw = ldw;
    v.scales = ds.get();
    v.scale_ld = w.scale_ld;
    v.split_rows = split;
    DEEPINFER_CUDA_OK(Fp8DequantToBf16(v, n, k, out.get(), nullptr));
    std::vector<uint16_t> got;
    DEEPINFER_CUDA_OK(out.Download(&got));
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t p = 0; p < k; ++p) {
        const float want = F8E4M3ToFloat(w.data[j * ldw + p]) *
                           w.scales[Fp8ScaleRow(j, split) * w.scale_ld + p / kFp8BlockSize];
        ASSERT_EQ(got[j * k + p], FloatToBf16Bits(want)) << "element (" << j << ", " << p << ")";
      }
    }
  }
}

TEST(Fp8BlockGemmTest, RejectsBadArguments) {
  Fp8SmallMGemmParams p;  // all zero
  EXPECT_FALSE(Fp8SmallMGemmSupports(p));
  EXPECT_EQ(Fp8SmallMGemm(p, nullptr), cudaErrorInvalidValue);
  Fp8GroupedGemmParams g;
  EXPECT_FALSE(Fp8GroupedGemmSupports(g));
  EXPECT_EQ(Fp8GroupedGemm(g, nullptr), cudaErrorInvalidValue);
}

TEST(Fp8ScaleRowTest, StackedGridsStartAtTheSplit) {
  EXPECT_EQ(Fp8ScaleRow(127, 0), 0);
  EXPECT_EQ(Fp8ScaleRow(128, 0), 1);
  EXPECT_EQ(Fp8ScaleRow(79, 80), 0);
  EXPECT_EQ(Fp8ScaleRow(80, 80), 1);  // up's first block
  EXPECT_EQ(Fp8ScaleRow(159, 80), 1);
  EXPECT_EQ(Fp8ScaleRow(208, 80), 2);
  EXPECT_EQ(Fp8ScaleRow(209, 200), 2);  // ceil(200 / 128) = 2 gate blocks, up's row 9: block 2
  EXPECT_EQ(Fp8ScaleRows(160, 80), 2);
  EXPECT_EQ(Fp8ScaleRows(4096, 2048), 32);
}

}  // namespace
}  // namespace kernels
}  // namespace deepinfer
