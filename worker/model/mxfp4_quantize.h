// MXFP4 quantisation (OCP Microscaling Formats v1.0, FP4 E2M1 with an E8M0 scale per 32 values)
// of fp32 matrices on the host: the routed experts of a bf16 / FP8 model kept in MXFP4 on the GPU
// (`--dtype mxfp4`), in the layout of kernels/gemm/mxfp4_mma_gemm.h, which is how DeepSeek-V4
// checkpoints store them. Scale choice as the spec's conversion: the block's largest magnitude
// amax gives the shared exponent floor(log2(amax)) - 2 (2 is E2M1's largest exponent), so amax
// lands in [4, 8) and rounds to 4 or 6 or saturates to 6; values are divided by the scale and
// rounded to the nearest E2M1 value, ties to the even code, magnitudes above 6 saturating to 6.
#ifndef DEEPINFER_WORKER_MODEL_MXFP4_QUANTIZE_H_
#define DEEPINFER_WORKER_MODEL_MXFP4_QUANTIZE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace deepinfer {

inline constexpr int64_t kMxfp4Block = 32;  // values per scale, along a row

// Device bytes of an MXFP4 matrix of `elements` values: half a byte each and a UE8M0 byte per 32.
inline constexpr int64_t Mxfp4Bytes(int64_t elements) {
  return elements / 2 + elements / kMxfp4Block;
}

// The E2M1 code (sign in bit 3) nearest to f, ties to the even code, saturated to +-6. NaN: 0.
uint8_t FloatToE2M1(float f);

// The UE8M0 byte of a block whose largest magnitude is amax (finite): floor(log2(amax)) - 2 + 127
// clamped to [0, 254]; 0 for amax 0 (any scale gives zeros).
uint8_t Mxfp4ScaleByte(float amax);

// v [rows, cols] row-major (cols a multiple of 32) to packed [rows, cols / 2] (element p of a row
// in the low nibble of byte p / 2 for even p, the high nibble for odd p) and scales
// [rows, cols / 32]. INVALID_ARGUMENT (naming `what` and the element) for cols not a multiple of
// 32 or a non-finite value.
absl::Status QuantizeMxfp4(const float* v, int64_t rows, int64_t cols, uint8_t* packed,
                           uint8_t* scales, const char* what);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_MXFP4_QUANTIZE_H_
