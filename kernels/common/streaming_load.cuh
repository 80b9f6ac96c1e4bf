// 16-byte global loads of data a kernel reads once (weights streamed by the decode GEMVs and the
// MoE block): read-only path, not kept in L1, so L1 stays for the activation rows the kernel
// reads many times. Include only from .cu files.
#pragma once

#include <cuda_runtime.h>

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

}  // namespace kernels
}  // namespace deepinfer
