// 16-byte global loads of data a kernel reads once (weights streamed by the decode GEMVs and the
// MoE block): read-only path, not kept in L1, so L1 stays for the activation rows the kernel
// reads many times; and L2 prefetches of such data ahead of its loads. Include only from .cu
// files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

__device__ __forceinline__ uint4 LoadStreaming16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ float4 LoadStreamingFloat4(const float4* p) {
  float4 v;
  asm("ld.global.nc.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
      : "l"(p));
  return v;
}

// bytes (a multiple of 16, 16-byte aligned) from p into L2, a hint: a wrong address costs
// bandwidth, never a result.
__device__ __forceinline__ void PrefetchL2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
  for (uint32_t b = 0; b < bytes; b += 128) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(static_cast<const char*>(p) + b));
  }
#endif
}

}  // namespace kernels
}  // namespace deepinfer
