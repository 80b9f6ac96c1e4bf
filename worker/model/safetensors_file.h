// SafetensorsFile: one memory-mapped .safetensors file (8-byte little-endian header length,
// JSON header, raw tensor data). Opening validates the whole header against the file size, so a
// truncated or corrupt file fails at open with an error naming the file and the tensor; tensor
// bytes are then read straight from the mapping, paged in only when used.
#ifndef DEEPINFER_WORKER_MODEL_SAFETENSORS_FILE_H_
#define DEEPINFER_WORKER_MODEL_SAFETENSORS_FILE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the mapping
  size_t nbytes = 0;
  int64_t num_elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // nullptr if absent.
  const SafetensorsTensor* Find(const std::string& name) const;
  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile(std::string path, void* map, size_t size)
      : path_(std::move(path)), map_(map), size_(size) {}

  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, SafetensorsTensor> tensors_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_SAFETENSORS_FILE_H_
