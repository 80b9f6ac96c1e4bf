// noaux_tc_router_bench: one MoE layer's decode routing at the Moonlight shape (hidden 2048, 64
// experts top-6, one group), the way CudaBackend ran it before (cublasSgemm for the fp32 router
// logits, NoauxTcRouteF32, AccumulateExpertCounts with a device count limit) against
// RouteTokensF32 (the tile by size, then every tile), at 1, 8, 64, 128 and 256 tokens.
//
// As in a decode graph: kLayers routings back to back in one CUDA graph (programmatic edges
// between our kernels, as recorded with PDL on), layer l reading its own router weight (so the
// 96 MiB of weights do not stay in the L2 between replays) and the same hidden rows (in the L2,
// as the norm kernel before the router leaves them); time per
// layer = graph time / kLayers, median of 20 replays after 3 warm-ups. The ids of the two ways
// are compared as a sanity check (they may differ only at float-noise ties).
//
//   noaux_tc_router_bench   (one line per case; exit status 1 on a CUDA or cuBLAS error)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <utility>
#include <vector>

#include "kernels/moe/expert_counts.h"
#include "kernels/moe/noaux_tc_router.h"
#include "kernels/moe/noaux_tc_router_fused.h"
#include "kernels/testing/bench_util.h"

namespace deepinfer {
namespace {

using bench::DeviceAlloc;
using bench::Upload;

constexpr int kHidden = 2048, kExperts = 64, kTopK = 6, kLayers = 192, kMaxTokens = 256;

#define BENCH_BLAS(expr)                                                              \
  do {                                                                                \
    cublasStatus_t s_ = (expr);                                                       \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                \
      std::fprintf(stderr, "%s:%d %s: cuBLAS status %d\n", __FILE__, __LINE__, #expr, \
                   static_cast<int>(s_));                                             \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

struct Layer {
  float* weight;  // [kExperts, kHidden]
  float* bias;    // [kExperts]
  float* hidden;  // [kMaxTokens, kHidden], shared by the layers
  float* logits;  // [kMaxTokens, kExperts]
  int32_t* ids;   // [kMaxTokens, kTopK]
  float* weights;
  int64_t* counts;  // [kExperts]
};

struct Setup {
  std::vector<Layer> layers;
  int32_t* count_limit;
  uint32_t* tile_counters;
  cublasHandle_t cublas;
  cudaStream_t stream;
};

void OldRouting(const Setup& s, const Layer& l, int32_t tokens) {
  const float alpha = 1.0f, beta = 0.0f;
  BENCH_BLAS(cublasSgemm(s.cublas, CUBLAS_OP_T, CUBLAS_OP_N, kExperts, tokens, kHidden, &alpha,
                         l.weight, kHidden, l.hidden, kHidden, &beta, l.logits, kExperts));
  kernels::NoauxTcRouteParams p;
  p.num_tokens = tokens;
  p.num_experts = kExperts;
  p.router_logits = l.logits;
  p.correction_bias = l.bias;
  p.top_k = kTopK;
  p.scaling_factor = 2.446f;
  p.topk_ids = l.ids;
  p.topk_weights = l.weights;
  BENCH_CUDA(kernels::NoauxTcRouteF32(p, s.stream));
  BENCH_CUDA(kernels::AccumulateExpertCounts(int64_t{tokens} * kTopK, l.ids, kExperts,
                                             s.count_limit, l.counts, s.stream));
}

void NewRouting(const Setup& s, const Layer& l, int32_t tokens, int32_t tm, int32_t te) {
  kernels::RouteTokensParams p;
  p.num_tokens = tokens;
  p.hidden_size = kHidden;
  p.hidden = l.hidden;
  p.router_weight = l.weight;
  p.router_logits = l.logits;
  p.tile_counters = s.tile_counters;
  p.num_experts = kExperts;
  p.correction_bias = l.bias;
  p.top_k = kTopK;
  p.scaling_factor = 2.446f;
  p.topk_ids = l.ids;
  p.topk_weights = l.weights;
  p.expert_counts = l.counts;
  p.count_limit = s.count_limit;
  p.tile_tokens = tm;
  p.tile_experts = te;
  BENCH_CUDA(kernels::RouteTokensF32(p, s.stream));
}

// Microseconds per layer of `route` recorded kLayers times in one graph.
double GraphMicrosPerLayer(const Setup& s, const std::function<void(const Layer&)>& route) {
  cudaGraph_t graph;
  BENCH_CUDA(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
  for (const Layer& l : s.layers) route(l);
  BENCH_CUDA(cudaStreamEndCapture(s.stream, &graph));
  cudaGraphExec_t exec;
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  // On the default stream, where MedianMs records its events.
  const double ms = bench::MedianMs([&] { return cudaGraphLaunch(exec, nullptr); });
  BENCH_CUDA(cudaGraphExecDestroy(exec));
  BENCH_CUDA(cudaGraphDestroy(graph));
  return ms * 1e3 / kLayers;
}

std::vector<int32_t> Ids(const Layer& l, int32_t tokens) {
  std::vector<int32_t> ids(tokens * kTopK);
  BENCH_CUDA(cudaMemcpy(ids.data(), l.ids, ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  return ids;
}

int Run() {
  Setup s;
  BENCH_CUDA(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  BENCH_BLAS(cublasCreate(&s.cublas));
  BENCH_BLAS(cublasSetStream(s.cublas, s.stream));
  BENCH_BLAS(cublasSetMathMode(s.cublas, CUBLAS_DEFAULT_MATH));
  // A workspace of our own, as CudaBackend: cuBLAS allocates nothing while recording.
  constexpr size_t kWorkspace = size_t{32} << 20;
  BENCH_BLAS(cublasSetWorkspace(s.cublas, DeviceAlloc<char>(kWorkspace), kWorkspace));
  s.tile_counters = DeviceAlloc<uint32_t>(kernels::kFusedRouterTileCounters * sizeof(uint32_t));
  BENCH_CUDA(cudaMemset(s.tile_counters, 0, kernels::kFusedRouterTileCounters * sizeof(uint32_t)));
  s.count_limit = DeviceAlloc<int32_t>(sizeof(int32_t));
  float* hidden = Upload(bench::Uniform(size_t{kMaxTokens} * kHidden, 7));
  for (int i = 0; i < kLayers; ++i) {
    Layer l;
    std::vector<float> w = bench::Uniform(size_t{kExperts} * kHidden, 3 * i + 1);
    for (float& v : w) v *= 0.05f;
    l.weight = Upload(w);
    std::vector<float> b = bench::Uniform(kExperts, 3 * i + 2);
    for (float& v : b) v *= 0.05f;
    l.bias = Upload(b);
    l.hidden = hidden;
    l.logits = DeviceAlloc<float>(size_t{kMaxTokens} * kExperts * sizeof(float));
    l.ids = DeviceAlloc<int32_t>(size_t{kMaxTokens} * kTopK * sizeof(int32_t));
    l.weights = DeviceAlloc<float>(size_t{kMaxTokens} * kTopK * sizeof(float));
    l.counts = DeviceAlloc<int64_t>(kExperts * sizeof(int64_t));
    BENCH_CUDA(cudaMemset(l.counts, 0, kExperts * sizeof(int64_t)));
    s.layers.push_back(l);
  }
  std::printf("# decode routing per MoE layer, hidden %d, %d experts top-%d, %d layers per graph\n",
              kHidden, kExperts, kTopK, kLayers);
  for (int32_t tokens : {1, 8, 64, 128, 256}) {
    const int32_t limit = tokens * kTopK;
    BENCH_CUDA(cudaMemcpy(s.count_limit, &limit, sizeof(limit), cudaMemcpyHostToDevice));
    const double old_us = GraphMicrosPerLayer(s, [&](const Layer& l) { OldRouting(s, l, tokens); });
    const std::vector<int32_t> old_ids = Ids(s.layers[0], tokens);
    int32_t tm = 0, te = 0;
    kernels::RouteTokensTile(tokens, &tm, &te);
    const double new_us =
        GraphMicrosPerLayer(s, [&](const Layer& l) { NewRouting(s, l, tokens, 0, 0); });
    const std::vector<int32_t> new_ids = Ids(s.layers[0], tokens);
    int differing = 0;
    for (int32_t t = 0; t < tokens; ++t) {
      for (int k = 0; k < kTopK; ++k) differing += old_ids[t * kTopK + k] != new_ids[t * kTopK + k];
    }
    std::printf(
        "tokens %3d  old (sgemm+route+counts) %6.2f us  fused (tile %dx%d) %6.2f us  "
        "%.2fx  ids differing %d of %d\n",
        tokens, old_us, tm, te, new_us, old_us / new_us, differing, tokens * kTopK);
    std::printf("  tiles:");
    for (auto [m, e] : std::vector<std::pair<int, int>>{
             {1, 1}, {1, 2}, {2, 1}, {2, 2}, {4, 1}, {4, 2}, {8, 1}, {8, 2}, {8, 4}, {8, 8}}) {
      if (m > 2 * tokens && m > 1) continue;
      const double us =
          GraphMicrosPerLayer(s, [&](const Layer& l) { NewRouting(s, l, tokens, m, e); });
      std::printf(" %dx%d %.2f", m, e, us);
    }
    std::printf(" us\n");
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace deepinfer

int main() { return deepinfer::Run(); }
