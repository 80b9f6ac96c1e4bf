// DeepSeek-V4's clamped SwiGLU on the GPU (V4Ops::SwiGluClamped, worker/backend/v4_ops.h):
// out[r, i] = silu(min(gate, limit)) * clamp(up, -limit, limit), rows of [gate | up]. One
// launch; the CPU reference's arithmetic (expf aside).
#ifndef DEEPINFER_KERNELS_V4_SWIGLU_CLAMPED_H_
#define DEEPINFER_KERNELS_V4_SWIGLU_CLAMPED_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// x [rows, 2 * inter] and out [rows, inter] are device memory; limit <= 0: no clamp. Groups of
// 4 columns with 16-byte loads where inter and the pointers allow. cudaErrorInvalidValue for
// negative sizes; nothing is launched for an empty output.
cudaError_t SwiGluClampedF32(int64_t rows, int64_t inter, const float* x, float limit, float* out,
                             cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_V4_SWIGLU_CLAMPED_H_
