// SafetensorsWriter: writes .safetensors files. Used by tests to build checkpoints (and corrupt
// ones) without Python, and by tools that save dummy weights.
#ifndef DEEPINFER_WORKER_MODEL_SAFETENSORS_WRITER_H_
#define DEEPINFER_WORKER_MODEL_SAFETENSORS_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {

class SafetensorsWriter {
 public:
  // Raw little-endian element bytes; their size must match shape and dtype.
  void Add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
           std::vector<uint8_t> bytes);
  void AddFloat32(const std::string& name, const std::vector<int64_t>& shape,
                  const std::vector<float>& values);
  // Stores values rounded to nearest-even BF16.
  void AddBf16(const std::string& name, const std::vector<int64_t>& shape,
               const std::vector<float>& values);
  absl::Status Write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Entry> entries_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_SAFETENSORS_WRITER_H_
