// DeviceBuffer: a block of memory owned by a Backend (host RAM for the CPU backend, device
// memory for CUDA). The model only ever holds these through std::unique_ptr and passes raw
// pointers from data() to backend ops, so the same model code drives every device.
#ifndef DEEPINFER_WORKER_BACKEND_DEVICE_BUFFER_H_
#define DEEPINFER_WORKER_BACKEND_DEVICE_BUFFER_H_

#include <cstddef>

namespace deepinfer {

class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  // Device address of the first byte; only valid to dereference on the owning device.
  virtual void* data() = 0;
  virtual const void* data() const = 0;
  virtual size_t size_bytes() const = 0;

  template <typename T>
  T* as() {
    return static_cast<T*>(data());
  }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data());
  }
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_DEVICE_BUFFER_H_
