// graph_alloc_bench: what a stream-ordered allocation costs inside a replayed CUDA graph. The
// decode step allocates its temporaries with cudaMallocAsync / cudaFreeAsync on the backend's
// stream (CudaBackend::AllocateScratch), which capture turns into graph memory nodes between the
// kernels. Three graphs of N small kernels (RoundF32ToBf16 of 2048 values, a few microseconds
// each) in one chain, each replayed 10 times (median, after 2 warm-ups), time per kernel:
//   kernels           the kernels alone, writing one preallocated buffer
//   alloc+free each   every kernel writes a buffer allocated just before it and freed after it
//   alloc 4 ahead     buffers allocated 4 kernels before their kernel, freed after it (more
//                     memory live at once, as a layer's temporaries are)
// and the node count of each graph by type.
//
//   graph_alloc_bench     (one line per graph; exit status 1 on a CUDA error)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kernels/activation/elementwise.h"
#include "kernels/testing/bench_util.h"

namespace deepinfer {
namespace {

constexpr int kKernels = 400;
constexpr int64_t kValues = 2048;

std::string NodeCounts(cudaGraph_t graph) {
  size_t n = 0;
  BENCH_CUDA(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  BENCH_CUDA(cudaGraphGetNodes(graph, nodes.data(), &n));
  std::map<std::string, int> counts;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t;
    BENCH_CUDA(cudaGraphNodeGetType(node, &t));
    const char* name = t == cudaGraphNodeTypeKernel     ? "kernel"
                       : t == cudaGraphNodeTypeMemAlloc ? "mem-alloc"
                       : t == cudaGraphNodeTypeMemFree  ? "mem-free"
                       : t == cudaGraphNodeTypeMemset   ? "memset"
                       : t == cudaGraphNodeTypeEmpty    ? "empty"
                                                        : "other";
    ++counts[name];
  }
  std::string s;
  for (const auto& [name, c] : counts) s += " " + name + " " + std::to_string(c);
  return s;
}

void Time(const char* name, const std::function<void(cudaStream_t)>& record) {
  cudaStream_t st;
  BENCH_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph;
  BENCH_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  record(st);
  BENCH_CUDA(cudaStreamEndCapture(st, &graph));
  cudaGraphExec_t exec;
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int i = 0; i < 12; ++i) {
    BENCH_CUDA(cudaEventRecord(start, st));
    BENCH_CUDA(cudaGraphLaunch(exec, st));
    BENCH_CUDA(cudaEventRecord(stop, st));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, start, stop));
    if (i >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  std::printf("%-16s %6.2f us per kernel (%d kernels) |%s\n", name,
              1000.0 * ms[ms.size() / 2] / kKernels, kKernels, NodeCounts(graph).c_str());
  std::fflush(stdout);
  BENCH_CUDA(cudaEventDestroy(start));
  BENCH_CUDA(cudaEventDestroy(stop));
  BENCH_CUDA(cudaGraphExecDestroy(exec));
  BENCH_CUDA(cudaGraphDestroy(graph));
  BENCH_CUDA(cudaStreamDestroy(st));
}

}  // namespace
}  // namespace deepinfer

int main() {
  using deepinfer::kKernels;
  using deepinfer::kValues;
  float* in = deepinfer::bench::Upload(deepinfer::bench::Uniform(kValues, 1));
  uint16_t* out = deepinfer::bench::DeviceAlloc<uint16_t>(kValues * 2);
  deepinfer::Time("kernels", [&](cudaStream_t st) {
    for (int i = 0; i < kKernels; ++i) {
      BENCH_CUDA(deepinfer::kernels::RoundF32ToBf16(kValues, in, out, st));
    }
  });
  deepinfer::Time("alloc+free each", [&](cudaStream_t st) {
    for (int i = 0; i < kKernels; ++i) {
      void* p = nullptr;
      BENCH_CUDA(cudaMallocAsync(&p, kValues * 2, st));
      BENCH_CUDA(deepinfer::kernels::RoundF32ToBf16(kValues, in, static_cast<uint16_t*>(p), st));
      BENCH_CUDA(cudaFreeAsync(p, st));
    }
  });
  deepinfer::Time("alloc 4 ahead", [&](cudaStream_t st) {
    std::deque<void*> ahead;
    for (int i = 0; i < kKernels + 4; ++i) {
      if (i < kKernels) {
        void* p = nullptr;
        BENCH_CUDA(cudaMallocAsync(&p, kValues * 2, st));
        ahead.push_back(p);
      }
      if (i >= 4) {
        void* p = ahead.front();
        ahead.pop_front();
        BENCH_CUDA(deepinfer::kernels::RoundF32ToBf16(kValues, in, static_cast<uint16_t*>(p), st));
        BENCH_CUDA(cudaFreeAsync(p, st));
      }
    }
  });
  return 0;
}
