// Keeping programmatic (PDL) edges direct inside a captured CUDA graph. Captured in stream
// order, every node depends on the one before it, so a stream-ordered allocation or free
// captured between two kernels (a graph memory node) sits between them: the second kernel
// then depends on the memory node, which depends on the first kernel's completion, and
// programmatic dependent launch cannot overlap the two. These helpers capture such nodes beside
// the kernel chain instead, and give a kernel launch programmatic edges from the kernels it
// follows. All are plain stream operations when `stream` is not capturing.
#ifndef DEEPINFER_KERNELS_COMMON_CAPTURE_DEPS_H_
#define DEEPINFER_KERNELS_COMMON_CAPTURE_DEPS_H_

#include <cuda_runtime_api.h>

#include <cstddef>

namespace deepinfer {
namespace kernels {

// cudaMallocAsync(ptr, bytes, stream). While capturing: the allocation node gets no
// dependencies (it is a root of the graph, so it cannot reuse memory freed earlier in the graph)
// and is added to the stream's dependency set, so the next node depends on it and on the node(s)
// before it, without the allocation coming between them.
cudaError_t MallocAsideAsync(void** ptr, size_t bytes, cudaStream_t stream);

// cudaFreeAsync(ptr, stream). While capturing: the free node depends on the stream's current
// dependency set (every earlier node, so every use of ptr), and the set is restored after it, so
// nothing later depends on the free (a leaf of the graph). Only for memory from
// MallocAsideAsync: nothing later in the graph could reuse it anyway.
cudaError_t FreeAsideAsync(void* ptr, cudaStream_t stream);

// While capturing: marks the stream's dependencies on kernel nodes as programmatic (edge type
// cudaGraphDependencyTypeProgrammatic from cudaGraphKernelNodePortProgrammatic), others
// unchanged, for the next node, which must be a kernel that waits for its preceding grids
// (launch.cuh). Not capturing: nothing. *capturing says which.
cudaError_t MakeCapturedKernelDependenciesProgrammatic(cudaStream_t stream, bool* capturing);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_COMMON_CAPTURE_DEPS_H_
