// WeightSource: where model weights come from, by checkpoint tensor name. The model loader
// asks for each tensor it hosts with the shape it expects and receives fp32 values, whatever
// the storage (safetensors F32/BF16/F16/FP8 with block scales, or generated dummy values).
#ifndef DEEPINFER_WORKER_MODEL_WEIGHT_SOURCE_H_
#define DEEPINFER_WORKER_MODEL_WEIGHT_SOURCE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/backend/dummy_fill.h"

namespace deepinfer {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Fills out (num_elements(shape) floats). NOT_FOUND if the tensor is absent,
  // INVALID_ARGUMENT if its shape differs; messages name the tensor and the file.
  virtual absl::Status ReadFloat32(const std::string& name, const std::vector<int64_t>& shape,
                                   float* out) = 0;
  virtual bool Contains(const std::string& name) const = 0;
  // Generated weights: the recipe of `name`'s values (ReadFloat32 would return exactly
  // DummyFillValue(fill, i) for element i), so the loader can have the backend make them in
  // place (Backend::FillDummy). nullopt (the default): read them.
  virtual std::optional<DummyFill> DummyFillFor(const std::string& name,
                                                const std::vector<int64_t>& shape) const {
    return std::nullopt;
  }
  // A 2-D tensor stored as FP8 e4m3 with one fp32 scale per 128 x 128 block (DeepSeek's
  // `<name>_scale_inv`), as stored: data [rows, cols] bytes, scales [ceil(rows / 128),
  // ceil(cols / 128)] row-major. nullopt where `name` is stored otherwise (the default: such
  // sources only dequantise, through ReadFloat32). Errors as ReadFloat32's.
  // Whether ReadFp8(name, ...) returns a tensor (a cheap look at the stored dtype, for memory
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
  // For messages: the checkpoint directory, or "dummy(seed=...)".
  virtual std::string description() const = 0;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_WEIGHT_SOURCE_H_
