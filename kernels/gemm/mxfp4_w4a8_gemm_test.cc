// Mxfp4W4a8GroupedGemm against a host reference over the dequantised operands: each weight element
// decoded by the loader's E2M1 / UE8M0 decoding (worker/model/dtype_conversion.h, not the kernel's
// bit placement) and each activation as its e4m3 code (the loader's e4m3 decoding) times its
// block scale, the sum in double; the activations are quantised here on the host by
// Fp8QuantizeRows' documented rule (s = max(amax / 448, FLT_MIN) per 128-wide block, q = e4m3(x /
// s)) into its grouped scale layout. So only the summation order and precision differ: the
// products are exact, each 32-value block's sum comes from one FP8 MMA (its accumulation
// precision on the tensor core is not specified as full fp32: allowed 2^-13 of the block's
// sum of |products|), then up to two fp32 roundings per block for the scaling and the running
// sum and up to eight for the k-slices. A wrong nibble, code, scale, block or row is off by
// about |want| ~ sum |a w| / sqrt(k), far above that. Skips itself without a GPU.
#include "kernels/gemm/mxfp4_w4a8_gemm.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <iostream>
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

// The kernel's placement of e2m1 nibbles as e4m3 bytes (the header's claim, restated): for every
// code, byte (s << 7) | (e1 e0 m << 2) is the e2m1 value times 2^-6; and the word-wide masks and
// shifts give, for every byte, the even (low) and odd (high) nibble's e4m3 bytes.
TEST(Mxfp4W4a8Placement, E2m1AsE4m3IsExactForAllCodes) {
  for (uint32_t c = 0; c < 16; ++c) {
    const uint8_t byte = static_cast<uint8_t>(((c & 8u) << 4) | ((c & 7u) << 2));
    EXPECT_EQ(static_cast<double>(F8E4M3ToFloat(byte)),
              std::ldexp(static_cast<double>(E2M1ToFloat(static_cast<uint8_t>(c))), -6))
        << "code " << c;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    // The same byte in all four positions, and b in position 1 only (no bits leak across bytes).
    for (const uint32_t w : {b * 0x01010101u, (b << 8) | 0xFF0000FFu}) {
      const uint32_t even = ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u);
      const uint32_t odd = ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);
      for (int i = 0; i < 4; ++i) {
        const uint8_t src = static_cast<uint8_t>(w >> (8 * i));
        EXPECT_EQ(F8E4M3ToFloat(static_cast<uint8_t>(even >> (8 * i))),
                  std::ldexp(E2M1ToFloat(src & 0xF), -6));
        EXPECT_EQ(F8E4M3ToFloat(static_cast<uint8_t>(odd >> (8 * i))),
                  std::ldexp(E2M1ToFloat(src >> 4), -6));
      }
    }
  }
}

// A host MXFP4 matrix [n, k]: packed bytes [n, k / 2] (even element in the low nibble) and UE8M0
// scales [n, scale_ld].
struct HostMx {
  int64_t n = 0, k = 0, scale_ld = 0;
  std::vector<uint8_t> data, scales;
  double At(int64_t j, int64_t p) const {
    const uint8_t byte = data[j * (k / 2) + p / 2];
    return static_cast<double>(E2M1ToFloat(p % 2 == 0 ? byte & 0xF : byte >> 4)) *
           std::ldexp(1.0, static_cast<int>(scales[j * scale_ld + p / 32]) - 127);
  }
  int Scale(int64_t j) const { return scales[j * scale_ld]; }
};

// Rows with every block scale byte 0 (2^-127: fp32 subnormal results).
bool ZeroScaleRow(int64_t j) { return j % 13 == 3; }
// Rows with every block scale byte 254 (2^127) and nonzero codes in the first block only: the
// result is that block's sum times 2^127, beyond fp32's range (inf) unless the sum is small.
bool MaxScaleRow(int64_t j) { return j % 19 == 11; }

// Random codes, scale bytes 100 .. 140 and the rows above; scale_ld padding bytes 0xFF, which a
// correct kernel never reads.
HostMx MakeWeight(int64_t n, int64_t k, int64_t extra_ld, std::mt19937* gen) {
  HostMx w;
  w.n = n;
  w.k = k;
  w.scale_ld = k / 32 + extra_ld;
  std::uniform_int_distribution<int> byte(0, 255), scale(100, 140);
  w.data.resize(n * k / 2);
  for (uint8_t& b : w.data) b = static_cast<uint8_t>(byte(*gen));
  w.scales.assign(n * w.scale_ld, 0xFF);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t b = 0; b < k / 32; ++b) {
      int s = scale(*gen);
      if (ZeroScaleRow(j)) s = 0;
      if (MaxScaleRow(j)) s = 254;
      w.scales[j * w.scale_ld + b] = static_cast<uint8_t>(s);
    }
    if (MaxScaleRow(j)) {
      std::fill(w.data.begin() + j * k / 2 + 16, w.data.begin() + (j + 1) * k / 2, uint8_t{0});
    }
  }
  return w;
}

