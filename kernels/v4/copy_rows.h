// Row copies between device buffers by offset lists (V4Ops::CopyRows, worker/backend/v4_ops.h):
// the DeepSeek-V4 model's moves between a step's buffers and the cache (window and compressor
// rings, window slots, paged entries), each list one launch whatever its rows' addresses.
#ifndef DEEPINFER_KERNELS_V4_COPY_ROWS_H_
#define DEEPINFER_KERNELS_V4_COPY_ROWS_H_

#include <cuda_runtime_api.h>

#include "worker/backend/v4_ops.h"

namespace deepinfer {
namespace kernels {

// CopyRowsArgs's meaning; every pointer is device memory. A block per row (grid-strided), its
// threads over the row; 16-byte moves for a row whose two addresses and width allow them.
// cudaErrorInvalidValue for negative sizes or a missing src / dst with rows and width > 0;
// nothing is launched for an empty copy.
cudaError_t CopyRowsF32(const CopyRowsArgs& args, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_V4_COPY_ROWS_H_
