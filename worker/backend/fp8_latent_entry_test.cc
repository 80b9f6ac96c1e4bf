// The FP8 latent entry against e4m3 written out here: every code's value from the format's
// definition (sign, 4 exponent bits of bias 7, 3 mantissa bits, subnormals at exponent 0, 0x7F
// NaN), and rounding as the nearest of those values (ties to the even code), by search.
#include "worker/backend/fp8_latent_entry.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

// The value of a non-negative e4m3fn code 0x00 .. 0x7E.
double CodeValue(int code) {
  const int e = code >> 3, m = code & 7;
  return e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
}

// The code nearest to x (ties: the even code), saturating at 448, by search over every code.
uint8_t NearestCode(double x) {
  const double a = std::fabs(x);
  int best = 0;
  for (int c = 1; c <= 0x7E; ++c) {
    const double d = std::fabs(CodeValue(c) - a), bd = std::fabs(CodeValue(best) - a);
    if (d < bd || (d == bd && c % 2 == 0)) best = c;
  }
  return static_cast<uint8_t>((std::signbit(x) ? 0x80 : 0) | best);
}

double Decode(uint8_t code) {
  const double v = CodeValue(code & 0x7F);
  return (code & 0x80) ? -v : v;
}

float ReadFloat(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

TEST(Fp8LatentEntryTest, LayoutOfDeepSeekV3) {
  const Fp8LatentEntryLayout l = Fp8LatentLayout(512, 64);
  EXPECT_EQ(l.rope_offset, 512);
  EXPECT_EQ(l.scale_offset, 640);
  EXPECT_EQ(l.bytes, 656);  // 512 + 128 + 4, padded to 16
  const Fp8LatentEntryLayout odd = Fp8LatentLayout(30, 3);
  EXPECT_EQ(odd.rope_offset, 32);
  EXPECT_EQ(odd.scale_offset, 40);
  EXPECT_EQ(odd.bytes, 48);
}

TEST(Fp8LatentEntryTest, QuantisesAgainstWrittenOutE4m3) {
  const int64_t latent = 96, rope = 8;
  const Fp8LatentEntryLayout layout = Fp8LatentLayout(latent, rope);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    // Magnitudes over many binades (down into the subnormals of the scaled values).
    std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
    std::uniform_int_distribution<int> exp(-14, 6);
    std::vector<float> x(latent), r(rope);
    for (float& v : x) v = std::ldexp(mant(rng), exp(rng));
    for (float& v : r) v = mant(rng) * 3.0f;
    std::vector<uint8_t> entry(layout.bytes, 0xAB);
    QuantizeFp8LatentEntry(x.data(), latent, r.data(), rope, entry.data());

    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const float s = std::max(amax / 448.0f, FLT_MIN);
    ASSERT_EQ(ReadFloat(entry.data() + layout.scale_offset), s);
    for (int64_t i = 0; i < latent; ++i) {
      ASSERT_EQ(entry[i], NearestCode(static_cast<double>(x[i] / s)))
          << "trial " << trial << " element " << i << " x " << x[i];
    }
    for (int64_t i = layout.scale_offset + 4; i < layout.bytes; ++i) EXPECT_EQ(entry[i], 0);

    std::vector<float> back(latent + rope);
    DequantizeFp8LatentEntry(entry.data(), latent, rope, back.data());
    for (int64_t i = 0; i < latent; ++i) {
      ASSERT_EQ(back[i], static_cast<float>(Decode(entry[i]) * s));
      // e4m3 keeps 4 significant bits: half a unit in the last place is 2^-4 relative, and
      // values below the normal range (2^-6 s) are within half a subnormal step, 2^-10 s.
      EXPECT_LE(std::fabs(back[i] - x[i]),
                std::max(std::fabs(x[i]) / 16.0f, s / 1024.0f) * 1.0001f);
    }
    for (int64_t i = 0; i < rope; ++i) {
      // bf16 nearest even: within 2^-9 relative.
      EXPECT_LE(std::fabs(back[latent + i] - r[i]), std::fabs(r[i]) / 256.0f);
    }
  }
}

TEST(Fp8LatentEntryTest, AbsmaxMapsToTheLargestCode) {
  const int64_t latent = 4, rope = 2;
  const float x[latent] = {0.5f, -2.0f, 1.0f, 0.0f};
  const float r[rope] = {1.5f, -0.25f};
  std::vector<uint8_t> entry(Fp8LatentLayout(latent, rope).bytes);
  QuantizeFp8LatentEntry(x, latent, r, rope, entry.data());
  EXPECT_EQ(entry[1], 0xFE);  // -448
  EXPECT_EQ(entry[3], 0x00);
  std::vector<float> back(latent + rope);
  DequantizeFp8LatentEntry(entry.data(), latent, rope, back.data());
  EXPECT_EQ(back[1], -2.0f);  // the amax comes back exactly
  EXPECT_EQ(back[4], 1.5f);
  EXPECT_EQ(back[5], -0.25f);
}

TEST(Fp8LatentEntryTest, ZeroLatentKeepsAPositiveScale) {
  const float x[3] = {0.0f, -0.0f, 0.0f};
  const float r[1] = {0.0f};
  std::vector<uint8_t> entry(Fp8LatentLayout(3, 1).bytes);
  QuantizeFp8LatentEntry(x, 3, r, 1, entry.data());
  EXPECT_EQ(ReadFloat(entry.data() + Fp8LatentLayout(3, 1).scale_offset), FLT_MIN);
  std::vector<float> back(4, 1.0f);
  DequantizeFp8LatentEntry(entry.data(), 3, 1, back.data());
  for (float v : back) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace deepinfer