// Activation rows quantised as Fp8QuantizeRows does, into its grouped layout; deq the values the
// kernel multiplies (code times scale, in double).
struct HostQ {
  std::vector<uint8_t> q;
  std::vector<float> scales;
  std::vector<double> deq;
};

HostQ Quantise(const std::vector<float>& a, int64_t rows, int64_t k,
               const std::vector<int32_t>& offsets) {
  const int64_t blocks = (k + 127) / 128;
  HostQ h;
  h.q.assign(rows * k, 0);
  h.deq.assign(rows * k, 0.0);
  h.scales.assign(std::max<int64_t>(1, offsets.back() * blocks), 0.0f);
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    const int64_t first = offsets[g], count = offsets[g + 1] - offsets[g];
    for (int64_t r = first; r < first + count; ++r) {
      for (int64_t kb = 0; kb < blocks; ++kb) {
        const int64_t p0 = kb * 128, p1 = std::min(k, p0 + 128);
        float amax = 0;
        for (int64_t p = p0; p < p1; ++p) amax = std::max(amax, std::abs(a[r * k + p]));
        const float s = std::max(amax / 448.0f, FLT_MIN);
        h.scales[first * blocks + kb * count + (r - first)] = s;
        for (int64_t p = p0; p < p1; ++p) {
          const uint8_t code = FloatToF8E4M3(a[r * k + p] / s);
          h.q[r * k + p] = code;
          h.deq[r * k + p] = static_cast<double>(F8E4M3ToFloat(code)) * s;
        }
      }
    }
  }
  return h;
}

struct GroupedCase {
  std::vector<int32_t> rows_per_group;
  int64_t n, k, extra_ld;
};

class Mxfp4W4a8GroupedGemmTest : public ::testing::TestWithParam<GroupedCase> {};

