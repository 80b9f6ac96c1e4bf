#include "worker/model/mxfp4_quantize.h"

#include <cmath>

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

absl::Status QuantizeMxfp4(const float* v, int64_t rows, int64_t cols, uint8_t* packed,
                           uint8_t* scales, const char* what) {
  if (cols % kMxfp4Block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": MXFP4 needs a multiple of ", kMxfp4Block, " columns, not ", cols));
  }
  const int64_t blocks = cols / kMxfp4Block;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* x = v + r * cols + b * kMxfp4Block;
      float amax = 0.0f;
      for (int64_t i = 0; i < kMxfp4Block; ++i) {
        if (!std::isfinite(x[i])) {
          return absl::InvalidArgumentError(absl::StrCat(what, ": element (", r, ", ",
                                                         b * kMxfp4Block + i, ") is ", x[i],
                                                         ", which MXFP4 cannot hold"));
        }
        amax = std::fmax(amax, std::fabs(x[i]));
      }
      const uint8_t s = Mxfp4ScaleByte(amax);
      scales[r * blocks + b] = s;
      // x / 2^(s - 127) as x * 2^(127 - s), a normal float for the bytes Mxfp4ScaleByte gives
      // (at most 252): exact (a product that falls to a subnormal is far below 0.25, and rounds
      // to 0 either way).
      const float inv = std::ldexp(1.0f, 127 - static_cast<int>(s));
      uint8_t* out = packed + r * (cols / 2) + b * (kMxfp4Block / 2);
      for (int64_t i = 0; i < kMxfp4Block; i += 2) {
        const uint8_t lo = FloatToE2M1(x[i] * inv);
        const uint8_t hi = FloatToE2M1(x[i + 1] * inv);
        out[i / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace deepinfer
