// Times RmsNormRopeF32 at DeepSeek-V4's decode shapes (rope 64 of each row): a token's 64 query
// heads of 512 (normed in place), its key row (1 x 512), the indexer's 64 heads of 128, and 65
// and 129 rows of 512 (either side of the few-rows launch shape's limit), in each launch shape
// (RopeRows::kAuto: a row a block up to 128 rows; kWide: 8 rows a block). Per case: the eager
// median of 20 calls (launch overhead included) and the time per call of kGraphCalls calls
// recorded back to back in one CUDA graph (the decode step's setting: neighbours overlap
// through programmatic dependent launch). Then the query and the key row of a decode token as
// two calls and as one RmsNormRopePairF32. Then a prefill query's rows (RunPrefill).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
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

// A V4-Flash prefill query of kPrefillTokens tokens (64 heads x 512, rope 64; the step's rows of
// 4096 tokens of one sequence, positions 0...) three ways: RmsNormRopeF32 in place, fp32 in to
// bf16 out (RmsNormRopeToBf16, what the bf16 model ran with the q_b GEMM's fp32 output) and bf16
// in place (RmsNormRopeBf16, with the q_b GEMM's bf16 output). Eager median per call and the
// bytes read and written over it.
void RunPrefill() {
  constexpr int64_t kPrefillTokens = 4096, kHeads = 64, kDim = 512;
  const int64_t n = kPrefillTokens * kHeads * kDim;
  // A random chunk repeated over the rows (no host buffer of the whole query).
  const std::vector<float> chunk = bench::Uniform(kHeads * kDim, 1);
  std::vector<uint16_t> chunk16(chunk.size());
  for (size_t i = 0; i < chunk.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &chunk[i], sizeof(bits));
    chunk16[i] = static_cast<uint16_t>(bits >> 16);
  }
  float* x = bench::DeviceAlloc<float>(n * sizeof(float));
  uint16_t* x16 = bench::DeviceAlloc<uint16_t>(n * sizeof(uint16_t));
  uint16_t* out16 = bench::DeviceAlloc<uint16_t>(n * sizeof(uint16_t));
  for (int64_t t = 0; t < kPrefillTokens; ++t) {
    BENCH_CUDA(cudaMemcpy(x + t * kHeads * kDim, chunk.data(), chunk.size() * sizeof(float),
                          cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(x16 + t * kHeads * kDim, chunk16.data(),
                          chunk16.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
  }
  float* ones = bench::Upload(std::vector<float>(kDim, 1.0f));
  std::vector<float> inv_freq(kRope / 2);
  for (int64_t j = 0; j < kRope / 2; ++j) {
    inv_freq[j] = static_cast<float>(std::pow(10000.0, -2.0 * j / kRope));
  }
  float* inv = bench::Upload(inv_freq);
  std::vector<int32_t> positions(kPrefillTokens);
  for (int64_t t = 0; t < kPrefillTokens; ++t) positions[t] = static_cast<int32_t>(t);
  int32_t* pos = bench::Upload(positions);
  const auto f32 = [&] {
    return kernels::RmsNormRopeF32(kPrefillTokens, kHeads, kDim, x, kDim, ones, 1e-6f, x, kDim,
                                   kRope, pos, inv, 1.0f, nullptr);
  };
  const auto to16 = [&] {
    return kernels::RmsNormRopeToBf16(kPrefillTokens, kHeads, kDim, x, kDim, ones, 1e-6f, out16,
                                      kDim, kRope, pos, inv, 1.0f, nullptr);
  };
  const auto bf16 = [&] {
    return kernels::RmsNormRopeBf16(kPrefillTokens, kHeads, kDim, x16, kDim, ones, 1e-6f, x16, kDim,
                                    kRope, pos, inv, 1.0f, nullptr);
  };
  struct Case {
    const char* what;
    std::function<cudaError_t()> call;
    int64_t bytes_per_value;  // read + written
  };
  for (const Case& c :
       {Case{"fp32->fp32", f32, 8}, Case{"fp32->bf16", to16, 6}, Case{"bf16->bf16", bf16, 4}}) {
    const double ms = bench::MedianMs(c.call);
    std::printf("norm_rope prefill %-10s tokens %lld x 64 x 512  %9.1f us  %7.0f GB/s\n", c.what,
                static_cast<long long>(kPrefillTokens), ms * 1e3,
                static_cast<double>(n * c.bytes_per_value) / (ms * 1e6));
  }
  for (void* p : {static_cast<void*>(x), static_cast<void*>(x16), static_cast<void*>(out16),
                  static_cast<void*>(ones), static_cast<void*>(inv), static_cast<void*>(pos)}) {
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
  deepinfer::RunPrefill();
  return 0;
}
