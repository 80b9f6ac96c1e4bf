// Timing loops shared by the GPU micro-benchmarks: launches captured into one CUDA graph and
// replayed, timed with CUDA events (bench_util.h's MedianMs times eager launches). A benchmark
// stops at the first CUDA error (BENCH_CUDA).
#ifndef DEEPINFER_KERNELS_TESTING_BENCH_TIMER_H_
#define DEEPINFER_KERNELS_TESTING_BENCH_TIMER_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "kernels/testing/bench_util.h"

namespace deepinfer {
namespace bench {

// Mean milliseconds per call of `calls` calls of fn(stream) captured in one graph, replayed
// `replays` times after one untimed replay.
inline double GraphMeanMs(const std::function<cudaError_t(cudaStream_t)>& fn, cudaStream_t stream,
                          int calls = 10, int replays = 5) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) BENCH_CUDA(fn(stream));
  BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  BENCH_CUDA(cudaGraphLaunch(exec, stream));  // warm-up
  BENCH_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t e0, e1;
  BENCH_CUDA(cudaEventCreate(&e0));
  BENCH_CUDA(cudaEventCreate(&e1));
  BENCH_CUDA(cudaEventRecord(e0, stream));
  for (int r = 0; r < replays; ++r) BENCH_CUDA(cudaGraphLaunch(exec, stream));
  BENCH_CUDA(cudaEventRecord(e1, stream));
  BENCH_CUDA(cudaEventSynchronize(e1));
  float total = 0;
  BENCH_CUDA(cudaEventElapsedTime(&total, e0, e1));
  BENCH_CUDA(cudaEventDestroy(e0));
  BENCH_CUDA(cudaEventDestroy(e1));
  BENCH_CUDA(cudaGraphExecDestroy(exec));
  BENCH_CUDA(cudaGraphDestroy(graph));
  return total / (calls * replays);
}

// Median microseconds per launch of launch(copy, stream) for copy = 0 .. copies - 1 (each on its
// own copy of the weights, so that none finds them in L2) recorded into one graph on a stream of
// its own, over `replays` timed replays after one untimed replay. `launch` stops the benchmark
// itself on an error (BENCH_CUDA).
inline double GraphMicrosPerLaunch(int copies, const std::function<void(int, cudaStream_t)>& launch,
                                   int replays) {
  cudaStream_t s;
  BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  BENCH_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int c = 0; c < copies; ++c) launch(c, s);
  BENCH_CUDA(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  BENCH_CUDA(cudaGraphLaunch(exec, s));  // warm-up
  std::vector<float> ms(replays);
  for (float& m : ms) {
    BENCH_CUDA(cudaEventRecord(a, s));
    BENCH_CUDA(cudaGraphLaunch(exec, s));
    BENCH_CUDA(cudaEventRecord(b, s));
    BENCH_CUDA(cudaEventSynchronize(b));
    BENCH_CUDA(cudaEventElapsedTime(&m, a, b));
  }
  std::sort(ms.begin(), ms.end());
  BENCH_CUDA(cudaEventDestroy(a));
  BENCH_CUDA(cudaEventDestroy(b));
  BENCH_CUDA(cudaGraphExecDestroy(exec));
  BENCH_CUDA(cudaGraphDestroy(graph));
  BENCH_CUDA(cudaStreamDestroy(s));
  return 1000.0 * ms[ms.size() / 2] / copies;
}

}  // namespace bench
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_TESTING_BENCH_TIMER_H_
