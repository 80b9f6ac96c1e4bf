#include "worker/model/mxfp4_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace deepinfer {

uint8_t FloatToE2M1(float f) {
  if (std::isnan(f)) return 0;
  const uint8_t sign = std::signbit(f) ? 8 : 0;
  const float m = std::fabs(f);
  // Codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6: count the midpoints below m; at a midpoint the
  // even code wins (> where the lower neighbour's code is even, >= where the upper one's is).
  const int code = (m > 0.25f) + (m >= 0.75f) + (m > 1.25f) + (m >= 1.75f) + (m > 2.5f) +
                   (m >= 3.5f) + (m > 5.0f);
  return static_cast<uint8_t>(sign | code);
}

uint8_t Mxfp4ScaleByte(float amax) {
  if (!(amax > 0.0f)) return 0;
  int e = 0;
  std::frexp(amax, &e);  // amax = f * 2^e, f in [0.5, 1): floor(log2(amax)) = e - 1
  const int x = (e - 1) - 2 + 127;
  return static_cast<uint8_t>(x < 0 ? 0 : x > 254 ? 254 : x);
}

namespace {

// FloatToE2M1 for a non-NaN value, inlined where the row loop below can run it as vector code.
inline uint8_t E2M1Code(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  const float m = std::fabs(f);
  const int code = (m > 0.25f) + (m >= 0.75f) + (m > 1.25f) + (m >= 1.75f) + (m > 2.5f) +
                   (m >= 3.5f) + (m > 5.0f);
  return static_cast<uint8_t>(((u >> 28) & 8u) | static_cast<uint32_t>(code));
}

// One row of `blocks` 32-value blocks as QuantizeMxfp4 makes it, on the values as they are; the
// largest magnitude's bit pattern (sign cleared), from which the caller tells whether every
// value was finite (below 0x7F800000). Compiled per instruction set, picked at run time.
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) uint32_t QuantizeRow(
    const float* x, int64_t blocks, uint8_t* packed, uint8_t* scales) {
  uint32_t worst = 0;
  for (int64_t b = 0; b < blocks; ++b, x += kMxfp4Block, packed += kMxfp4Block / 2) {
    uint32_t amax_bits = 0;
    for (int64_t i = 0; i < kMxfp4Block; ++i) {
      uint32_t u;
      std::memcpy(&u, &x[i], sizeof(u));
      amax_bits = std::max(amax_bits, u & 0x7FFFFFFFu);
    }
    worst = std::max(worst, amax_bits);
    if (amax_bits >= 0x7F800000u) continue;  // refused by the caller
    float amax;
    std::memcpy(&amax, &amax_bits, sizeof(amax));
    const uint8_t s = Mxfp4ScaleByte(amax);
    scales[b] = s;
    // x / 2^(s - 127) as x * 2^(127 - s), a normal float for the bytes Mxfp4ScaleByte gives
    // (at most 252): exact (a product that falls to a subnormal is far below 0.25, and rounds
    // to 0 either way).
    const float inv = std::ldexp(1.0f, 127 - static_cast<int>(s));
    for (int64_t i = 0; i < kMxfp4Block / 2; ++i) {
      packed[i] =
          static_cast<uint8_t>(E2M1Code(x[2 * i] * inv) | (E2M1Code(x[2 * i + 1] * inv) << 4));
    }
  }
  return worst;
}

}  // namespace

absl::Status QuantizeMxfp4(const float* v, int64_t rows, int64_t cols, uint8_t* packed,
                           uint8_t* scales, const char* what) {
  if (cols % kMxfp4Block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": MXFP4 needs a multiple of ", kMxfp4Block, " columns, not ", cols));
  }
  const int64_t blocks = cols / kMxfp4Block;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = v + r * cols;
    if (QuantizeRow(x, blocks, packed + r * (cols / 2), scales + r * blocks) < 0x7F800000u) {
      continue;
    }
    for (int64_t c = 0; c < cols; ++c) {
      if (!std::isfinite(x[c])) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": element (", r, ", ", c, ") is ",
                                                       x[c], ", which MXFP4 cannot hold"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace deepinfer
