// Chains of small kernels launched through kernels/common/launch.cuh, for launch_test and
// graph_alloc_bench (test-only target): a dependent chain whose every step reads what the step
// before it wrote in other blocks (a missing wait would show as wrong values), and a chain of
// empty kernels (the cost of a kernel boundary).
#ifndef DEEPINFER_KERNELS_COMMON_PDL_CHAIN_H_
#define DEEPINFER_KERNELS_COMMON_PDL_CHAIN_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// One step: y[i] = fma(x[(i * 7919) % n], w[i % 256], 1) (fp32, one rounding; w is 256 values
// no step writes, read before the wait). n > 0.
cudaError_t ChainStep(int64_t n, const float* x, const float* w, float* y, cudaStream_t stream);

// A kernel of `blocks` x 32 threads that does nothing but the launch protocol.
cudaError_t EmptyStep(int blocks, cudaStream_t stream);

// The same empty kernel launched with <<<>>> (never PDL), for comparison.
cudaError_t EmptyStepPlain(int blocks, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_COMMON_PDL_CHAIN_H_
