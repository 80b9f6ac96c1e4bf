// Tests for the checkpoint float formats, against hand-decoded bit patterns.
#include "worker/model/dtype_conversion.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

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

// F8_E5M2 (OFP8: bias 15, 2 mantissa bits, IEEE infinities and NaN).
TEST(DtypeConversionTest, F8E5M2) {
  EXPECT_EQ(F8E5M2ToFloat(0x3C), 1.0f);                   // 0 01111 00
  EXPECT_EQ(F8E5M2ToFloat(0x3E), 1.5f);                   // 0 01111 10
  EXPECT_EQ(F8E5M2ToFloat(0xC0), -2.0f);                  // 1 10000 00
  EXPECT_EQ(F8E5M2ToFloat(0x7B), 57344.0f);               // largest finite: 1.75 * 2^15
  EXPECT_EQ(F8E5M2ToFloat(0x01), std::ldexp(1.0f, -16));  // smallest subnormal
  EXPECT_EQ(F8E5M2ToFloat(0x04), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_TRUE(std::isinf(F8E5M2ToFloat(0x7C)));
  EXPECT_LT(F8E5M2ToFloat(0xFC), 0.0f);
  EXPECT_TRUE(std::isnan(F8E5M2ToFloat(0x7D)));
}

// OCP MX v1.0 section 5.4.1: E8M0 is an unsigned exponent with bias 127, 0xFF is NaN, there is
// no zero; its range is 2^-127 .. 2^127.
TEST(DtypeConversionTest, E8M0) {
  EXPECT_EQ(E8M0ToFloat(127), 1.0f);
  EXPECT_EQ(E8M0ToFloat(128), 2.0f);
  EXPECT_EQ(E8M0ToFloat(126), 0.5f);
  EXPECT_EQ(E8M0ToFloat(0), 5.877471754111438e-39f);    // 2^-127, a float subnormal
  EXPECT_EQ(E8M0ToFloat(254), 1.7014118346046923e38f);  // 2^127
  EXPECT_TRUE(std::isnan(E8M0ToFloat(0xFF)));
}

// OCP MX v1.0 section 5.3.3 (FP4 E2M1): exponent bias 1, one mantissa bit, no infinity or NaN;
// the eight magnitudes are 0, 0.5, 1, 1.5, 2, 3, 4, 6.
TEST(DtypeConversionTest, E2M1AllSixteenCodes) {
  const float want[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  for (uint8_t code = 0; code < 16; ++code) {
    EXPECT_EQ(E2M1ToFloat(code), want[code]) << int(code);
    EXPECT_EQ(std::signbit(E2M1ToFloat(code)), code >= 8) << int(code);  // 0x8 is -0
  }
}

TEST(DtypeConversionTest, F4PacksLowNibbleFirst) {
  const uint8_t packed[2] = {0x72, 0x9F};  // low 0x2 = 1, high 0x7 = 6; low 0xF = -6, high 0x9
  float out[4];
  ASSERT_TRUE(ConvertToFloat32(DType::kF4, packed, 4, out).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 6.0f);
  EXPECT_EQ(out[2], -6.0f);
  EXPECT_EQ(out[3], -0.5f);
  EXPECT_EQ(ConvertToFloat32(DType::kF4, packed, 3, out).code(), absl::StatusCode::kUnimplemented);
}

// Every dtype of the safetensors format parses, with its width; names round-trip.
TEST(DtypeConversionTest, SafetensorsDtypeList) {
  const struct {
    const char* name;
    int bits;
  } kList[] = {{"BOOL", 8}, {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"U8", 8},
               {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"I16", 16},
               {"U16", 16}, {"F16", 16},    {"BF16", 16},   {"I32", 32},    {"U32", 32},
               {"F32", 32}, {"C64", 64},    {"F64", 64},    {"I64", 64},    {"U64", 64}};
  for (const auto& d : kList) {
    absl::StatusOr<DType> t = ParseDType(d.name);
    ASSERT_TRUE(t.ok()) << d.name;
    EXPECT_EQ(DTypeBits(*t), d.bits) << d.name;
    EXPECT_STREQ(DTypeName(*t), d.name);
  }
  EXPECT_EQ(DTypeStorageBytes(DType::kF4, 6), 3);
  EXPECT_EQ(DTypeStorageBytes(DType::kF4, 5), -1);
  EXPECT_EQ(DTypeStorageBytes(DType::kF6E2M3, 4), 3);
  EXPECT_EQ(DTypeStorageBytes(DType::kU16, 3), 6);
}

// Types no float weight is stored as are refused with a message naming the type.
TEST(DtypeConversionTest, RefusesTypesNoWeightHas) {
  const uint8_t bytes[16] = {};
  float out[4];
  for (DType d : {DType::kU8, DType::kI8, DType::kI16, DType::kU16, DType::kI32, DType::kU32,
                  DType::kI64, DType::kU64, DType::kBool, DType::kC64}) {
    absl::Status st = ConvertToFloat32(d, bytes, 2, out);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << DTypeName(d);
    EXPECT_NE(st.message().find(DTypeName(d)), std::string::npos) << st;
  }
  for (DType d : {DType::kF6E2M3, DType::kF6E3M2}) {
    absl::Status st = ConvertToFloat32(d, bytes, 4, out);
    EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << DTypeName(d);
    EXPECT_NE(st.message().find(DTypeName(d)), std::string::npos) << st;
  }
  const uint8_t e8m0[2] = {127, 130};
  ASSERT_TRUE(ConvertToFloat32(DType::kF8E8M0, e8m0, 2, out).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 8.0f);
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

// The batch form against the scalar one: every 7th float of magnitude in [2^-12, 2^10) (e4m3's
// subnormal and normal rounding and its saturation), every rounding boundary exactly and one
// step either side, both signs, divided by 1; a sample of all bit patterns (zeros, infinities
// and NaN included) divided by 1 and by other divisors.
TEST(DtypeConversionTest, FloatsToF8E4M3AsTheScalarConversion) {
  size_t wrong = 0;
  auto check = [&wrong](const std::vector<float>& x, float divisor) {
    std::vector<uint8_t> got(x.size());
    FloatsToF8E4M3(x.data(), static_cast<int64_t>(x.size()), divisor, got.data());
    for (size_t i = 0; i < x.size(); ++i) {
      const uint8_t want = FloatToF8E4M3(x[i] / divisor);
      if (got[i] != want && ++wrong <= 5) {
        ADD_FAILURE() << "x = " << x[i] << " / " << divisor << ": got " << int{got[i]} << ", want "
                      << int{want};
      }
    }
  };
  auto from_bits = [](uint64_t u) {
    const uint32_t b = static_cast<uint32_t>(u);
    float f;
    std::memcpy(&f, &b, sizeof(f));
    return f;
  };
  std::vector<float> x;
  auto flush = [&](float divisor) {
    check(x, divisor);
    x.clear();
  };
  // Every 7th bit pattern of [2^-12, 2^10) and of its negatives.
  for (uint64_t u = 0x39800000u; u < 0x44800000u; u += 7) {
    x.push_back(from_bits(u));
    x.push_back(from_bits(u | 0x80000000u));
    if (x.size() >= (1u << 20)) flush(1.0f);
  }
  // The rounding boundaries exactly and one step either side: normals' halfway points (the 20
  // dropped mantissa bits 0x80000) for every exponent and kept mantissa, subnormals' (k + 1/2)
  // * 2^-9, the saturation point 464 and the e4m3 values themselves.
  auto around = [&](float f) {
    uint32_t b;
    std::memcpy(&b, &f, sizeof(b));
    for (uint32_t d : {b - 1, b, b + 1}) {
      x.push_back(from_bits(d));
      x.push_back(-from_bits(d));
    }
  };
  for (uint64_t e = 0x73; e <= 0x89; ++e) {
    for (uint64_t m = 0; m < 8; ++m) {
      around(from_bits((e << 23) | (m << 20) | 0x80000u));
      around(from_bits((e << 23) | (m << 20)));
    }
  }
  for (int k = 0; k < 8; ++k) around(std::ldexp(k + 0.5f, -9));
  around(464.0f);
  for (int code = 1; code < 0x7F; ++code) around(F8E4M3ToFloat(static_cast<uint8_t>(code)));
  flush(1.0f);
  for (uint64_t u = 0; u <= 0xFFFFFFFFu; u += 65521) x.push_back(from_bits(u));
  for (float special : {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity(), std::nanf("")}) {
    x.push_back(special);
  }
  for (float divisor : {1.0f, 0.0078125f, 3.0f, 1.7e-3f}) check(x, divisor);
  EXPECT_EQ(wrong, 0u);
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
