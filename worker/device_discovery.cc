#include "worker/device_discovery.h"

#include <unistd.h>

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

#ifdef DEEPINFER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace deepinfer {

absl::StatusOr<DeviceSelection> ParseDeviceSelection(const std::string& text) {
  if (text == "auto") return DeviceSelection::kAuto;
  if (text == "cpu") return DeviceSelection::kCpu;
  if (text == "cuda") return DeviceSelection::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device selection '", text, "' (expected auto, cpu or cuda)"));
}

std::vector<Device> FindCudaDevices(std::string* why_none) {
  std::vector<Device> devices;
#ifdef DEEPINFER_WITH_CUDA
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    *why_none = absl::StrCat("CUDA runtime: ", cudaGetErrorString(err));
    return devices;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    Device d;
    d.set_kind(Device::CUDA);
    d.set_index(i);
    d.set_name(prop.name);
    d.set_total_memory_bytes(prop.totalGlobalMem);
    d.set_compute_capability(absl::StrCat(prop.major, ".", prop.minor));
    devices.push_back(std::move(d));
  }
  if (devices.empty()) *why_none = "CUDA runtime found no GPU";
#else
  *why_none = "this build has no CUDA support";
#endif
  return devices;
}

Device CpuDevice() {
  Device d;
  d.set_kind(Device::CPU);
  d.set_index(0);
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "model name")) {
      size_t colon = rest.find(':');
      if (colon != absl::string_view::npos) {
        d.set_name(std::string(absl::StripAsciiWhitespace(rest.substr(colon + 1))));
        break;
      }
    }
  }
  if (d.name().empty()) d.set_name("CPU");
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page_size > 0) {
    d.set_total_memory_bytes(static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size));
  }
  return d;
}

absl::StatusOr<std::vector<Device>> FindDevices(DeviceSelection selection) {
  if (selection == DeviceSelection::kCpu) return std::vector<Device>{CpuDevice()};
  std::string why_none;
  std::vector<Device> gpus = FindCudaDevices(&why_none);
  if (!gpus.empty()) return gpus;
  if (selection == DeviceSelection::kCuda) {
    return absl::FailedPreconditionError(absl::StrCat("--devices=cuda: ", why_none));
  }
  return std::vector<Device>{CpuDevice()};
}

}  // namespace deepinfer