TEST_P(Mxfp4W4a8GroupedGemmTest, MatchesDequantisedReference) {
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
  // Activations with magnitudes that differ per 128-wide block and per row (each block's own
  // scale matters).
  std::vector<float> a = testing::RandomFloats(static_cast<size_t>(max_rows) * t.k, seed);
  for (int64_t r = 0; r < max_rows; ++r) {
    for (int64_t p = 0; p < t.k; ++p) {
      a[r * t.k + p] *= std::ldexp(1.0f, static_cast<int>((p / 128 + r) % 7) - 3);
    }
  }
  const HostQ hq = Quantise(a, max_rows, t.k, offsets);
  DeviceArray<uint8_t> dq(hq.q);
  DeviceArray<float> dqs(hq.scales);
  DeviceArray<int32_t> doff(offsets);
  DeviceArray<const uint8_t*> dwp(wptr), dsp(sptr);
  DeviceArray<float> dc(static_cast<size_t>(max_rows) * t.n);
  Mxfp4W4a8GroupedGemmParams p;
  p.num_groups = groups;
  p.max_rows = max_rows;
  p.offsets = doff.get();
  p.n = t.n;
  p.k = t.k;
  p.a = dq.get();
  p.a_scales = dqs.get();
  p.weights = dwp.get();
  p.scales = dsp.get();
  p.scale_ld = w[0].scale_ld;
  p.c = dc.get();
  ASSERT_TRUE(Mxfp4W4a8GroupedGemmSupports(p));

  // The sums depend on the k split only: every row hint (8, 16 or 32 rows a pass) gives the
  // same bits.
  // The reference, once: want and sum |products| per (row, feature).
  std::vector<double> want_all(static_cast<size_t>(used) * t.n),
      mag_all(static_cast<size_t>(used) * t.n);
  {
    std::vector<double> row(t.k);
    for (int32_t g = 0; g < groups; ++g) {
      for (int64_t j = 0; j < t.n; ++j) {
        for (int64_t x = 0; x < t.k; ++x) row[x] = w[g].At(j, x);
        for (int32_t r = offsets[g]; r < offsets[g + 1]; ++r) {
          double want = 0, mag = 0;
          for (int64_t x = 0; x < t.k; ++x) {
            const double prod = hq.deq[r * t.k + x] * row[x];
            want += prod;
            mag += std::abs(prod);
          }
          want_all[r * t.n + j] = want;
          mag_all[r * t.n + j] = mag;
        }
      }
    }
  }
  const double unit = std::ldexp(1.0, -13) + std::ldexp(1.0, -24) * (t.k / 32.0 + 16.0);
  const double tiny = std::ldexp(1.0, -149) * (t.k / 32.0 + 16.0);

  std::vector<float> got, other;
  for (int32_t k_split : {0, 1, 8}) {
    SCOPED_TRACE(::testing::Message() << "k_split " << k_split);
    for (int32_t hint : {1, 12, 32}) {
      Mxfp4W4a8GroupedGemmParams q = p;
      q.k_split = k_split;
      q.rows_per_group_hint = hint;
      dc.Poison();
      DEEPINFER_CUDA_OK(Mxfp4W4a8GroupedGemm(q, nullptr));
      DEEPINFER_CUDA_OK(dc.Download(hint == 1 ? &got : &other));
      if (hint != 1) {
        ASSERT_TRUE(testing::SameBits(got.data(), other.data(), static_cast<size_t>(used) * t.n))
            << "hint " << hint << " differs from hint 1";
      }
    }
    double worst = 0;
    int64_t infs = 0;
    for (int32_t g = 0; g < groups; ++g) {
      for (int32_t r = offsets[g]; r < offsets[g + 1]; ++r) {
        for (int64_t j = 0; j < t.n; ++j) {
          const double want = want_all[r * t.n + j], mag = mag_all[r * t.n + j];
          const float v = got[r * t.n + j];
          const double bound = unit * mag + tiny;
          if (std::abs(want) - bound > std::ldexp(1.0, 128)) {
            ASSERT_TRUE(std::isinf(v) && (v > 0) == (want > 0))
                << "want inf of the sign: group " << g << " row " << r << " feature " << j
                << " got " << v << " want " << want;
            ++infs;
            continue;
          }
          // Within the error bound of fp32's largest value: finite or inf are both right.
          if (std::abs(want) + bound >= FLT_MAX || mag >= FLT_MAX) continue;
          const double d = std::abs(static_cast<double>(v) - want);
          ASSERT_LE(d, bound) << "group " << g << " row " << r << " feature " << j << " scale byte "
                              << w[g].Scale(j) << ": got " << v << " want " << want;
          worst = std::max(worst, d / bound);
        }
      }
    }
    for (size_t i = static_cast<size_t>(used) * t.n; i < got.size(); ++i) {
      ASSERT_TRUE(std::isnan(got[i])) << "row past the groups written at " << i;
    }
    std::cout << "[mxfp4-w4a8] k_split " << k_split << ": largest error " << worst
              << " of its bound, " << infs << " inf results\n";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Mxfp4W4a8GroupedGemmTest,
    ::testing::Values(
        // Every group size the decode and prefill tiles meet (empty, one pass of 8 / 16 / 32
        // rows, several passes); k not a multiple of 128 (a last step with 3 of 4 blocks).
        GroupedCase{{0, 1, 2, 7, 8, 9, 16, 17, 33, 64, 130}, 96, 352, 0},
        GroupedCase{{0, 1, 2, 7, 8, 9, 16, 17, 33, 64, 130}, 40, 160, 3},
        // Decode: fewer rows than groups, one block row per busy group.
        GroupedCase{{0, 1, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 3}, 256, 384, 0},
        // Moonlight's experts (hidden 2048, intermediate 1408): gate_up, down.
        GroupedCase{{1, 0, 2, 7, 9, 0, 17}, 2816, 2048, 0},
        GroupedCase{{1, 0, 2, 7, 9, 0, 17}, 2048, 1408, 0},
        // DeepSeek-V4-Flash's experts (hidden 4096, intermediate 2048): gate_up, down.
        GroupedCase{{2, 0, 8, 1, 0, 16}, 4096, 4096, 0},
        GroupedCase{{2, 0, 8, 1, 0, 16}, 4096, 2048, 0}));

TEST(Mxfp4W4a8GroupedGemmTest, RefusesWhatItDoesNotTake) {
  Mxfp4W4a8GroupedGemmParams p;
  EXPECT_FALSE(Mxfp4W4a8GroupedGemmSupports(p));
  EXPECT_EQ(Mxfp4W4a8GroupedGemm(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kernels
}  // namespace deepinfer
