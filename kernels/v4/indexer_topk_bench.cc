// Times IndexerTopKF32 on V4-Flash's indexer shape (64 heads x 128, top-512) at 1, 64 and 128
// decode requests, each over keys of its own (in the cache's paged stream: blocks of 16
// positions, 4 keys = 512 floats a block, scattered by a block table per request), at contexts
// 1024 (256 candidates at ratio 4: the
// top-k takes them all), 8192 (2048) and 32768 (8192). Per case and score order: the mean per
// call of 10 calls captured in one CUDA graph and replayed 5 times, the eager median of 20, and
// the bytes a call must move (the keys, the queries and weights, the scores written and read
// back by the top-k's five passes, the selection) per second in the graph, against the H200's
// 4.8 TB/s.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "kernels/testing/bench_timer.h"
#include "kernels/testing/bench_util.h"
#include "kernels/v4/indexer_topk.h"

namespace deepinfer {
namespace {

using bench::GraphMeanMs;
using bench::MedianMs;
using bench::Uniform;
using bench::Upload;
using kernels::IndexerScoreOrder;

constexpr int64_t kHeads = 64, kDim = 128, kTopk = 512;
constexpr double kPeakGBs = 4800.0;  // H200 HBM3e

void Run(int64_t batch, int64_t context, cudaStream_t stream) {
  const int64_t cands = context / 4;
  constexpr int64_t kBlockFloats = 4 * kDim;  // 16 positions at ratio 4
  const int64_t per_request = (cands * kDim + kBlockFloats - 1) / kBlockFloats;
  std::vector<int32_t> token_seq(batch), count(batch, static_cast<int32_t>(cands));
  std::vector<int32_t> tables(batch * per_request);
  for (int64_t i = 0; i < batch * per_request; ++i) {
    tables[i] = static_cast<int32_t>((i * 7919) % (batch * per_request));  // scattered
  }
  for (int64_t b = 0; b < batch; ++b) token_seq[b] = static_cast<int32_t>(b);
  kernels::IndexerTopKParams p;
  p.tokens = batch;
  p.heads = kHeads;
  p.dim = kDim;
  p.topk = kTopk;
  p.q = Upload(Uniform(batch * kHeads * kDim, 1));
  p.weights = Upload(Uniform(batch * kHeads, 2));
  p.weight_scale = 0.125f;
  p.key_scale = 0.088f;
  p.keys.data = Upload(Uniform(batch * per_request * kBlockFloats, 3));
  p.keys.block_floats = kBlockFloats;
  p.keys.block_tables = Upload(tables);
  p.keys.table_stride = per_request;
  p.keys.token_seq = Upload(token_seq);
  p.candidates = Upload(count);
  p.visible = Upload(count);
  p.selected = bench::DeviceAlloc<int32_t>(batch * kTopk * sizeof(int32_t));
  p.max_candidates = cands;
  p.workspace_bytes = kernels::IndexerTopKWorkspaceBytes(p);
  p.workspace = bench::DeviceAlloc<char>(p.workspace_bytes);
  const bool ranked = cands > kTopk;  // else the top-k takes every candidate without a pass
  const double bytes = static_cast<double>(batch) *
                       ((cands * kDim + kHeads * kDim + kHeads) * sizeof(float) +
                        (ranked ? 6 : 1) * cands * sizeof(float) + kTopk * sizeof(int32_t));
  for (IndexerScoreOrder order : {IndexerScoreOrder::kSequential, IndexerScoreOrder::kFma}) {
    p.order = order;
    const double graph_ms =
        GraphMeanMs([&](cudaStream_t s) { return kernels::IndexerTopKF32(p, s); }, stream);
    const double eager_ms = MedianMs([&] { return kernels::IndexerTopKF32(p, nullptr); });
    const double gbs = bytes / (graph_ms * 1e-3) / 1e9;
    std::printf(
        "indexer b%-4lld ctx%-6lld cands%-5lld %-11s graph %8.2f us  eager %8.2f us  "
        "%7.1f GB/s  %5.1f%% of %.1f TB/s\n",
        static_cast<long long>(batch), static_cast<long long>(context),
        static_cast<long long>(cands), order == IndexerScoreOrder::kFma ? "fma" : "sequential",
        graph_ms * 1e3, eager_ms * 1e3, gbs, 100.0 * gbs / kPeakGBs, kPeakGBs / 1000.0);
  }
}

}  // namespace
}  // namespace deepinfer

int main() {
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int64_t context : {1024, 8192, 32768}) {
    for (int64_t batch : {1, 64, 128}) deepinfer::Run(batch, context, stream);
  }
  return 0;
}
