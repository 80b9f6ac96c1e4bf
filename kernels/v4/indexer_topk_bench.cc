// Times IndexerTopKF32 on V4-Flash's indexer shape (64 heads x 128, top-512) at 1, 64 and 128
// decode requests, each over keys of its own (in the cache's paged stream: blocks of 16
// positions, 4 keys = 512 floats a block, scattered by a block table per request), at contexts
// 1024 (256 candidates at ratio 4: the
// top-k takes them all), 8192 (2048) and 32768 (8192). Per case and score order: the mean per
// call of 10 calls captured in one CUDA graph and replayed 5 times, the eager median of 20, and
// the bytes a call must move (the keys, the queries and weights, the scores written and read
// back by the top-k's five passes, the selection) per second in the graph, against the H200's
// 4.8 TB/s. Then (or with the argument "prefill" alone) a prefill of 8 x 4096 tokens (each token
// over its sequence's first position / 4 keys): time and the scores' TFLOP/s. Every score order
// that runs (sequential, fma, tc_bf16).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
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

// Every score order that runs on this device.
std::vector<IndexerScoreOrder> Orders() {
  std::vector<IndexerScoreOrder> orders = {IndexerScoreOrder::kSequential, IndexerScoreOrder::kFma};
  if (kernels::IndexerTopKTensorCoreRuns()) orders.push_back(IndexerScoreOrder::kTensorCoreBf16);
  return orders;
}

const char* OrderName(IndexerScoreOrder order) {
  switch (order) {
    case IndexerScoreOrder::kSequential:
      return "sequential";
    case IndexerScoreOrder::kFma:
      return "fma";
    case IndexerScoreOrder::kTensorCoreBf16:
      return "tc_bf16";
  }
  return "?";
}

// A prefill of `seqs` sequences of `len` tokens from position 0 (the benchmark's 8 x 4096):
// token p of a sequence sees its sequence's first p / 4 keys (CSA at ratio 4), the keys shared
// by the sequence's tokens. Per score order: the graph mean and eager median, and the scores'
// FLOPs (tokens with more visible keys than the top-k: the others are not scored) per second.
void RunPrefill(int64_t seqs, int64_t len, cudaStream_t stream) {
  const int64_t tokens = seqs * len, cands = len / 4;
  constexpr int64_t kBlockFloats = 4 * kDim;
  const int64_t per_seq = (cands * kDim + kBlockFloats - 1) / kBlockFloats;
  std::vector<int32_t> token_seq(tokens), visible(tokens), tables(seqs * per_seq);
  for (int64_t i = 0; i < seqs * per_seq; ++i) {
    tables[i] = static_cast<int32_t>((i * 7919) % (seqs * per_seq));
  }
  double flops = 0.0;
  for (int64_t t = 0; t < tokens; ++t) {
    token_seq[t] = static_cast<int32_t>(t / len);
    visible[t] = static_cast<int32_t>((t % len) / 4);
    if (visible[t] > kTopk) flops += 2.0 * visible[t] * kHeads * kDim;
  }
  kernels::IndexerTopKParams p;
  p.tokens = tokens;
  p.heads = kHeads;
  p.dim = kDim;
  p.topk = kTopk;
  p.q = Upload(Uniform(tokens * kHeads * kDim, 1));
  p.weights = Upload(Uniform(tokens * kHeads, 2));
  p.weight_scale = 0.125f;
  p.key_scale = 0.088f;
  p.keys.data = Upload(Uniform(seqs * per_seq * kBlockFloats, 3));
  p.keys.block_floats = kBlockFloats;
  p.keys.block_tables = Upload(tables);
  p.keys.table_stride = per_seq;
  p.keys.token_seq = Upload(token_seq);
  p.candidates = Upload(visible);
  p.visible = Upload(visible);
  p.selected = bench::DeviceAlloc<int32_t>(tokens * kTopk * sizeof(int32_t));
  p.max_candidates = cands;
  p.workspace_bytes = kernels::IndexerTopKWorkspaceBytes(p);
  p.workspace = bench::DeviceAlloc<char>(p.workspace_bytes);
  for (IndexerScoreOrder order : Orders()) {
    p.order = order;
    const double graph_ms =
        GraphMeanMs([&](cudaStream_t s) { return kernels::IndexerTopKF32(p, s); }, stream);
    const double eager_ms = MedianMs([&] { return kernels::IndexerTopKF32(p, nullptr); });
    std::printf(
        "indexer prefill %lld x %lld  %-11s graph %9.1f us  eager %9.1f us  %7.1f TFLOP/s "
        "(scores)\n",
        static_cast<long long>(seqs), static_cast<long long>(len), OrderName(order), graph_ms * 1e3,
        eager_ms * 1e3, flops / (graph_ms * 1e-3) / 1e12);
  }
}

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
  for (IndexerScoreOrder order : Orders()) {
    p.order = order;
    const double graph_ms =
        GraphMeanMs([&](cudaStream_t s) { return kernels::IndexerTopKF32(p, s); }, stream);
    const double eager_ms = MedianMs([&] { return kernels::IndexerTopKF32(p, nullptr); });
    const double gbs = bytes / (graph_ms * 1e-3) / 1e9;
    std::printf(
        "indexer b%-4lld ctx%-6lld cands%-5lld %-11s graph %8.2f us  eager %8.2f us  "
        "%7.1f GB/s  %5.1f%% of %.1f TB/s\n",
        static_cast<long long>(batch), static_cast<long long>(context),
        static_cast<long long>(cands), OrderName(order), graph_ms * 1e3, eager_ms * 1e3, gbs,
        100.0 * gbs / kPeakGBs, kPeakGBs / 1000.0);
  }
}

}  // namespace
}  // namespace deepinfer

// No argument: the decode cases, then the prefill; "prefill": the prefill only.
int main(int argc, char** argv) {
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const bool prefill_only = argc > 1 && std::strcmp(argv[1], "prefill") == 0;
  if (!prefill_only) {
    for (int64_t context : {1024, 8192, 32768}) {
      for (int64_t batch : {1, 64, 128}) deepinfer::Run(batch, context, stream);
    }
  }
  deepinfer::RunPrefill(8, 4096, stream);
  return 0;
}
