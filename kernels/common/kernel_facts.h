// What a kernel launch needs to know about a kernel on a device (its PTX version, the device's
// SM count and opt-in shared memory per block), queried once per (kernel, device) and cached
// for the process: the queries cost tens of microseconds, too much per launch. The first query
// also raises the kernel's dynamic shared-memory limit, so launches need no attribute call.
#ifndef DEEPINFER_KERNELS_COMMON_KERNEL_FACTS_H_
#define DEEPINFER_KERNELS_COMMON_KERNEL_FACTS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

struct KernelFacts {
  cudaError_t error = cudaSuccess;  // of the first failing query; the rest are then 0
  int ptx_version = 0;
  int sms = 0;
  int max_smem = 0;  // the device's opt-in shared memory per block
};

// `dynamic_smem`: the kernel's dynamic shared-memory limit is raised to these bytes when the
// device allows that many (max_smem >= dynamic_smem; otherwise it is left alone and the caller
// sees the small max_smem), or, with kAllSharedMemory, to everything the device allows beside
// the kernel's static shared memory. A kernel is always queried with the same value.
inline constexpr int kAllSharedMemory = -1;

// Thread-safe; failures are cached like the facts (and cleared from CUDA's last-error state).
KernelFacts KernelFactsFor(const void* kernel, int device, int dynamic_smem);

// The same on the calling thread's current device (cudaGetDevice's error, if it fails, is
// returned without caching anything).
KernelFacts KernelFactsForCurrentDevice(const void* kernel, int dynamic_smem);

// Blocks of `kernel` (`threads` a block, no dynamic shared memory) that fit on one SM of the
// current device, or `fallback` where the occupancy query fails. Asks in relaxed capture mode for
// this thread, so that a call while the stream is being captured cannot invalidate the capture.
int BlocksPerSm(const void* kernel, int threads, int fallback);

// The SM count of the calling thread's current device.
cudaError_t CurrentDeviceSms(int* sms);

// Units of work in rounds of equal work: ceil(work / rounds) units, where rounds = ceil(work /
// units that fit), so that no last round of a grid-strided kernel runs on a few SMs.
inline int64_t BalancedUnits(int64_t work, int64_t fit) {
  const int64_t rounds = (work + fit - 1) / fit;
  return (work + rounds - 1) / rounds;
}

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_COMMON_KERNEL_FACTS_H_
