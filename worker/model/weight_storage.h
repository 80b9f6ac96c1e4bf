// WeightStorage: how a checkpoint stores one named parameter, read from the safetensors header
// alone (nothing is dequantised), so the memory plan and `--dtype` can be decided before
// loading. The kinds a DeepSeek checkpoint uses:
//
//   kFloat     F32 / F64 / F16 / BF16 (or unscaled F8), values as stored.
//   kFp8Block  F8_E4M3 (or F8_E5M2) with one scale per block x block tile (DeepSeek: 128 x 128),
//              scales float32 (any value; UE8M0 checkpoints store powers of two) or
//              F8_E8M0 / U8 exponent bytes, 2^(b - 127).
//   kMxfp4     OCP Microscaling FP4: E2M1 values two a byte (low nibble = even input column),
//              stored as U8 / I8 [out, in / 2] (or F4 [out, in]), with one E8M0 scale per 32
//              values along the input dimension, [out, ceil(in / 32)].
//   kGenerated the dummy load format: values made from a seed, no storage.
//
// Leading dimensions of a weight (fused experts [E, out, in]) batch the last two; its scale
// carries the same leading dimensions.
#ifndef DEEPINFER_WORKER_MODEL_WEIGHT_STORAGE_H_
#define DEEPINFER_WORKER_MODEL_WEIGHT_STORAGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "worker/model/dtype_conversion.h"

namespace deepinfer {

enum class WeightStorageKind { kFloat, kFp8Block, kMxfp4, kGenerated };

// "float", "fp8_block", "mxfp4", "generated".
const char* WeightStorageKindName(WeightStorageKind kind);

struct WeightStorage {
  WeightStorageKind kind = WeightStorageKind::kFloat;
  DType dtype = DType::kF32;          // the weight tensor's element type as stored
  std::vector<int64_t> shape;         // the dequantised (logical) shape: MXFP4 [out, in]
  std::vector<int64_t> stored_shape;  // as in the file: packed MXFP4 [out, in / 2]
  int64_t stored_bytes = 0;

  // Block-scaled kinds only.
  std::string scale_name;
  DType scale_dtype = DType::kF32;
  std::vector<int64_t> scale_shape;
  int64_t scale_bytes = 0;
  int64_t block_rows = 0, block_cols = 0;  // elements one scale covers: 128 x 128, 1 x 32

  bool scaled() const { return !scale_name.empty(); }
  // "mxfp4 U8 [8,64] -> [8,128], scale 'x.weight_scale' F8_E8M0 [8,4] per 1x32"
  std::string ToString() const;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_WEIGHT_STORAGE_H_
