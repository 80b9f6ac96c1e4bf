// The e4m3 -> fp32 widening of the FP8 block-scaled GEMV kernels (fp8_block_gemm.cu,
// fp8_block_gemm_vec.cu).
#ifndef DEEPINFER_KERNELS_GEMM_FP8_WIDEN_CUH_
#define DEEPINFER_KERNELS_GEMM_FP8_WIDEN_CUH_

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// The 16 e4m3 values of v (byte 0 first) as floats (exact: e4m3 values are fp16 values).
__device__ __forceinline__ void DecodeFp8x16(const uint4& v, float* w) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>((words[q] >> (16 * h)) & 0xFFFFu), __NV_E4M3);
      const float2 f = __half22float2(__half2(raw));
      w[4 * q + 2 * h] = f.x;
      w[4 * q + 2 * h + 1] = f.y;
    }
  }
}

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_FP8_WIDEN_CUH_
