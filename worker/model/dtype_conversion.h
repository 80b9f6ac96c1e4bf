// Element types found in safetensors checkpoints and their conversion to fp32 (the CPU
// backend's compute type). F8_E4M3 is the "fn" variant DeepSeek uses (no infinities, max 448).
#ifndef DEEPINFER_WORKER_MODEL_DTYPE_CONVERSION_H_
#define DEEPINFER_WORKER_MODEL_DTYPE_CONVERSION_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deepinfer {

enum class DType { kF64, kF32, kF16, kBF16, kF8E4M3, kF8E5M2, kI64, kI32, kI16, kI8, kU8, kBool };

// From a safetensors dtype string ("F32", "BF16", "F8_E4M3", ...).
absl::StatusOr<DType> ParseDType(absl::string_view name);
size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);

float Bf16ToFloat(uint16_t bits);
float F16ToFloat(uint16_t bits);
float F8E4M3ToFloat(uint8_t bits);
// The e4m3fn code nearest to f (ties to the even code), saturated to +-448; NaN gives NaN. For
// making FP8 weights (the benchmark's dummy FP8 model); checkpoints are read, never written, FP8.
uint8_t FloatToF8E4M3(float f);

// Converts n elements; UNIMPLEMENTED for types a model weight cannot be (integers, F8_E5M2).
absl::Status ConvertToFloat32(DType dtype, const void* src, int64_t n, float* dst);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_DTYPE_CONVERSION_H_
