// The tensor-core form of MlaDecodeSmall (MlaDecodeSmallForm::kTensorCore), internal to the
// mla_decode_small target: mla_decode_small.cu checks the options and dispatches here.
#ifndef DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_SMALL_MMA_H_
#define DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_SMALL_MMA_H_

#include <cuda_runtime_api.h>

#include "kernels/attention/mla_attention.h"

namespace deepinfer {
namespace kernels {
namespace mla_decode_small_internal {

// Heads a block of the tensor-core form: the M of mma.m16n8k16.
constexpr int kMmaHeads = 16;

// Whether the tensor-core kernel runs on the current device (sm_90 code, clusters, its shared
// memory). Params are checked by the caller (MlaDecodeSmallSupported, heads % 16 == 0).
bool MmaKernelRuns();

// The cluster size for `cluster_size` (0: auto, as MlaDecodeSmallShape: the first of 8, 4, 2, 1
// whose tokens x head groups clusters all run at once, else the last that runs at all).
// cudaErrorNotSupported when none (or the given size) can be scheduled.
cudaError_t MmaCluster(const MlaAttentionParams& params, int cluster_size, int* cluster);

// Launches the kernel with `cluster` blocks a cluster, with programmatic dependent launch
// (cudaErrorInvalidValue for a cache that is not bf16).
cudaError_t MmaLaunch(const MlaAttentionParams& params, int cluster, cudaStream_t stream);

}  // namespace mla_decode_small_internal
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_SMALL_MMA_H_
