// Finds the compute devices of this node: CUDA GPUs through the CUDA runtime (when
// the binary was built with CUDA), otherwise the CPU.
#ifndef DEEPINFER_WORKER_DEVICE_DISCOVERY_H_
#define DEEPINFER_WORKER_DEVICE_DISCOVERY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/common.pb.h"

namespace deepinfer {

enum class DeviceSelection {
  kAuto,  // every CUDA GPU if there is one, else the CPU
  kCpu,   // the CPU only, even when GPUs are present
  kCuda,  // CUDA GPUs; an error when there are none
};

// Parses "auto", "cpu" or "cuda".
absl::StatusOr<DeviceSelection> ParseDeviceSelection(const std::string& text);

// CUDA GPUs visible to this process (CUDA_VISIBLE_DEVICES applies). Empty when the
// build has no CUDA, there is no driver, or no GPU; `why_none` then says which.
std::vector<Device> FindCudaDevices(std::string* why_none);

// The CPU as one device: model name from /proc/cpuinfo, physical memory.
Device CpuDevice();

// Devices per `selection`. FAILED_PRECONDITION for kCuda without GPUs, with the reason.
absl::StatusOr<std::vector<Device>> FindDevices(DeviceSelection selection);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_DEVICE_DISCOVERY_H_
