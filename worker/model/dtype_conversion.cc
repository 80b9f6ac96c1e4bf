// Bit-exact conversions of the checkpoint float formats to fp32.
#include "worker/model/dtype_conversion.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace deepinfer {

namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  int bits;
};

// The safetensors format's dtypes (safetensors' Dtype enum), with their element widths.
constexpr DTypeInfo kDTypes[] = {
    {DType::kF64, "F64", 64},       {DType::kF32, "F32", 32},       {DType::kF16, "F16", 16},
    {DType::kBF16, "BF16", 16},     {DType::kF8E4M3, "F8_E4M3", 8}, {DType::kF8E5M2, "F8_E5M2", 8},
    {DType::kF8E8M0, "F8_E8M0", 8}, {DType::kF6E2M3, "F6_E2M3", 6}, {DType::kF6E3M2, "F6_E3M2", 6},
    {DType::kF4, "F4", 4},          {DType::kC64, "C64", 64},       {DType::kI64, "I64", 64},
    {DType::kI32, "I32", 32},       {DType::kI16, "I16", 16},       {DType::kI8, "I8", 8},
    {DType::kU64, "U64", 64},       {DType::kU32, "U32", 32},       {DType::kU16, "U16", 16},
    {DType::kU8, "U8", 8},          {DType::kBool, "BOOL", 8},
};

const DTypeInfo& Info(DType d) {
  for (const DTypeInfo& i : kDTypes) {
    if (i.dtype == d) return i;
  }
  return kDTypes[0];  // unreachable: every enumerator is listed
}

}  // namespace

absl::StatusOr<DType> ParseDType(absl::string_view n) {
  for (const DTypeInfo& i : kDTypes) {
    if (n == i.name) return i.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", n, "'"));
}

int DTypeBits(DType d) { return Info(d).bits; }

int64_t DTypeStorageBytes(DType d, int64_t n) {
  const int64_t bits = n * DTypeBits(d);
  return bits % 8 == 0 ? bits / 8 : -1;
}

const char* DTypeName(DType d) { return Info(d).name; }

float Bf16ToFloat(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float F16ToFloat(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);  // subnormal (or zero)
  } else if (exp == 31) {
    v = mant ? std::nanf("") : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

float F8E4M3ToFloat(uint8_t b) {
  const uint32_t sign = b >> 7, exp = (b >> 3) & 0xf, mant = b & 7;
  float v;
  if (exp == 15 && mant == 7) {
    v = std::nanf("");  // e4m3fn has NaN but no infinity
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant/8 * 2^-6
  } else {
    v = std::ldexp(static_cast<float>(mant | 8), static_cast<int>(exp) - 10);
  }
  return sign ? -v : v;
}

float F8E5M2ToFloat(uint8_t b) {
  const uint32_t sign = b >> 7, exp = (b >> 2) & 0x1f, mant = b & 3;
  float v;
  if (exp == 31) {
    v = mant ? std::nanf("") : INFINITY;
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -16);  // subnormal: mant/4 * 2^-14
  } else {
    v = std::ldexp(static_cast<float>(mant | 4), static_cast<int>(exp) - 17);
  }
  return sign ? -v : v;
}

float E8M0ToFloat(uint8_t b) {
  if (b == 0xFF) return std::nanf("");
  return std::ldexp(1.0f, static_cast<int>(b) - 127);  // 2^-127 is a float subnormal, exact
}

float E2M1ToFloat(uint8_t nibble) {
  const uint32_t sign = (nibble >> 3) & 1, exp = (nibble >> 1) & 3, mant = nibble & 1;
  // exp 0: subnormal mant * 0.5; else (1 + mant / 2) * 2^(exp - 1).
  const float v = exp == 0 ? 0.5f * static_cast<float>(mant)
                           : std::ldexp(static_cast<float>(mant | 2), static_cast<int>(exp) - 2);
  return sign ? -v : v;
}

uint8_t FloatToF8E4M3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isnan(f)) return sign | 0x7F;
  const float a = std::fabs(f);
  // Codes 0x00 .. 0x7E are the finite non-negative values in increasing order, so a rounding
  // carry out of the mantissa moves to the next exponent by itself.
  uint32_t code;
  if (a < 0.015625f) {  // below 2^-6: subnormals, steps of 2^-9 (code 8 is 2^-6)
    code = static_cast<uint32_t>(std::nearbyint(a * 512.0f));  // exact scaling; ties to even
  } else if (a >= 464.0f) {  // halfway between 448 and 512 (no 480: 0x7F is NaN) and above
    code = 0x7E;
  } else {
    uint32_t u;
    std::memcpy(&u, &a, sizeof(u));
    const int32_t exponent = static_cast<int32_t>(u >> 23) - 127;  // -6 .. 8
    const uint32_t mantissa = u & 0x7FFFFFu;
    code = (static_cast<uint32_t>(exponent + 7) << 3) | (mantissa >> 20);
    const uint32_t rest = mantissa & 0xFFFFFu, half = 0x80000u;
    if (rest > half || (rest == half && (code & 1u) != 0)) ++code;
    code = std::min<uint32_t>(code, 0x7E);
  }
  return sign | static_cast<uint8_t>(code);
}

