// cp.async (sm_80+) for kernels that stage global tiles in shared memory: 16-byte copies that
// zero-fill where the source is out of range, committed and awaited in groups. Below sm_80 the
// functions compile to nothing (callers check that their kernel has sm_80+ code). Include only
// from .cu files.
#pragma once

#include <cuda_runtime.h>

namespace deepinfer {
namespace kernels {

// Copies 16 bytes from gmem to smem, or writes 16 zeros there (gmem unread) if !valid. gmem must
// be a valid address either way.
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(valid ? 16 : 0));
#endif
}

__device__ __forceinline__ void CpAsyncCommit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most kPending of this thread's committed groups are in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

}  // namespace kernels
}  // namespace deepinfer
