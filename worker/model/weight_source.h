// WeightSource: where model weights come from, by checkpoint tensor name. The model loader
// asks for each tensor it hosts with the (dequantised) shape it expects and receives fp32
// values, whatever the storage (safetensors F32/BF16/F16, FP8 with float32 or UE8M0 block
// scales, MXFP4 with E8M0 scales, or generated dummy values); Storage says which storage a name
// has without reading its values (weight_storage.h). docs/model.md, "Storage formats".
#ifndef DEEPINFER_WORKER_MODEL_WEIGHT_SOURCE_H_
#define DEEPINFER_WORKER_MODEL_WEIGHT_SOURCE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "worker/backend/dummy_fill.h"
#include "worker/model/weight_storage.h"

namespace deepinfer {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Fills out (num_elements(shape) floats). NOT_FOUND if the tensor is absent,
  // INVALID_ARGUMENT if its shape differs; messages name the tensor and the file.
  virtual absl::Status ReadFloat32(const std::string& name, const std::vector<int64_t>& shape,
                                   float* out) = 0;
  virtual bool Contains(const std::string& name) const = 0;
  // How `name` is stored, from the checkpoint's headers. NOT_FOUND if absent; INVALID_ARGUMENT
  // (naming the tensor) for a storage ReadFloat32 would refuse: a dtype no weight can have, a
  // quantised weight without its scale, a scale grid that does not fit the weight. Sources
  // without files (the dummy format) answer kGenerated with an empty shape.
  virtual absl::StatusOr<WeightStorage> Storage(const std::string& name) {
    if (!Contains(name)) {
      return absl::NotFoundError(absl::StrCat(description(), ": tensor '", name, "' is missing"));
    }
    WeightStorage s;
    s.kind = WeightStorageKind::kGenerated;
    return s;
  }
  // Integer tables (DeepSeek-V4's hash router `gate.tid2eid`: the experts of each token id):
  // num_elements(shape) int32 values, each checked to lie in [0, bound). NOT_FOUND as
  // ReadFloat32; INVALID_ARGUMENT naming the tensor for a shape that differs, a dtype that is
  // not an integer, or a value out of range (naming the element). Sources without integer
  // tensors: UNIMPLEMENTED.
  virtual absl::Status ReadIndices(const std::string& name, const std::vector<int64_t>& shape,
                                   int64_t bound, int32_t* out) {
    return absl::UnimplementedError(
        absl::StrCat(description(), ": cannot read integer tensor '", name, "'"));
  }
  // Generated weights: the recipe of `name`'s values (ReadFloat32 would return exactly
  // DummyFillValue(fill, i) for element i), so the loader can have the backend make them in
  // place (Backend::FillDummy). nullopt (the default): read them.
  virtual std::optional<DummyFill> DummyFillFor(const std::string& name,
                                                const std::vector<int64_t>& shape) const {
    return std::nullopt;
  }
  // A 2-D tensor stored as FP8 e4m3 in 128 x 128 blocks, as stored: data [rows, cols] bytes,
  // scales [ceil(rows / 128), ceil(cols / 128)] row-major as float multipliers (a float32
  // `_scale_inv` as is; UE8M0 scales, F8_E8M0 or U8 bytes b, as 2^(b - 127), exactly). nullopt
  // where `name` is stored otherwise (F8_E5M2, other blocks, MXFP4, unquantised; the default:
  // such sources only dequantise, through ReadFloat32). Errors as ReadFloat32's.
  // StoresFp8: whether ReadFp8(name, ...) returns a tensor (from the headers alone, for memory
  // planning before anything is read). False by default and for absent tensors.
  virtual bool StoresFp8(const std::string& name) { return false; }
  struct Fp8Tensor {
    std::vector<uint8_t> data;
    std::vector<float> scales;
  };
  virtual absl::StatusOr<std::optional<Fp8Tensor>> ReadFp8(const std::string& name,
                                                           const std::vector<int64_t>& shape) {
    return std::nullopt;
  }
  // A matrix, or a batch of them (fused experts [E, rows, cols]), stored as MXFP4 with UE8M0
  // byte scales (F8_E8M0 or U8), as stored: packed e2m1 [..., rows, cols / 2] (low nibble the
  // even column) and scales [..., rows, cols / 32], cols a multiple of 32 (the device layout of
  // kernels/gemm/mxfp4_mma_gemm.h, so the bytes are kept as they are). nullopt where `name` is
  // stored otherwise (the default: such sources only dequantise, through ReadFloat32). Errors as
  // ReadFloat32's (a scale byte 0xFF, the E8M0 NaN, included). StoresMxfp4: whether
  // ReadMxfp4(name, ...) returns a tensor, from the headers alone; false for absent tensors.
  virtual bool StoresMxfp4(const std::string& name) { return false; }
  struct Mxfp4Tensor {
    std::vector<uint8_t> packed;
    std::vector<uint8_t> scales;
  };
  virtual absl::StatusOr<std::optional<Mxfp4Tensor>> ReadMxfp4(const std::string& name,
                                                               const std::vector<int64_t>& shape) {
    return std::nullopt;
  }
  // The file `name` is read from (its shard of a sharded checkpoint), so that loading can spread
  // the reads over the files; empty where there are no files.
  virtual std::string ShardOf(const std::string& name) const { return ""; }
  // For messages: the checkpoint directory, or "dummy(seed=...)".
  virtual std::string description() const = 0;
};

// `name` dequantised to fp32 as a vector of num_elements(shape) values (ReadFloat32's errors).
inline absl::StatusOr<std::vector<float>> ReadDequantized(WeightSource* source,
                                                          const std::string& name,
                                                          const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> values(static_cast<size_t>(n));
  absl::Status st = source->ReadFloat32(name, shape, values.data());
  if (!st.ok()) return st;
  return values;
}

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_WEIGHT_SOURCE_H_
