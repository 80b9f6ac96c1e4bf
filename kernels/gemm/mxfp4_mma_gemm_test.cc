// Mxfp4MmaGroupedGemm against a host reference on the dequantised weights: each element decoded
// with the OCP Microscaling spec's E2M1 table (written out below, not the kernel's bit tricks),
// times 2^(scale - 127), activations rounded to bf16, the sum in double. The products are exact
// on the tensor cores (an e2m1 value times a power of two is a bf16 value); only the summation
// rounds: a k16 MMA adds its products with at most two fp32 roundings (up to 2^-23 each), the
// 128-wide blocks' sums are added (one more each) and up to eight k-slices are added (eight).
// So |got - want| <= (k / 4 + 64) * 2^-24 * sum_p |a_p w_p| for a correct kernel, while a wrong
// nibble, scale, block or row is off by about |want| ~ sum |a w| / sqrt(k), far more.
// Skips itself without a GPU.
#include "kernels/gemm/mxfp4_mma_gemm.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"

namespace deepinfer {
namespace kernels {
namespace {

using testing::DeviceArray;

// OCP Microscaling Formats (MX) v1.0, FP4 E2M1: codes 0..7 are the magnitudes, bit 3 the sign.
constexpr double kE2m1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

double E2m1(uint8_t nibble) { return (nibble & 8 ? -1.0 : 1.0) * kE2m1[nibble & 7]; }

// A host MXFP4 matrix [n, k]: packed bytes [n, k / 2] (even element in the low nibble) and UE8M0
// scales [n, scale_ld].
struct HostMx {
  int64_t n = 0, k = 0, scale_ld = 0;
  std::vector<uint8_t> data, scales;
  double At(int64_t j, int64_t p) const {
    const uint8_t byte = data[j * (k / 2) + p / 2];
    return E2m1(p % 2 == 0 ? byte & 0xF : byte >> 4) *
           std::ldexp(1.0, static_cast<int>(scales[j * scale_ld + p / 32]) - 127);
  }
};

// Random bytes (every code, both signs) and scales around 2^-12 .. 2^2 (checkpoint-like), with
// some rows given scales above 2^1 (the kernel's two-step widening) and the smallest ones (bf16
// subnormal products); scale_ld padding bytes 0xFF, which a correct kernel never reads.
HostMx MakeWeight(int64_t n, int64_t k, int64_t extra_ld, std::mt19937* gen) {
  HostMx w;
  w.n = n;
  w.k = k;
  w.scale_ld = k / 32 + extra_ld;
  std::uniform_int_distribution<int> byte(0, 255), scale(115, 129);
  w.data.resize(n * k / 2);
  for (uint8_t& b : w.data) b = static_cast<uint8_t>(byte(*gen));
  w.scales.assign(n * w.scale_ld, 0xFF);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t b = 0; b < k / 32; ++b) {
      int s = scale(*gen);
      if (j % 17 == 5) s = 132;              // above 2^1: two steps
      if (j % 23 == 7 && b % 2 == 0) s = 1;  // products near bf16's smallest normals
      w.scales[j * w.scale_ld + b] = static_cast<uint8_t>(s);
    }
  }
  return w;
}

double Unit(int64_t k) { return std::ldexp(1.0, -24) * (k / 4.0 + 64.0); }

struct GroupedCase {
  std::vector<int32_t> rows_per_group;
  int64_t n, k, extra_ld;
  int32_t hint;
};

class Mxfp4MmaGroupedGemmTest : public ::testing::TestWithParam<GroupedCase> {};

TEST_P(Mxfp4MmaGroupedGemmTest, MatchesPerGroupReference) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const GroupedCase t = GetParam();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " n " << t.n << " k " << t.k);
  std::mt19937 gen(seed);
  const int32_t groups = static_cast<int32_t>(t.rows_per_group.size());
  std::vector<int32_t> offsets(groups + 1, 0);
  for (int32_t g = 0; g < groups; ++g) offsets[g + 1] = offsets[g] + t.rows_per_group[g];
  const int32_t used = offsets[groups];
  const int32_t max_rows = used + 5;  // rows past the last group stay untouched
  std::vector<HostMx> w;
  std::vector<std::unique_ptr<DeviceArray<uint8_t>>> dw, ds;
  std::vector<const uint8_t*> wptr, sptr;
  for (int32_t g = 0; g < groups; ++g) {
    w.push_back(MakeWeight(t.n, t.k, t.extra_ld, &gen));
    dw.push_back(std::make_unique<DeviceArray<uint8_t>>(w.back().data));
    ds.push_back(std::make_unique<DeviceArray<uint8_t>>(w.back().scales));
    wptr.push_back(dw.back()->get());
    sptr.push_back(ds.back()->get());
  }
  const std::vector<float> a = testing::RandomFloats(static_cast<size_t>(max_rows) * t.k, seed);
  DeviceArray<uint16_t> da(FloatsToBf16Bits(a));
  DeviceArray<int32_t> doff(offsets);
  DeviceArray<const uint8_t*> dwp(wptr), dsp(sptr);
  DeviceArray<float> dc(static_cast<size_t>(max_rows) * t.n);
  dc.Poison();
  Mxfp4MmaGroupedGemmParams p;
  p.num_groups = groups;
  p.max_rows = max_rows;
  p.offsets = doff.get();
  p.n = t.n;
  p.k = t.k;
  p.a = da.get();
  p.weights = dwp.get();
  p.scales = dsp.get();
  p.scale_ld = w[0].scale_ld;
  p.c = dc.get();
  p.rows_per_group_hint = t.hint;
  // The plain register loops first, narrow and wide; every other tile variant must give the bits
  // of the plain loop of its width (the same sums in the same order: the k split follows the
  // feature tile's height, 16 or 32 rows); the reference check is on the last, kGroupedMmaTile
  // (the default).
  std::vector<float> regs[2];
  for (int wide = 0; wide < 2; ++wide) {
    Mxfp4MmaGroupedGemmParams q = p;
    q.tile = MmaTileOptions();
    q.tile.wide = wide != 0;
    ASSERT_TRUE(Mxfp4MmaGroupedGemmSupports(q));
    dc.Poison();
    DEEPINFER_CUDA_OK(Mxfp4MmaGroupedGemm(q, nullptr));
    DEEPINFER_CUDA_OK(dc.Download(&regs[wide]));
  }
  std::vector<Mxfp4MmaGroupedGemmParams> variants;
  for (int v = 2; v < 8; ++v) {
    for (int wide = 0; wide < 2; ++wide) {
      Mxfp4MmaGroupedGemmParams q = p;
      q.tile = MmaTileOptions();
      q.tile.wide = wide != 0;
      q.tile.shared_activations = (v & 2) != 0;
      q.tile.two_blocks_per_sm = (v & 4) != 0;
      variants.push_back(q);
    }
  }
  std::vector<float> got;
  for (const Mxfp4MmaGroupedGemmParams& q : variants) {
    SCOPED_TRACE(::testing::Message() << "wide " << q.tile.wide << " shared "
                                      << q.tile.shared_activations << " two blocks "
                                      << q.tile.two_blocks_per_sm);
    const std::vector<float>& want = regs[q.tile.wide ? 1 : 0];
    dc.Poison();
    DEEPINFER_CUDA_OK(Mxfp4MmaGroupedGemm(q, nullptr));
    DEEPINFER_CUDA_OK(dc.Download(&got));
    for (size_t i = 0; i < static_cast<size_t>(used) * t.n; ++i) {
      ASSERT_EQ(got[i], want[i]) << "differs from the plain register loop of its width at " << i;
    }
  }

  double worst = 0;
  std::vector<double> row(t.k);
  for (int32_t g = 0; g < groups; ++g) {
    for (int64_t j = 0; j < t.n; ++j) {
      for (int64_t q = 0; q < t.k; ++q) row[q] = w[g].At(j, q);
      for (int32_t r = offsets[g]; r < offsets[g + 1]; ++r) {
        double want = 0, mag = 0;
        for (int64_t q = 0; q < t.k; ++q) {
          const double prod = static_cast<double>(RoundToBf16(a[r * t.k + q])) * row[q];
          want += prod;
          mag += std::abs(prod);
        }
        const double d = std::abs(static_cast<double>(got[r * t.n + j]) - want);
        const double bound = Unit(t.k) * mag + 1e-30;
        ASSERT_LE(d, bound) << "group " << g << " row " << r << " feature " << j << ": got "
                            << got[r * t.n + j] << " want " << want;
        worst = std::max(worst, d / bound);
      }
    }
  }
  for (size_t i = static_cast<size_t>(used) * t.n; i < got.size(); ++i) {
    ASSERT_TRUE(std::isnan(got[i])) << "row past the groups written at " << i;
  }
  std::cout << "[mxfp4-mma] largest error " << worst << " of its bound\n";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Mxfp4MmaGroupedGemmTest,
    ::testing::Values(
        // Decode: fewer rows than groups, empty groups, one block row per busy group.
        GroupedCase{{0, 1, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 3}, 256, 384, 0, 1},
        // Groups above one pass (8, 16 and 32 rows a pass), a hint below the largest group; k
        // not a multiple of 128 (a last block with 1, 2 or 3 of the quad's scale blocks).
        GroupedCase{{9, 0, 17, 3, 40}, 96, 256, 3, 8}, GroupedCase{{33, 5, 0, 16}, 70, 224, 1, 16},
        GroupedCase{{70, 1, 2}, 130, 160, 0, 0}, GroupedCase{{4, 4}, 48, 32, 0, 4},
        // Moonlight's experts (hidden 2048, intermediate 1408): gate_up, down.
        GroupedCase{{1, 0, 2, 1, 0, 0, 12, 0}, 2816, 2048, 0, 12},
        GroupedCase{{1, 0, 2, 1, 0, 0, 12, 0}, 2048, 1408, 0, 12}));