// FloatToF8E4M3 without branches, so the loop below runs as vector code: both of its roundings
// computed and one selected. Subnormals (below 2^-6): a * 512 is exact and below 8, and adding
// then subtracting 2^23 rounds it to the nearest integer, ties to even. Normals: the 20 mantissa
// bits that e4m3 drops are rounded to nearest even by adding 0x7FFFF plus the kept lowest bit;
// a carry moves into the exponent as it should, and the code is the exponent and three mantissa
// bits less the bias difference ((127 - 7) << 3).
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void FloatsToF8E4M3(
    const float* x, int64_t n, float divisor, uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float f = x[i] / divisor;
    uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    const uint32_t abs_bits = u & 0x7FFFFFFFu;
    float a;
    std::memcpy(&a, &abs_bits, sizeof(a));
    const float small = a < 0.015625f ? a : 0.015625f;  // NaN too: the code is chosen below
    const uint32_t sub = static_cast<uint32_t>((small * 512.0f + 8388608.0f) - 8388608.0f);
    const uint32_t rounded = abs_bits + 0x7FFFFu + ((abs_bits >> 20) & 1u);
    const uint32_t normal = std::min<uint32_t>((rounded >> 20) - (120u << 3), 0x7Eu);
    uint32_t code = a < 0.015625f ? sub : a >= 464.0f ? 0x7Eu : normal;
    code = abs_bits > 0x7F800000u ? 0x7Fu : code;  // NaN
    out[i] = static_cast<uint8_t>(((u >> 24) & 0x80u) | code);
  }
}

absl::Status ConvertToFloat32(DType dtype, const void* src, int64_t n, float* dst) {
  const uint8_t* p = static_cast<const uint8_t*>(src);
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, p, n * sizeof(float));
      return absl::OkStatus();
    case DType::kF64:
      for (int64_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, p + 8 * i, 8);
        dst[i] = static_cast<float>(d);
      }
      return absl::OkStatus();
    case DType::kBF16:
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = dtype == DType::kBF16 ? Bf16ToFloat(h) : F16ToFloat(h);
      }
      return absl::OkStatus();
    case DType::kF8E4M3:
      for (int64_t i = 0; i < n; ++i) dst[i] = F8E4M3ToFloat(p[i]);
      return absl::OkStatus();
    case DType::kF8E5M2:
      for (int64_t i = 0; i < n; ++i) dst[i] = F8E5M2ToFloat(p[i]);
      return absl::OkStatus();
    case DType::kF8E8M0:
      for (int64_t i = 0; i < n; ++i) dst[i] = E8M0ToFloat(p[i]);
      return absl::OkStatus();
    case DType::kF4:
      if (n % 2 != 0) {
        return absl::UnimplementedError(
            absl::StrCat("an odd number (", n, ") of F4 values does not fill whole bytes"));
      }
      for (int64_t i = 0; i < n / 2; ++i) {
        dst[2 * i] = E2M1ToFloat(p[i] & 0xF);
        dst[2 * i + 1] = E2M1ToFloat(p[i] >> 4);
      }
      return absl::OkStatus();
    case DType::kF6E2M3:
    case DType::kF6E3M2:
      return absl::UnimplementedError(
          absl::StrCat("dtype ", DTypeName(dtype), " (packed six-bit MX floats) is not supported"));
    case DType::kC64:
    case DType::kI64:
    case DType::kI32:
    case DType::kI16:
    case DType::kI8:
    case DType::kU64:
    case DType::kU32:
    case DType::kU16:
    case DType::kU8:
    case DType::kBool:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "dtype ", DTypeName(dtype),
      " cannot hold a float weight (an 8-bit integer tensor is a weight only as packed MXFP4 "
      "with a scale tensor)"));
}

}  // namespace deepinfer
