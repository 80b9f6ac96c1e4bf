// Times RmsNormRopeF32 at DeepSeek-V4's decode shapes (rope 64 of each row): a token's 64 query
// heads of 512 (normed in place), its key row (1 x 512), the indexer's 64 heads of 128, and 65
// and 129 rows of 512 (either side of the few-rows launch shape's limit), in each launch shape
// (RopeRows::kAuto: a row a block up to 128 rows; kWide: 8 rows a block). Per case: the eager
// median of 20 calls (launch overhead included) and the time per call of kGraphCalls calls
// recorded back to back in one CUDA graph (the decode step's setting: neighbours overlap
// through programmatic dependent launch). Then the query and the key row of a decode token as
// two calls and as one RmsNormRopePairF32.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <utility>
#include <vector>

#include "kernels/rope/rope.h"
#include "kernels/testing/bench_util.h"

namespace deepinfer {
namespace {

constexpr int kGraphCalls = 20;
constexpr int64_t kRope = 64;

// Microseconds per call of `call` (enqueued on the given stream) recorded kGraphCalls times in
// one graph.
double GraphMicrosPerCall(const std::function<cudaError_t(cudaStream_t)>& call) {
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kGraphCalls; ++i) BENCH_CUDA(call(stream));
  BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  // On the default stream, where MedianMs records its events.
  const double ms = bench::MedianMs([&] { return cudaGraphLaunch(exec, nullptr); });
  BENCH_CUDA(cudaGraphExecDestroy(exec));
  BENCH_CUDA(cudaGraphDestroy(graph));
  BENCH_CUDA(cudaStreamDestroy(stream));
  return ms * 1e3 / kGraphCalls;
}

void Run(const char* what, int64_t heads, int64_t dim) {
  const int64_t n = heads * dim;
  float* x = bench::Upload(bench::Uniform(n, 1));
  float* weight = bench::Upload(bench::Uniform(dim, 2));
  std::vector<float> inv_freq(kRope / 2);
  for (int64_t j = 0; j < kRope / 2; ++j) {
    inv_freq[j] = static_cast<float>(std::pow(10000.0, -2.0 * j / kRope));
  }
  float* inv = bench::Upload(inv_freq);
  int32_t* position = bench::Upload(std::vector<int32_t>{4321});
  for (const kernels::RopeRows shape : {kernels::RopeRows::kAuto, kernels::RopeRows::kWide}) {
    const auto call = [&](cudaStream_t stream) {
      return kernels::RmsNormRopeF32(1, heads, dim, x, dim, weight, 1e-6f, x, dim, kRope, position,
                                     inv, 1.0f, stream, shape);
    };
    const double eager_us = bench::MedianMs([&] { return call(nullptr); }) * 1e3;
    std::printf(
        "norm_rope %-12s rows %-4lld dim %-4lld %-5s eager %8.2f us  graph %8.2f us a call\n", what,
        static_cast<long long>(heads), static_cast<long long>(dim),
        shape == kernels::RopeRows::kAuto ? "auto" : "wide", eager_us, GraphMicrosPerCall(call));
  }
  for (void* p : {static_cast<void*>(x), static_cast<void*>(weight), static_cast<void*>(inv),
                  static_cast<void*>(position)}) {
    BENCH_CUDA(cudaFree(p));
  }
}

// A decode token's query (64 x 512, in place) and key row (1 x 512) as two RmsNormRopeF32 calls
// and as one RmsNormRopePairF32: the time of both rows' work, eager and per pair in a graph.
void RunPair() {
  constexpr int64_t kHeads = 64, kDim = 512;
  float* q = bench::Upload(bench::Uniform(kHeads * kDim, 1));
  float* kv = bench::Upload(bench::Uniform(kDim, 2));
  float* kv_out = bench::DeviceAlloc<float>(kDim * sizeof(float));
  float* ones = bench::Upload(std::vector<float>(kDim, 1.0f));
  float* weight = bench::Upload(bench::Uniform(kDim, 3));
  std::vector<float> inv_freq(kRope / 2);
  for (int64_t j = 0; j < kRope / 2; ++j) {
    inv_freq[j] = static_cast<float>(std::pow(10000.0, -2.0 * j / kRope));
  }
  float* inv = bench::Upload(inv_freq);
  int32_t* position = bench::Upload(std::vector<int32_t>{4321});
  kernels::RmsNormRopeRows qr, kr;
  qr.tokens = 1, qr.heads = kHeads, qr.dim = kDim;
  qr.x = q, qr.ldx = kDim, qr.weight = ones, qr.out = q, qr.ldout = kDim;
  kr.tokens = 1, kr.heads = 1, kr.dim = kDim;
  kr.x = kv, kr.ldx = kDim, kr.weight = weight, kr.out = kv_out, kr.ldout = kDim;
  const auto two = [&](cudaStream_t stream) {
    const cudaError_t e = kernels::RmsNormRopeF32(1, kHeads, kDim, q, kDim, ones, 1e-6f, q, kDim,
                                                  kRope, position, inv, 1.0f, stream);
    if (e != cudaSuccess) return e;
    return kernels::RmsNormRopeF32(1, 1, kDim, kv, kDim, weight, 1e-6f, kv_out, kDim, kRope,
                                   position, inv, 1.0f, stream);
  };
  const auto pair = [&](cudaStream_t stream) {
    return kernels::RmsNormRopePairF32(qr, kr, 1e-6f, kRope, position, inv, 1.0f, stream);
  };
  for (const auto& [what, call] :
       {std::pair<const char*, std::function<cudaError_t(cudaStream_t)>>{"query+key/two", two},
        {"query+key/pair", pair}}) {
    const double eager_us = bench::MedianMs([&] { return call(nullptr); }) * 1e3;
    std::printf("norm_rope %-15s rows 64+1 dim 512  eager %8.2f us  graph %8.2f us a pair\n", what,
                eager_us, GraphMicrosPerCall(call));
  }
  for (void* p : {static_cast<void*>(q), static_cast<void*>(kv), static_cast<void*>(kv_out),
                  static_cast<void*>(ones), static_cast<void*>(weight), static_cast<void*>(inv),
                  static_cast<void*>(position)}) {
    BENCH_CUDA(cudaFree(p));
  }
}

}  // namespace
}  // namespace deepinfer

int main() {
  deepinfer::Run("query", 64, 512);
  deepinfer::Run("key", 1, 512);
  deepinfer::Run("index_query", 64, 128);
  deepinfer::Run("rows", 65, 512);
  deepinfer::Run("rows", 129, 512);
  deepinfer::RunPair();
  return 0;
}