// Single known elements: the nibble order, the sign, each code and the scale's exponent, where a
// transposed nibble or an off-by-one exponent gives a different exact result.
TEST(Mxfp4MmaGroupedGemmTest, KnownElements) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const int64_t n = 16, k = 64;
  HostMx w;
  w.n = n;
  w.k = k;
  w.scale_ld = 2;
  w.data.assign(n * k / 2, 0);
  w.scales.assign(n * 2, 127);
  for (int64_t j = 0; j < n; ++j) {
    // Row j: element 2j + 1 (high nibble of byte j) is code j (sign at 8), element 33 is 1.
    w.data[j * (k / 2) + j] = static_cast<uint8_t>(j << 4);
    w.data[j * (k / 2) + 16] = 0x20;  // element 33: code 2 = 1.0, in the second scale block
    w.scales[j * 2 + 1] = static_cast<uint8_t>(120 + j);  // 2^(j - 7)
  }
  // One activation row of ones.
  std::vector<uint16_t> ones(8 * k, FloatToBf16Bits(1.0f));
  DeviceArray<uint8_t> dw(w.data), ds(w.scales);
  std::vector<const uint8_t*> wp = {dw.get()}, sp = {ds.get()};
  DeviceArray<const uint8_t*> dwp(wp), dsp(sp);
  DeviceArray<uint16_t> da(ones);
  DeviceArray<int32_t> doff(std::vector<int32_t>{0, 1});
  DeviceArray<float> dc(n);
  Mxfp4MmaGroupedGemmParams p;
  p.num_groups = 1;
  p.max_rows = 1;
  p.offsets = doff.get();
  p.n = n;
  p.k = k;
  p.a = da.get();
  p.weights = dwp.get();
  p.scales = dsp.get();
  p.scale_ld = 2;
  p.c = dc.get();
  DEEPINFER_CUDA_OK(Mxfp4MmaGroupedGemm(p, nullptr));
  std::vector<float> got;
  DEEPINFER_CUDA_OK(dc.Download(&got));
  for (int64_t j = 0; j < n; ++j) {
    // Elements 2j (low nibble, 0) and 2j + 1 (code j) of the first block (scale 1) and 1.0 times
    // 2^(j - 7) of the second.
    const double want = E2m1(static_cast<uint8_t>(j)) + std::ldexp(1.0, static_cast<int>(j) - 7);
    EXPECT_EQ(got[j], want) << "row " << j;
  }
}

