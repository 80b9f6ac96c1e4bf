// QuantizeMxfp4 against the OCP Microscaling Formats v1.0 spec, written out here: the E2M1 value
// table (section 5.3.3: codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6, bit 3 the sign), the E8M0 scale
// 2^(byte - 127), the shared exponent floor(log2(amax)) - emax_elem with emax_elem = 2, round to
// nearest even and saturation; and the packing of kernels/gemm/mxfp4_mma_gemm.h (even element in
// the low nibble), the layout of DeepSeek-V4's checkpoints.
#include "worker/model/mxfp4_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

constexpr double kE2m1[16] = {0.0,  0.5,  1.0,  1.5,  2.0,  3.0,  4.0,  6.0,
                              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};

double Decode(const std::vector<uint8_t>& packed, const std::vector<uint8_t>& scales, int64_t cols,
              int64_t r, int64_t p) {
  const uint8_t byte = packed[r * (cols / 2) + p / 2];
  const uint8_t code = p % 2 == 0 ? byte & 0xF : byte >> 4;
  return kE2m1[code] * std::ldexp(1.0, static_cast<int>(scales[r * (cols / 32) + p / 32]) - 127);
}

TEST(FloatToE2M1Test, EveryValueOfTheTableRoundTrips) {
  for (uint8_t code = 0; code < 16; ++code) {
    if (code == 8) continue;  // -0 encodes as 8 and reads back as -0, checked below
    EXPECT_EQ(FloatToE2M1(static_cast<float>(kE2m1[code])), code) << "code " << int{code};
  }
  EXPECT_EQ(FloatToE2M1(-0.0f), 8);
}

TEST(FloatToE2M1Test, RoundsToNearestTiesToEvenAndSaturates) {
  // Midpoints go to the neighbour with the even code (mantissa bit 0).
  EXPECT_EQ(kE2m1[FloatToE2M1(0.25f)], 0.0);
  EXPECT_EQ(kE2m1[FloatToE2M1(0.75f)], 1.0);
  EXPECT_EQ(kE2m1[FloatToE2M1(1.25f)], 1.0);
  EXPECT_EQ(kE2m1[FloatToE2M1(1.75f)], 2.0);
  EXPECT_EQ(kE2m1[FloatToE2M1(2.5f)], 2.0);
  EXPECT_EQ(kE2m1[FloatToE2M1(3.5f)], 4.0);
  EXPECT_EQ(kE2m1[FloatToE2M1(5.0f)], 4.0);
  EXPECT_EQ(kE2m1[FloatToE2M1(-5.0f)], -4.0);
  // Off the midpoints: the nearest.
  EXPECT_EQ(kE2m1[FloatToE2M1(0.2600f)], 0.5);
  EXPECT_EQ(kE2m1[FloatToE2M1(5.01f)], 6.0);
  EXPECT_EQ(kE2m1[FloatToE2M1(2.49f)], 2.0);
  EXPECT_EQ(kE2m1[FloatToE2M1(7.5f)], 6.0);
  EXPECT_EQ(kE2m1[FloatToE2M1(1e30f)], 6.0);
  EXPECT_EQ(kE2m1[FloatToE2M1(-1e30f)], -6.0);
}

TEST(Mxfp4ScaleByteTest, SharedExponentIsFloorLog2MinusTwo) {
  EXPECT_EQ(Mxfp4ScaleByte(1.0f), 125);   // 2^0 -> 2^-2: amax reads 4
  EXPECT_EQ(Mxfp4ScaleByte(6.0f), 127);   // floor(log2 6) = 2
  EXPECT_EQ(Mxfp4ScaleByte(7.99f), 127);  // 7.99 / 1 saturates to 6
  EXPECT_EQ(Mxfp4ScaleByte(8.0f), 128);
  EXPECT_EQ(Mxfp4ScaleByte(0.01f), 118);  // floor(log2 0.01) = -7
  EXPECT_EQ(Mxfp4ScaleByte(0.0f), 0);
  EXPECT_EQ(Mxfp4ScaleByte(std::numeric_limits<float>::denorm_min()), 0);  // clamped
  EXPECT_EQ(Mxfp4ScaleByte(std::numeric_limits<float>::max()), 252);
}

