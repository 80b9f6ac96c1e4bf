#include "kernels/common/kernel_facts.h"

#include <map>
#include <mutex>
#include <utility>

namespace deepinfer {
namespace kernels {
namespace {

KernelFacts Query(const void* kernel, int device, int dynamic_smem) {
  KernelFacts f;
  cudaFuncAttributes attr;
  f.error = cudaFuncGetAttributes(&attr, kernel);
  if (f.error == cudaSuccess) {
    f.ptx_version = attr.ptxVersion;
    f.error = cudaDeviceGetAttribute(&f.max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  }
  if (f.error == cudaSuccess) {
    f.error = cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, device);
  }
  if (f.error == cudaSuccess) {
    if (dynamic_smem == kAllSharedMemory) {
      f.error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     f.max_smem - static_cast<int>(attr.sharedSizeBytes));
    } else if (f.max_smem >= dynamic_smem) {
      f.error =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic_smem);
    }
  }
  if (f.error != cudaSuccess) cudaGetLastError();  // reported through the facts
  return f;
}

}  // namespace

KernelFacts KernelFactsFor(const void* kernel, int device, int dynamic_smem) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, KernelFacts>* facts =
      new std::map<std::pair<const void*, int>, KernelFacts>();
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(kernel, device);
  auto it = facts->find(key);
  if (it == facts->end()) it = facts->emplace(key, Query(kernel, device, dynamic_smem)).first;
  return it->second;
}

KernelFacts KernelFactsForCurrentDevice(const void* kernel, int dynamic_smem) {
  int device = 0;
  KernelFacts f;
  f.error = cudaGetDevice(&device);
  if (f.error != cudaSuccess) {
    cudaGetLastError();
    return f;
  }
  return KernelFactsFor(kernel, device, dynamic_smem);
}

int BlocksPerSm(const void* kernel, int threads, int fallback) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  int blocks = 0;
  const cudaError_t err =
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0);
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  if (err != cudaSuccess || blocks < 1) {
    (void)cudaGetLastError();
    return fallback;
  }
  return blocks;
}

cudaError_t CurrentDeviceSms(int* sms) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device);
  return err;
}

}  // namespace kernels
}  // namespace deepinfer
