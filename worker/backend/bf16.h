// Host-side bfloat16 helpers: the rounding every backend applies when it stores a weight or
// rounds a GEMM operand to bf16 (round to nearest, ties to even; NaN stays a quiet NaN), so the
// CPU reference and the GPU agree bit for bit on the rounded values.
#ifndef DEEPINFER_WORKER_BACKEND_BF16_H_
#define DEEPINFER_WORKER_BACKEND_BF16_H_

#include <cstdint>
#include <cstring>
#include <vector>

namespace deepinfer {

inline uint16_t FloatToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN: keep the sign, force quiet
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // overflow of the largest finites rounds to infinity, as IEEE
  return static_cast<uint16_t>(u >> 16);
}

inline float Bf16BitsToFloat(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The fp32 value nearest-even rounding to bf16 gives.
inline float RoundToBf16(float f) { return Bf16BitsToFloat(FloatToBf16Bits(f)); }

// FloatToBf16Bits of each value.
inline std::vector<uint16_t> FloatsToBf16Bits(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBf16Bits(v[i]);
  return out;
}

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_BF16_H_
