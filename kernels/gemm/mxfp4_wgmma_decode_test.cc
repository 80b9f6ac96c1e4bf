// Mxfp4WgmmaSwapGroupedGemm against the product in double on the host over the dequantised MXFP4
// weights and the dequantised e4m3 activations: random e2m1 codes with UE8M0 scales that use the
// whole allowed spread in a 128-wide k block (s from E - 14 to E, so e2m1 0.5 lands on e4m3's
// smallest subnormal), blocks of zeros with scales far below, random e4m3 activations with random
// per-row 1 x 128 block scales in Fp8QuantizeRows' grouped layout. The bound is 2^-9 of the sum of
// the terms' magnitudes (the tensor cores add a k block's products with fewer bits than fp32); a
// wrong fragment, swizzle, table or scale index is off by about the sum itself. Also: rows past
// the groups and padding columns untouched, and Mxfp4WgmmaSwapCheck on fitting and breaking
// matrices. Skips itself without a compute capability 9.0 device.
#include "kernels/gemm/mxfp4_wgmma_decode.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {
namespace kernels {
namespace {

using testing::DeviceArray;

#define SKIP_WITHOUT_WGMMA()                                                                 \
  do {                                                                                       \
    DEEPINFER_SKIP_WITHOUT_GPU();                                                            \
    if (!Mxfp4WgmmaSwapDeviceSupports()) GTEST_SKIP() << "no compute capability 9.0 device"; \
  } while (0)

// One MXFP4 matrix [n, k] on the host: packed codes (low nibble the even value) and scales.
struct HostMxfp4 {
  int64_t n = 0, k = 0, scale_ld = 0;
  std::vector<uint8_t> packed, scales;
};

double E2m1(uint8_t code) {
  static const double kMag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  return (code & 8) ? -kMag[code & 7] : kMag[code & 7];
}

double Weight(const HostMxfp4& w, int64_t j, int64_t p) {
  const uint8_t byte = w.packed[j * (w.k / 2) + p / 2];
  const uint8_t code = (p % 2 == 0) ? (byte & 0xF) : (byte >> 4);
  return std::ldexp(E2m1(code), int(w.scales[j * w.scale_ld + p / 32]) - 127);
}

// Per row and 128-wide k block: E in 112 .. 140, each 32-block's s in E - 14 .. E, one block in
// eight all zeros with a scale anywhere from 0 to E.
HostMxfp4 MakeWeight(int64_t n, int64_t k, std::mt19937* gen) {
  HostMxfp4 w;
  w.n = n, w.k = k, w.scale_ld = k / 32 + 4;  // padded rows (scale_ld a multiple of 4)
  w.packed.resize(n * k / 2);
  w.scales.assign(n * w.scale_ld, 0x5A);
  std::uniform_int_distribution<int> byte(0, 255), e_dist(112, 140), spread(0, 14), eighth(0, 7);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t kb = 0; kb < k / 128; ++kb) {
      const int e = e_dist(*gen);
      for (int q = 0; q < 4; ++q) {
        uint8_t* bytes = &w.packed[j * (k / 2) + kb * 64 + 16 * q];
        const bool zeros = eighth(*gen) == 0;
        for (int b = 0; b < 16; ++b) {
          // Zero codes keep their sign bits: -0 must stay 0.
          bytes[b] =
              zeros ? static_cast<uint8_t>(byte(*gen) & 0x88) : static_cast<uint8_t>(byte(*gen));
        }
        w.scales[j * w.scale_ld + kb * 4 + q] = static_cast<uint8_t>(
            zeros ? std::uniform_int_distribution<int>(0, e)(*gen) : e - spread(*gen));
      }
    }
  }
  return w;
}

std::vector<double> Dequantised(const HostMxfp4& w) {
  std::vector<double> d(w.n * w.k);
  for (int64_t j = 0; j < w.n; ++j) {
    for (int64_t p = 0; p < w.k; ++p) d[j * w.k + p] = Weight(w, j, p);
  }
  return d;
}

struct SwapCase {
  int32_t num_groups;
  std::vector<int32_t> rows;
  int32_t weights;  // distinct matrices; group g multiplies matrix g % weights
  int64_t n, k;
  int32_t hint;
  int64_t ldc_pad;
};

class Mxfp4WgmmaSwapTest : public ::testing::TestWithParam<SwapCase> {};

