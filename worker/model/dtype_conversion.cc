// Bit-exact conversions of the checkpoint float formats to fp32.
#include "worker/model/dtype_conversion.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace deepinfer {

absl::StatusOr<DType> ParseDType(absl::string_view n) {
  if (n == "F64") return DType::kF64;
  if (n == "F32") return DType::kF32;
  if (n == "F16") return DType::kF16;
  if (n == "BF16") return DType::kBF16;
  if (n == "F8_E4M3") return DType::kF8E4M3;
  if (n == "F8_E5M2") return DType::kF8E5M2;
  if (n == "I64") return DType::kI64;
  if (n == "I32") return DType::kI32;
  if (n == "I16") return DType::kI16;
  if (n == "I8") return DType::kI8;
  if (n == "U8") return DType::kU8;
  if (n == "BOOL") return DType::kBool;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", n, "'"));
}

size_t DTypeSize(DType d) {
  switch (d) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    default:
      return 1;
  }
}

const char* DTypeName(DType d) {
  switch (d) {
    case DType::kF64:
      return "F64";
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kF8E5M2:
      return "F8_E5M2";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kI16:
      return "I16";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
    case DType::kBool:
      return "BOOL";
  }
  return "?";
}

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
    default:
      return absl::UnimplementedError(
          absl::StrCat("cannot convert dtype ", DTypeName(dtype), " to float32"));
  }
}

}  // namespace deepinfer
