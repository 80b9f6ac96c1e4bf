// The V4 compressors' pooling on the GPU (V4Ops::CompressWindows, worker/backend/v4_ops.h):
// each window's entry is the softmax-gated sum of its source rows, per column. One launch, no
// workspace (capturable in a CUDA graph). fp32, the CPU reference's order of operations with
// the same roundings (no fused multiply-adds), so only expf can make the bits differ.
#ifndef DEEPINFER_KERNELS_V4_COMPRESS_WINDOWS_H_
#define DEEPINFER_KERNELS_V4_COMPRESS_WINDOWS_H_

#include <cuda_runtime_api.h>

#include "worker/backend/v4_ops.h"

namespace deepinfer {
namespace kernels {

// Every pointer of args is device memory; from 256 windows a thread per (window, column) walks
// the slots, below a block per (window, 16 columns) loads and exponentiates them in parallel and
// one thread per column adds them up in slot order (max, sum of exponentials, weighted sum: the
// gate logits are read three times, the values once). cudaErrorInvalidValue for negative sizes, ratio < 1, or a row_stride below the row
// width; nothing is launched for windows or dim 0.
cudaError_t CompressWindowsF32(const CompressWindowsArgs& args, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_V4_COMPRESS_WINDOWS_H_