TEST_P(Mxfp4WgmmaSwapTest, EachGroupMatchesItsProductOnTheHost) {
  SKIP_WITHOUT_WGMMA();
  const SwapCase c = GetParam();
  const int64_t n = c.n, k = c.k, ldc = n + c.ldc_pad, blocks = k / 128;
  const int32_t G = c.num_groups;
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);

  std::vector<int32_t> offsets(G + 1, 0);
  for (int32_t g = 0; g < G; ++g) offsets[g + 1] = offsets[g] + c.rows[g % c.rows.size()];
  const int32_t total = offsets[G];
  const int32_t max_rows = total + 5;  // rows past the groups: left untouched
  const int64_t lda = k;

  std::vector<HostMxfp4> w;
  std::vector<std::vector<double>> wd;
  for (int32_t i = 0; i < c.weights; ++i) {
    w.push_back(MakeWeight(n, k, &gen));
    wd.push_back(Dequantised(w.back()));
  }
  // e4m3 activations without the NaN codes; every row random, the rows past the groups too.
  std::vector<uint8_t> a(size_t(max_rows) * lda);
  {
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& v : a) {
      do {
        v = static_cast<uint8_t>(byte(gen));
      } while ((v & 0x7F) == 0x7F);
    }
  }
  std::vector<float> sa(std::max<int64_t>(int64_t{total} * blocks, 1));
  {
    std::uniform_real_distribution<float> frac(0.5f, 2.0f);
    std::uniform_int_distribution<int> ex(-6, 6);
    for (auto& v : sa) v = std::ldexp(frac(gen), ex(gen));
  }

  std::vector<std::unique_ptr<DeviceArray<uint8_t>>> dw, dws;
  for (int32_t i = 0; i < c.weights; ++i) {
    dw.push_back(std::make_unique<DeviceArray<uint8_t>>(w[i].packed));
    dws.push_back(std::make_unique<DeviceArray<uint8_t>>(w[i].scales));
  }
  std::vector<const uint8_t*> host_w(G), host_s(G);
  for (int32_t g = 0; g < G; ++g) {
    host_w[g] = dw[g % c.weights]->get();
    host_s[g] = dws[g % c.weights]->get();
  }
  DeviceArray<uint8_t> maps(Mxfp4WgmmaSwapWeightMapsBytes(G));
  DEEPINFER_CUDA_OK(Mxfp4WgmmaSwapBuildWeightMaps(G, host_w.data(), n, k, maps.get(), nullptr));
  DeviceArray<const uint8_t*> dweights(host_w), dscales(host_s);
  bool fits = false;
  DEEPINFER_CUDA_OK(
      Mxfp4WgmmaSwapCheck(G, dweights.get(), dscales.get(), n, k, w[0].scale_ld, &fits, nullptr));
  ASSERT_TRUE(fits);

  DeviceArray<int32_t> doffsets(offsets);
  DeviceArray<uint8_t> da(a);
  DeviceArray<float> dsa(sa);
  DeviceArray<float> dc(size_t(max_rows) * ldc);
  dc.Poison();

  Mxfp4WgmmaSwapGroupedGemmParams p;
  p.num_groups = G, p.max_rows = max_rows, p.offsets = doffsets.get();
  p.n = n, p.k = k, p.a = da.get(), p.lda = lda, p.a_scales = dsa.get();
  p.weight_maps = maps.get(), p.scales = dscales.get(), p.scale_ld = w[0].scale_ld;
  p.c = dc.get(), p.ldc = ldc, p.rows_per_group_hint = c.hint;
  ASSERT_TRUE(Mxfp4WgmmaSwapGroupedGemmSupports(p));
  DEEPINFER_CUDA_OK(Mxfp4WgmmaSwapGroupedGemm(p, nullptr));
  std::vector<float> got;
  DEEPINFER_CUDA_OK(dc.Download(&got));

  int64_t bad = 0;
  std::vector<double> x(k);
  for (int32_t g = 0; g < G; ++g) {
    const int32_t r0 = offsets[g], count = offsets[g + 1] - r0;
    const std::vector<double>& m = wd[g % c.weights];
    for (int32_t i = 0; i < count; ++i) {
      for (int64_t q = 0; q < k; ++q) {
        x[q] = static_cast<double>(F8E4M3ToFloat(a[(r0 + i) * lda + q])) *
               sa[int64_t{r0} * blocks + (q / 128) * count + i];
      }
      for (int64_t j = 0; j < n; ++j) {
        const double* wr = &m[j * k];
        double sum = 0.0, mag = 0.0;
        for (int64_t q = 0; q < k; ++q) {
          sum += x[q] * wr[q];
          mag += std::abs(x[q] * wr[q]);
        }
        const double v = got[int64_t{r0 + i} * ldc + j];
        if (!(std::abs(v - sum) <= mag / 512 + 1e-30) && ++bad <= 5) {
          ADD_FAILURE() << "group " << g << " row " << i << " col " << j << ": " << v << " vs "
                        << sum << " (terms' magnitude " << mag << ")";
        }
      }
    }
  }
  EXPECT_EQ(bad, 0);
  // Untouched: the padding columns and the rows past the groups keep the poison (NaN).
  for (int32_t r = 0; r < max_rows; ++r) {
    for (int64_t j = 0; j < ldc; ++j) {
      if (r < total && j < n) continue;
      ASSERT_TRUE(std::isnan(got[int64_t{r} * ldc + j])) << "row " << r << " col " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Mxfp4WgmmaSwapTest,
    ::testing::Values(
        // Moonlight's gate_up (2 x 1408 rows, k 2048) and down (2048 rows, k 1408): uneven
        // groups with empty ones, groups longer than a chunk.
        SwapCase{16, {0, 3, 1, 17, 0, 5, 2, 9}, 3, 2816, 2048, 16, 0},
        SwapCase{16, {2, 0, 7, 1, 33, 0, 4, 12}, 3, 2048, 1408, 8, 0},
        // V3's gate_up (2 x 2048 rows, k 7168) and down (7168 rows, k 2048).
        SwapCase{8, {1, 0, 3, 2}, 2, 4096, 7168, 8, 0},
        SwapCase{8, {5, 0, 1, 9}, 2, 7168, 2048, 32, 0},
        // n not a multiple of the 128-row tile, padding columns, the unknown hint (N 32).
        SwapCase{5, {0, 0, 3, 40, 1}, 2, 200, 256, 0, 3},
        // Every group but the last empty.
        SwapCase{4, {0, 0, 0, 6}, 1, 384, 512, 16, 0}));

// Mxfp4WgmmaSwapCheck: a fitting matrix, one 32-block with a nonzero code 15 binades below its k
// block's largest scale, one all-zero block far below (fits), a 0xFF scale.
TEST(Mxfp4WgmmaSwapCheckTest, RefusesMatricesBeyondTheExponentBound) {
  SKIP_WITHOUT_WGMMA();
  const int64_t n = 130, k = 256;
  std::mt19937 gen(testing::FreshSeed());
  const HostMxfp4 base = MakeWeight(n, k, &gen);
  auto check = [&](const HostMxfp4& w) {
    DeviceArray<uint8_t> dw(w.packed), ds(w.scales);
    // Two groups: the base matrix and the one under test.
    DeviceArray<uint8_t> dbase(base.packed), dbase_s(base.scales);
    const std::vector<const uint8_t*> hw = {dbase.get(), dw.get()};
    const std::vector<const uint8_t*> hs = {dbase_s.get(), ds.get()};
    DeviceArray<const uint8_t*> pw(hw), ps(hs);
    bool fits = false;
    EXPECT_EQ(Mxfp4WgmmaSwapCheck(2, pw.get(), ps.get(), n, k, w.scale_ld, &fits, nullptr),
              cudaSuccess);
    return fits;
  };
  EXPECT_TRUE(check(base));
  // Row 129, k block 1: scales {140, 125, 140, 140}, block 1 a nonzero code.
  const int64_t j = 129, kb = 1;
  HostMxfp4 w = base;
  for (int q = 0; q < 4; ++q) w.scales[j * w.scale_ld + kb * 4 + q] = 140;
  w.scales[j * w.scale_ld + kb * 4 + 1] = 126;  // E - 14: fits
  uint8_t* block1 = &w.packed[j * (k / 2) + kb * 64 + 16];
  for (int b = 0; b < 16; ++b) block1[b] = 0x88;  // zeros (both signs)
  block1[7] = 0x01;                               // one 0.5
  EXPECT_TRUE(check(w));
  w.scales[j * w.scale_ld + kb * 4 + 1] = 125;  // E - 15
  EXPECT_FALSE(check(w));
  block1[7] = 0x80;  // the block all zeros again: any scale fits
  w.scales[j * w.scale_ld + kb * 4 + 1] = 0;
  EXPECT_TRUE(check(w));
  w.scales[3 * w.scale_ld + 2] = 0xFF;
  EXPECT_FALSE(check(w));
}

}  // namespace
}  // namespace kernels
}  // namespace deepinfer
