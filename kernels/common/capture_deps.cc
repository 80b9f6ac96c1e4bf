#include "kernels/common/capture_deps.h"

#include <vector>

namespace deepinfer {
namespace kernels {
namespace {

// The capturing stream's dependency set (nodes and edge data); *capturing false if the stream
// is not capturing.
struct CaptureDeps {
  bool capturing = false;
  std::vector<cudaGraphNode_t> nodes;
  std::vector<cudaGraphEdgeData> edges;
};

cudaError_t GetDeps(cudaStream_t stream, CaptureDeps* d) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* nodes = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  size_t n = 0;
  cudaError_t e = cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &nodes, &edges, &n);
  if (e != cudaSuccess) return e;
  d->capturing = status == cudaStreamCaptureStatusActive;
  d->nodes.assign(nodes, nodes + n);
  d->edges.assign(n, cudaGraphEdgeData{});
  if (edges != nullptr) d->edges.assign(edges, edges + n);
  return cudaSuccess;
}

cudaError_t SetDeps(cudaStream_t stream, CaptureDeps& d) {
  return cudaStreamUpdateCaptureDependencies(stream, d.nodes.data(), d.edges.data(), d.nodes.size(),
                                             cudaStreamSetCaptureDependencies);
}

}  // namespace

cudaError_t MallocAsideAsync(void** ptr, size_t bytes, cudaStream_t stream) {
  CaptureDeps d;
  cudaError_t e = GetDeps(stream, &d);
  if (e != cudaSuccess) return e;
  if (!d.capturing) return cudaMallocAsync(ptr, bytes, stream);
  if ((e = cudaStreamUpdateCaptureDependencies(stream, nullptr, nullptr, 0,
                                               cudaStreamSetCaptureDependencies)) != cudaSuccess) {
    return e;
  }
  if ((e = cudaMallocAsync(ptr, bytes, stream)) != cudaSuccess) return e;
  CaptureDeps alloc;  // the allocation node alone
  if ((e = GetDeps(stream, &alloc)) != cudaSuccess) return e;
  for (cudaGraphNode_t node : alloc.nodes) {
    d.nodes.push_back(node);
    d.edges.push_back(cudaGraphEdgeData{});
  }
  return SetDeps(stream, d);
}

cudaError_t FreeAsideAsync(void* ptr, cudaStream_t stream) {
  CaptureDeps d;
  cudaError_t e = GetDeps(stream, &d);
  if (e != cudaSuccess) return e;
  if ((e = cudaFreeAsync(ptr, stream)) != cudaSuccess || !d.capturing) return e;
  return SetDeps(stream, d);
}

cudaError_t MakeCapturedKernelDependenciesProgrammatic(cudaStream_t stream, bool* capturing) {
  CaptureDeps d;
  cudaError_t e = GetDeps(stream, &d);
  *capturing = d.capturing;
  if (e != cudaSuccess || !d.capturing) return e;
  bool any = false;
  for (size_t i = 0; i < d.nodes.size(); ++i) {
    cudaGraphNodeType type;
    if ((e = cudaGraphNodeGetType(d.nodes[i], &type)) != cudaSuccess) return e;
    if (type != cudaGraphNodeTypeKernel) continue;
    d.edges[i] = cudaGraphEdgeData{};
    d.edges[i].from_port = cudaGraphKernelNodePortProgrammatic;
    d.edges[i].type = cudaGraphDependencyTypeProgrammatic;
    any = true;
  }
  return any ? SetDeps(stream, d) : cudaSuccess;
}

}  // namespace kernels
}  // namespace deepinfer
