#include "worker/model/mxfp4_quantize.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace deepinfer {
namespace {

// E2M1 magnitudes by code: the midpoints between neighbours decide the rounding.
constexpr float kMagnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

}  // namespace

uint8_t FloatToE2M1(float f) {
  if (std::isnan(f)) return 0;
  const uint8_t sign = std::signbit(f) ? 8 : 0;
  const float m = std::fabs(f);
  uint8_t code = 7;
  for (uint8_t c = 0; c < 7; ++c) {
    const float mid = 0.5f * (kMagnitudes[c] + kMagnitudes[c + 1]);  // exact in fp32
    if (m < mid || (m == mid && c % 2 == 0)) {
      code = c;
      break;
    }
  }
  return sign | code;
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
      const int shift = 127 - static_cast<int>(s);  // x / 2^(s - 127), exact
      uint8_t* out = packed + r * (cols / 2) + b * (kMxfp4Block / 2);
      for (int64_t i = 0; i < kMxfp4Block; i += 2) {
        const uint8_t lo = FloatToE2M1(std::ldexp(x[i], shift));
        const uint8_t hi = FloatToE2M1(std::ldexp(x[i + 1], shift));
        out[i / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace deepinfer
