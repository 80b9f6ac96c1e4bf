// Tests for the checkpoint float formats, against hand-decoded bit patterns.
#include "worker/model/dtype_conversion.h"

#include <cmath>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

TEST(DtypeConversionTest, Bf16) {
  EXPECT_EQ(Bf16ToFloat(0x3FC0), 1.5f);
  EXPECT_EQ(Bf16ToFloat(0xC000), -2.0f);
  EXPECT_EQ(Bf16ToFloat(0x0000), 0.0f);
}

TEST(DtypeConversionTest, F16IncludingSubnormalsAndInf) {
  EXPECT_EQ(F16ToFloat(0x3E00), 1.5f);
  EXPECT_EQ(F16ToFloat(0xC000), -2.0f);
  EXPECT_EQ(F16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToFloat(0x7BFF), 65504.0f);
  EXPECT_TRUE(std::isinf(F16ToFloat(0x7C00)));
  EXPECT_TRUE(std::isnan(F16ToFloat(0x7E00)));
}

TEST(DtypeConversionTest, F8E4M3fn) {
  EXPECT_EQ(F8E4M3ToFloat(0x38), 1.0f);
  EXPECT_EQ(F8E4M3ToFloat(0xB8), -1.0f);
  EXPECT_EQ(F8E4M3ToFloat(0x7E), 448.0f);                // largest finite
  EXPECT_EQ(F8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(F8E4M3ToFloat(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(F8E4M3ToFloat(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(F8E4M3ToFloat(0x3B), 1.375f);
  EXPECT_TRUE(std::isnan(F8E4M3ToFloat(0x7F)));
}

TEST(DtypeConversionTest, FloatToF8E4M3RoundsToNearestEvenAndSaturates) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;  // NaN
    EXPECT_EQ(FloatToF8E4M3(F8E4M3ToFloat(static_cast<uint8_t>(b))), b) << "code " << b;
  }
  EXPECT_EQ(FloatToF8E4M3(1.0625f), 0x38);  // halfway between 1 (0x38) and 1.125 (0x39): even
  EXPECT_EQ(FloatToF8E4M3(1.1875f), 0x3A);  // halfway between 1.125 and 1.25 (0x3A): even
  EXPECT_EQ(FloatToF8E4M3(1.07f), 0x39);
  EXPECT_EQ(FloatToF8E4M3(-1.05f), 0xB8);
  EXPECT_EQ(FloatToF8E4M3(1000.0f), 0x7E);  // 448
  EXPECT_EQ(FloatToF8E4M3(-1e30f), 0xFE);
  EXPECT_EQ(FloatToF8E4M3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: even 0
  EXPECT_EQ(FloatToF8E4M3(std::ldexp(1.5f, -10)), 0x01);
  EXPECT_EQ(FloatToF8E4M3(std::nanf("")) & 0x7F, 0x7F);
  EXPECT_EQ(FloatToF8E4M3(463.9f), 0x7E);         // below the 448 / 512 midpoint
  EXPECT_EQ(FloatToF8E4M3(0.0146484375f), 0x08);  // 7.5 * 2^-9: halfway 7 / 8, even 8 = 2^-6
  // Every value between two neighbouring codes goes to the nearer one.
  for (int b = 0; b < 0x7E; ++b) {
    const float lo = F8E4M3ToFloat(static_cast<uint8_t>(b));
    const float hi = F8E4M3ToFloat(static_cast<uint8_t>(b + 1));
    EXPECT_EQ(FloatToF8E4M3(lo + (hi - lo) * 0.25f), b) << "code " << b;
    EXPECT_EQ(FloatToF8E4M3(lo + (hi - lo) * 0.75f), b + 1) << "code " << b;
    EXPECT_EQ(FloatToF8E4M3(-(lo + (hi - lo) * 0.75f)), 0x80 | (b + 1)) << "code " << b;
  }
}

TEST(DtypeConversionTest, ConvertBuffersAndRejectIntegers) {
  uint8_t f8[3] = {0x38, 0x40, 0xC0};  // 1, 2, -2
  float out[3];
  ASSERT_TRUE(ConvertToFloat32(DType::kF8E4M3, f8, 3, out).ok());
  EXPECT_EQ(out[1], 2.0f);
  EXPECT_EQ(out[2], -2.0f);
  EXPECT_FALSE(ConvertToFloat32(DType::kI32, f8, 0, out).ok());
  EXPECT_FALSE(ParseDType("Q4").ok());
  EXPECT_EQ(*ParseDType("F8_E4M3"), DType::kF8E4M3);
}

}  // namespace
}  // namespace deepinfer
