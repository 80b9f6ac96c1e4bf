// Row gather and weighted scatter-add (fp32): embedding lookup, selecting rows for the LM head,
// and the token permutation to experts and back (Backend::GatherRows / ScatterAddRows).
#ifndef DEEPINFER_KERNELS_EMBEDDING_ROWS_H_
#define DEEPINFER_KERNELS_EMBEDDING_ROWS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// dst[r, :] = src[idx[r], :], rows of width dim.
cudaError_t GatherRowsF32(int64_t rows, int64_t dim, const float* src, const int32_t* idx,
                          float* dst, cudaStream_t stream);

// dst[idx[r], :] += weight[r] * src[r, :] (weight may be null: 1). Contributions to one
// destination element are added in row order r = 0, 1, ..., exactly as the CPU reference
// does, so results are deterministic and bit-comparable in summation order.
cudaError_t ScatterAddRowsF32(int64_t rows, int64_t dim, const float* src, const int32_t* idx,
                              const float* weight, float* dst, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_EMBEDDING_ROWS_H_