TEST(Mxfp4MmaGroupedGemmTest, RejectsWhatItCannotTake) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  DeviceArray<uint8_t> w(64 * 32), s(64 * 2);
  DeviceArray<uint16_t> a(4 * 64);
  DeviceArray<float> c(4 * 64);
  DeviceArray<int32_t> off(std::vector<int32_t>{0, 4});
  std::vector<const uint8_t*> wp = {w.get()}, sp = {s.get()};
  DeviceArray<const uint8_t*> dwp(wp), dsp(sp);
  Mxfp4MmaGroupedGemmParams p;
  p.num_groups = 1;
  p.max_rows = 4;
  p.offsets = off.get();
  p.n = 64;
  p.k = 64;
  p.a = a.get();
  p.weights = dwp.get();
  p.scales = dsp.get();
  p.scale_ld = 2;
  p.c = c.get();
  EXPECT_TRUE(Mxfp4MmaGroupedGemmSupports(p));
  Mxfp4MmaGroupedGemmParams q = p;
  q.k = 48;  // not a multiple of 32
  EXPECT_FALSE(Mxfp4MmaGroupedGemmSupports(q));
  EXPECT_EQ(Mxfp4MmaGroupedGemm(q, nullptr), cudaErrorInvalidValue);
  q = p;
  q.scale_ld = 1;
  EXPECT_FALSE(Mxfp4MmaGroupedGemmSupports(q));
  q = p;
  q.a = a.get() + 1;  // not 16-byte aligned
  EXPECT_FALSE(Mxfp4MmaGroupedGemmSupports(q));
  Mxfp4MmaGroupedGemmParams zero;
  EXPECT_FALSE(Mxfp4MmaGroupedGemmSupports(zero));
}

}  // namespace
}  // namespace kernels
}  // namespace deepinfer
