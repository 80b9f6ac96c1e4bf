// Host quantisation of FP8 latent cache entries (the CPU backend's cache and the reference of
// the CUDA cache-write kernel).
#include "worker/backend/fp8_latent_entry.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "worker/backend/bf16.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {

float Fp8LatentScale(float amax) { return std::max(amax / kFp8E4M3Max, FLT_MIN); }

void QuantizeFp8LatentEntry(const float* latent, int64_t latent_dim, const float* rope_key,
                            int64_t rope_dim, uint8_t* dst) {
  const Fp8LatentEntryLayout layout = Fp8LatentLayout(latent_dim, rope_dim);
  std::memset(dst, 0, static_cast<size_t>(layout.bytes));
  float amax = 0.0f;
  for (int64_t i = 0; i < latent_dim; ++i) amax = std::max(amax, std::fabs(latent[i]));
  const float s = Fp8LatentScale(amax);
  for (int64_t i = 0; i < latent_dim; ++i) dst[i] = FloatToF8E4M3(latent[i] / s);
  for (int64_t i = 0; i < rope_dim; ++i) {
    const uint16_t bits = FloatToBf16Bits(rope_key[i]);
    std::memcpy(dst + layout.rope_offset + 2 * i, &bits, 2);
  }
  std::memcpy(dst + layout.scale_offset, &s, 4);
}

void DequantizeFp8LatentEntry(const uint8_t* src, int64_t latent_dim, int64_t rope_dim,
                              float* out) {
  const Fp8LatentEntryLayout layout = Fp8LatentLayout(latent_dim, rope_dim);
  float s;
  std::memcpy(&s, src + layout.scale_offset, 4);
  for (int64_t i = 0; i < latent_dim; ++i) out[i] = F8E4M3ToFloat(src[i]) * s;
  for (int64_t i = 0; i < rope_dim; ++i) {
    uint16_t bits;
    std::memcpy(&bits, src + layout.rope_offset + 2 * i, 2);
    out[latent_dim + i] = Bf16BitsToFloat(bits);
  }
}

}  // namespace deepinfer
