// Chains of small kernels launched through kernels/common/launch.cuh, for launch_test,
// graph_alloc_bench and the PDL tests and benchmarks of other kernels (test-only target): a
// dependent chain whose every step reads what the step before it wrote in other blocks (a missing
// wait would show as wrong values), a chain of empty kernels (the cost of a kernel boundary), and
// a copy that writes a later kernel's inputs late.
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

// dst[i] = src[i], i < bytes (16-byte aligned pointers, bytes a multiple of 16), by `blocks`
// blocks of 256 threads (at most a few per SM, so that all run at once) that each first spin for
// delay_ns nanoseconds after the wait: a PDL kernel after it that read dst before its own wait
// would read dst's earlier contents. delay_ns 0: a plain copy, as a small producer kernel (a
// quantisation) ahead of a consumer.
cudaError_t DelayedCopy(const void* src, void* dst, int64_t bytes, int64_t delay_ns, int blocks,
                        cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_COMMON_PDL_CHAIN_H_
