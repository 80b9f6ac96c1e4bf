// graph_alloc_bench: what a stream-ordered allocation costs inside a replayed CUDA graph. The
// decode step allocates its temporaries with cudaMallocAsync / cudaFreeAsync on the backend's
// stream (CudaBackend::AllocateScratch), which capture turns into graph memory nodes between the
// kernels. Three graphs of N small kernels (RoundF32ToBf16 of 2048 values, a few microseconds
// each) in one chain, each replayed 10 times (median, after 2 warm-ups), time per kernel:
//   kernels           the kernels alone, writing one preallocated buffer
//   alloc+free each   every kernel writes a buffer allocated just before it and freed after it
//   alloc 4 ahead     buffers allocated 4 kernels before their kernel, freed after it (more
//                     memory live at once, as a layer's temporaries are)
// and the node count of each graph by type. Then programmatic dependent launch (PDL,
// kernels/common/launch.cuh), each graph recorded with PDL off and on:
//   empty <<<>>>      empty kernels (1 block of 32 threads) launched plainly
//   empty pdl off/on  the same through LaunchAfterPrecedingGrids (wait + trigger)
//   round pdl off/on  the RoundF32ToBf16 chain above
//   norm+gemv off/on  a decode-like chain: AddRmsNorm of one 2048-wide row (bf16 out), then a
//                     one-row GEMV of 2048 x 2048 bf16 weights (split-k, the o_proj shape), each
//                     GEMV on its own weights (kKernels / 2 copies, 1.7 GB: none in L2), time
//                     per kernel
//   n+g alloc chain   PDL on, norm+gemv with the norm's output allocated before the norm and
//                     freed after the GEMV (graph memory nodes between the kernels, as in the
//                     model's decode graphs)
//   n+g alloc aside   the same with the allocation and free captured beside the kernel chain
//                     (kernels/common/capture_deps.h, what CudaBackend does while recording)
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
#include "kernels/common/capture_deps.h"
#include "kernels/common/pdl.h"
#include "kernels/common/pdl_chain.h"
#include "kernels/gemm/small_m_gemm.h"
#include "kernels/norm/rms_norm.h"
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

// " | P programmatic edges" where the graph has any.
std::string ProgrammaticEdges(cudaGraph_t graph) {
  size_t n = 0;
  BENCH_CUDA(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  BENCH_CUDA(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n));
  int programmatic = 0;
  for (const cudaGraphEdgeData& d : data) {
    if (d.type == cudaGraphDependencyTypeProgrammatic) ++programmatic;
  }
  return programmatic == 0 ? "" : " | " + std::to_string(programmatic) + " programmatic edges";
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
  std::printf("%-16s %6.2f us per kernel (%d kernels) |%s%s\n", name,
              1000.0 * ms[ms.size() / 2] / kKernels, kKernels, NodeCounts(graph).c_str(),
              ProgrammaticEdges(graph).c_str());
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
  // Programmatic dependent launch, each chain recorded with the switch off and on.
  namespace k = deepinfer::kernels;
  deepinfer::Time("empty <<<>>>", [&](cudaStream_t st) {
    for (int i = 0; i < kKernels; ++i) BENCH_CUDA(k::EmptyStepPlain(1, st));
  });
  for (bool pdl : {false, true}) {
    k::SetProgrammaticDependentLaunch(pdl);
    deepinfer::Time(pdl ? "empty pdl on" : "empty pdl off", [&](cudaStream_t st) {
      for (int i = 0; i < kKernels; ++i) BENCH_CUDA(k::EmptyStep(1, st));
    });
  }
  for (bool pdl : {false, true}) {
    k::SetProgrammaticDependentLaunch(pdl);
    deepinfer::Time(pdl ? "round pdl on" : "round pdl off", [&](cudaStream_t st) {
      for (int i = 0; i < kKernels; ++i) BENCH_CUDA(k::RoundF32ToBf16(kValues, in, out, st));
    });
  }
  constexpr int64_t kDim = 2048;
  constexpr int kPairs = kKernels / 2;
  float* x = deepinfer::bench::Upload(deepinfer::bench::Uniform(kDim, 2));
  float* y = deepinfer::bench::Upload(deepinfer::bench::Uniform(kDim, 3));
  float* norm_w = deepinfer::bench::Upload(deepinfer::bench::Uniform(kDim, 4));
  float* gemv_out = deepinfer::bench::DeviceAlloc<float>(kDim * sizeof(float));
  // Weights: bf16 bits of small values (the arithmetic is irrelevant; the bytes matter).
  uint16_t* weights = deepinfer::bench::DeviceAlloc<uint16_t>(size_t{kPairs} * kDim * kDim * 2);
  BENCH_CUDA(cudaMemset(weights, 0x3c, size_t{kPairs} * kDim * kDim * 2));
  for (bool pdl : {false, true}) {
    k::SetProgrammaticDependentLaunch(pdl);
    deepinfer::Time(pdl ? "norm+gemv on" : "norm+gemv off", [&](cudaStream_t st) {
      for (int i = 0; i < kPairs; ++i) {
        BENCH_CUDA(k::AddRmsNormF32(1, kDim, x, y, norm_w, 1e-6f, nullptr, out, st));
        k::SmallMGemmParams p;
        p.m = 1, p.n = kDim, p.k = kDim;
        p.a = out, p.a_bf16 = true, p.lda = kDim;
        p.w = weights + static_cast<size_t>(i) * kDim * kDim, p.ldw = kDim;
        p.c = gemv_out, p.ldc = kDim;
        BENCH_CUDA(k::SmallMGemmBf16(p, st));
      }
    });
  }
  // PDL on, the norm's bf16 output in a buffer allocated before the norm and freed after the
  // GEMV (as the model's temporaries), captured in the chain or beside it (capture_deps.h).
  k::SetProgrammaticDependentLaunch(true);
  for (bool aside : {false, true}) {
    deepinfer::Time(aside ? "n+g alloc aside" : "n+g alloc chain", [&](cudaStream_t st) {
      for (int i = 0; i < kPairs; ++i) {
        void* tmp = nullptr;
        BENCH_CUDA(aside ? k::MallocAsideAsync(&tmp, kDim * 2, st)
                         : cudaMallocAsync(&tmp, kDim * 2, st));
        uint16_t* h = static_cast<uint16_t*>(tmp);
        BENCH_CUDA(k::AddRmsNormF32(1, kDim, x, y, norm_w, 1e-6f, nullptr, h, st));
        k::SmallMGemmParams p;
        p.m = 1, p.n = kDim, p.k = kDim;
        p.a = h, p.a_bf16 = true, p.lda = kDim;
        p.w = weights + static_cast<size_t>(i) * kDim * kDim, p.ldw = kDim;
        p.c = gemv_out, p.ldc = kDim;
        BENCH_CUDA(k::SmallMGemmBf16(p, st));
        BENCH_CUDA(aside ? k::FreeAsideAsync(tmp, st) : cudaFreeAsync(tmp, st));
      }
    });
  }
  return 0;
}
