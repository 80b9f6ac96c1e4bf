// Element types found in safetensors checkpoints (the format's full list) and their conversion
// to fp32 (the CPU backend's compute type). F8_E4M3 is the "fn" variant DeepSeek uses (no
// infinities, max 448); F8_E5M2 is IEEE-like (infinities, NaN); F8_E8M0 is the unsigned
// power-of-two scale of the OCP Microscaling (MX) formats, 2^(bits - 127), 0xFF = NaN; F4 is MX
// E2M1, two values a byte, the even element in the low nibble.
#ifndef DEEPINFER_WORKER_MODEL_DTYPE_CONVERSION_H_
#define DEEPINFER_WORKER_MODEL_DTYPE_CONVERSION_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deepinfer {

enum class DType {
  kF64,
  kF32,
  kF16,
  kBF16,
  kF8E4M3,
  kF8E5M2,
  kF8E8M0,
  kF6E2M3,
  kF6E3M2,
  kF4,
  kC64,
  kI64,
  kI32,
  kI16,
  kI8,
  kU64,
  kU32,
  kU16,
  kU8,
  kBool,
};

// From a safetensors dtype string ("F32", "BF16", "F8_E4M3", "F8_E8M0", "F4", ...).
absl::StatusOr<DType> ParseDType(absl::string_view name);
// Bits of one element (F4: 4, F6_*: 6, BOOL: 8).
int DTypeBits(DType dtype);
// Bytes of n elements; -1 when they do not fill whole bytes (an odd count of F4 values).
int64_t DTypeStorageBytes(DType dtype, int64_t n);
const char* DTypeName(DType dtype);

float Bf16ToFloat(uint16_t bits);
float F16ToFloat(uint16_t bits);
float F8E4M3ToFloat(uint8_t bits);
float F8E5M2ToFloat(uint8_t bits);
// 2^(bits - 127); NaN for 0xFF.
float E8M0ToFloat(uint8_t bits);
// The low four bits as MX E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit.
float E2M1ToFloat(uint8_t nibble);
// The e4m3fn code nearest to f (ties to the even code), saturated to +-448; NaN gives NaN. For
// making FP8 weights (the benchmark's dummy FP8 model); checkpoints are read, never written, FP8.
uint8_t FloatToF8E4M3(float f);
// out[i] = FloatToF8E4M3(x[i] / divisor) for i < n, bit for bit, in vectorisable branch-free
// form (the benchmark's dummy FP8 models quantise billions of values at load).
void FloatsToF8E4M3(const float* x, int64_t n, float divisor, uint8_t* out);

// Converts n elements (F4: n values from n / 2 bytes). INVALID_ARGUMENT for the types a float
// weight cannot be stored as on its own (integers, BOOL, C64: an integer tensor is a weight only
// as packed MXFP4, which SafetensorsCheckpoint decodes with its scale), UNIMPLEMENTED for the
// packed six-bit types and for an odd count of F4 values.
absl::Status ConvertToFloat32(DType dtype, const void* src, int64_t n, float* dst);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_DTYPE_CONVERSION_H_