TEST(QuantizeMxfp4Test, ExactValuesRoundTripWithTheirScaleAndPacking) {
  // Row 0: block 0 holds the table times 2^-3 (amax 0.75: scale 2^-3, byte 124), block 1 one
  // 1.0 at element 33 and zeros (amax 1: scale 2^-2, the 1.0 read as 4). Row 1: 3 and -0.5
  // (amax 3: scale 2^-1).
  const int64_t cols = 64;
  std::vector<float> v(2 * cols, 0.0f);
  for (int i = 0; i < 16; ++i) v[i] = static_cast<float>(kE2m1[i] / 8.0);
  for (int i = 16; i < 32; ++i) v[i] = static_cast<float>(kE2m1[31 - i] / 8.0);
  v[33] = 1.0f;
  for (int64_t p = 0; p < cols; ++p) v[cols + p] = p % 2 == 0 ? 3.0f : -0.5f;
  std::vector<uint8_t> packed(2 * cols / 2), scales(2 * 2);
  ASSERT_TRUE(QuantizeMxfp4(v.data(), 2, cols, packed.data(), scales.data(), "t").ok());
  EXPECT_EQ(scales[0], 124);    // amax 0.75: floor(log2) = -1, -1 - 2 = -3
  EXPECT_EQ(scales[1], 125);    // amax 1
  EXPECT_EQ(scales[2], 126);    // amax 3: floor(log2 3) = 1, 1 - 2 = -1
  EXPECT_EQ(packed[0], 0x10);   // elements 0 (code 0, low nibble) and 1 (code 1, high nibble)
  EXPECT_EQ(packed[16], 0x60);  // element 33 (odd: high nibble of byte 16) is 4, code 6
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t p = 0; p < cols; ++p) {
      EXPECT_EQ(Decode(packed, scales, cols, r, p), v[r * cols + p]) << r << ", " << p;
    }
  }
}

TEST(QuantizeMxfp4Test, RandomBlocksAreWithinHalfAStepOfTheTable) {
  std::mt19937 gen(7);
  std::normal_distribution<float> d(0.0f, 0.02f);
  const int64_t rows = 8, cols = 256;
  std::vector<float> v(rows * cols);
  for (float& x : v) x = d(gen);
  std::vector<uint8_t> packed(rows * cols / 2), scales(rows * cols / 32);
  ASSERT_TRUE(QuantizeMxfp4(v.data(), rows, cols, packed.data(), scales.data(), "t").ok());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t p = 0; p < cols; ++p) {
      const double scale =
          std::ldexp(1.0, static_cast<int>(scales[r * (cols / 32) + p / 32]) - 127);
      const double x = v[r * cols + p] / scale, got = Decode(packed, scales, cols, r, p) / scale;
      // The nearest table value: no entry is closer than the one chosen.
      for (double t : kE2m1) {
        ASSERT_LE(std::abs(got - x), std::abs(t - x) + 1e-12) << r << ", " << p << ": " << x;
      }
      ASSERT_LT(std::abs(x), 8.0);  // the scale puts amax below 8
    }
  }
}

// A checkpoint's MXFP4 experts read as fp32 and quantised again (`--dtype mxfp4` on weights
// stored MXFP4) come back with the same values: the block's largest code sets a scale under which
// every stored value is again an E2M1 value.
TEST(QuantizeMxfp4Test, StoredMxfp4ValuesComeBackExactly) {
  std::mt19937 gen(11);
  std::uniform_int_distribution<int> byte(0, 255), scale(100, 140);
  const int64_t rows = 16, cols = 128;
  std::vector<uint8_t> stored(rows * cols / 2), stored_scales(rows * cols / 32);
  for (uint8_t& b : stored) b = static_cast<uint8_t>(byte(gen));
  for (uint8_t& s : stored_scales) s = static_cast<uint8_t>(scale(gen));
  // Blocks whose largest magnitude is each code: the rest of the block's codes below it.
  for (int64_t b = 0; b < 8; ++b) {
    for (int64_t i = 0; i < 16; ++i) {
      stored[b * 16 + i] = static_cast<uint8_t>((i * 5 + b) % (b + 1) | (((i * 3) % (b + 1)) << 4));
    }
  }
  std::vector<float> v(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t p = 0; p < cols; ++p) {
      v[r * cols + p] = static_cast<float>(Decode(stored, stored_scales, cols, r, p));
    }
  }
  std::vector<uint8_t> packed(rows * cols / 2), scales(rows * cols / 32);
  ASSERT_TRUE(QuantizeMxfp4(v.data(), rows, cols, packed.data(), scales.data(), "t").ok());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t p = 0; p < cols; ++p) {
      ASSERT_EQ(Decode(packed, scales, cols, r, p), v[r * cols + p]) << r << ", " << p;
    }
  }
}

// Every element as the scalar definitions make it: the block's scale byte from its largest
// magnitude and each code FloatToE2M1(x * 2^(127 - s)), on blocks of random magnitudes whose
// values include the E2M1 midpoints and table values at the block's scale, and zeros.
TEST(QuantizeMxfp4Test, EveryElementAsTheScalarDefinitions) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 3), exponent(-30, 30), idx(0, 14);
  const float grid[15] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f,
                          2.0f, 2.5f,  3.0f, 3.5f,  4.0f, 5.0f,  6.0f};
  const int64_t rows = 37, cols = 96;
  std::vector<float> v(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols / 32; ++b) {
      const int e = exponent(rng);
      for (int64_t i = 0; i < 32; ++i) {
        const int kind = pick(rng);
        float x = kind == 0 ? 0.0f : kind == 1 ? uni(rng) * 8.0f : grid[idx(rng)];
        if (kind != 1 && uni(rng) < 0.0f) x = -x;
        v[r * cols + b * 32 + i] = std::ldexp(x, e);
      }
    }
  }
  std::vector<uint8_t> packed(rows * cols / 2), scales(rows * cols / 32);
  ASSERT_TRUE(QuantizeMxfp4(v.data(), rows, cols, packed.data(), scales.data(), "t").ok());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols / 32; ++b) {
      float amax = 0.0f;
      for (int64_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[r * cols + b * 32 + i]));
      const uint8_t s = Mxfp4ScaleByte(amax);
      ASSERT_EQ(scales[r * (cols / 32) + b], s) << "row " << r << " block " << b;
      for (int64_t i = 0; i < 32; ++i) {
        const int64_t c = b * 32 + i;
        const uint8_t want = FloatToE2M1(v[r * cols + c] * std::ldexp(1.0f, 127 - s));
        const uint8_t byte = packed[r * (cols / 2) + c / 2];
        ASSERT_EQ(c % 2 == 0 ? byte & 0xF : byte >> 4, want)
            << "element (" << r << ", " << c << ")";
      }
    }
  }
}

TEST(QuantizeMxfp4Test, RefusesWhatItCannotHold) {
  std::vector<float> v(48, 1.0f);
  std::vector<uint8_t> packed(24), scales(2);
  absl::Status st = QuantizeMxfp4(v.data(), 1, 48, packed.data(), scales.data(), "w");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("multiple of 32"), std::string::npos) << st.message();
  v[5] = std::numeric_limits<float>::infinity();
  st = QuantizeMxfp4(v.data(), 1, 32, packed.data(), scales.data(), "w");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("(0, 5)"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace deepinfer
