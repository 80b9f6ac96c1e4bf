// moe_prefill_bench: the expert GEMMs of one MoE layer (gate_up then down) at the Moonlight
// shape (64 experts, top-6, hidden 2048, moe_intermediate 1408, bf16 weights) for batches of
// 128 to 8192 tokens with uniform random routing, four ways:
//
//   device-grouped   GroupedGemmBf16 (offsets read on the device; what decode uses), fp32 x
//   cublas-chunkN    ExpertGemmsCublas kChunked, N rows per chunk (each expert padded to a
//                    multiple of N, one cublasGemmBatchedEx per GEMM), bf16 x
//   cublas-loop      ExpertGemmsCublas kPerExpert (one cublasGemmEx per expert), bf16 x
//   cublas-dense     one cublasGemmEx over all rows with expert 0's weights: the ceiling
//                    (same FLOPs, no grouping), bf16 x
//
// GPU time: CUDA events around the two GEMMs, median of 10 after 3 warm-ups, on a fresh routing
// every iteration (the group sizes of real prefill batches rarely repeat; cuBLAS caches its
// heuristic per shape). "host" is the wall time the host spends issuing the calls (no sync):
// when it exceeds the GPU time, the GPU waits for the host. A cublas-loop line with the SAME
// routing every iteration (shapes cached) separates heuristic cost from launch cost.
// TFLOP/s = 2 * rows * (2*I*H + H*I) / time; H200 dense bf16 peak 989 (SXM spec) — we quote
// 790 as in docs/performance.md. (cublasGemmGroupedBatchedEx was tried first: this cuBLAS
// answers CUBLAS_STATUS_NOT_SUPPORTED for bf16 inputs with fp32 output.)
//
//   moe_prefill_bench       (one line per case; exit status 1 on a CUDA / cuBLAS error)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/moe/expert_gemm_cublas.h"
#include "kernels/moe/grouped_gemm.h"
#include "kernels/moe/moe_reference.h"
#include "kernels/testing/bench_util.h"

namespace deepinfer {
namespace {

using bench::DeviceAlloc;

#define BENCH_BLAS(expr)                                                                          \
  do {                                                                                            \
    cublasStatus_t s_ = (expr);                                                                   \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cublasGetStatusName(s_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

constexpr int kExperts = 64, kTopK = 6, kHidden = 2048, kInter = 1408;
constexpr int kWarmup = 3, kIters = 10;
constexpr int kMaxTokens = 8192;
constexpr double kPeakTflops = 790.0;

// Counts [E] then offsets [E + 1] of a uniform random routing of `tokens` tokens (K distinct
// experts each), each expert's rows padded to a multiple of `align`.
std::vector<int32_t> RandomPlan(int tokens, int align, std::mt19937& gen) {
  std::vector<int32_t> counts(kExperts, 0), all(kExperts);
  for (int t = 0; t < tokens; ++t) {
    for (int e = 0; e < kExperts; ++e) all[e] = e;
    for (int k = 0; k < kTopK; ++k) {
      std::uniform_int_distribution<int> pick(k, kExperts - 1);
      std::swap(all[k], all[pick(gen)]);
      ++counts[all[k]];
    }
  }
  std::vector<int32_t> plan(2 * kExperts + 1, 0);
  for (int e = 0; e < kExperts; ++e) {
    plan[e] = counts[e];
    plan[kExperts + e + 1] = plan[kExperts + e] + (counts[e] + align - 1) / align * align;
  }
  return plan;
}

struct Buffers {
  uint16_t* gate_up_w = nullptr;  // [E][2I, H]
  uint16_t* down_w = nullptr;     // [E][H, I]
  std::vector<const void*> gate_up_ptrs, down_ptrs;
  const uint16_t* const* gate_up_dev = nullptr;
  const uint16_t* const* down_dev = nullptr;
  float* x32 = nullptr;       // [rows, H]
  uint16_t* x16 = nullptr;    // [rows, H]
  float* gu = nullptr;        // [rows, 2I]
  float* act32 = nullptr;     // [rows, I]
  uint16_t* act16 = nullptr;  // [rows, I]
  float* y = nullptr;         // [rows, H]
  int32_t* offsets_dev = nullptr;
  void** pointers = nullptr;  // for kChunked
  int64_t pointers_size = 0;
};

Buffers Make() {
  Buffers b;
  const size_t max_rows = size_t{kMaxTokens} * kTopK + size_t{kExperts} * 256;
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  auto fill16 = [&](uint16_t* dst, size_t n) {
    std::vector<uint16_t> h(n);
    for (auto& v : h) v = kernels::FloatToBf16(normal(gen));
    BENCH_CUDA(cudaMemcpy(dst, h.data(), n * 2, cudaMemcpyHostToDevice));
  };
  const size_t gu_elems = size_t{2} * kInter * kHidden, dn_elems = size_t{kHidden} * kInter;
  b.gate_up_w = DeviceAlloc<uint16_t>(gu_elems * kExperts * 2);
  b.down_w = DeviceAlloc<uint16_t>(dn_elems * kExperts * 2);
  fill16(b.gate_up_w, gu_elems * kExperts);
  fill16(b.down_w, dn_elems * kExperts);
  for (int e = 0; e < kExperts; ++e) {
    b.gate_up_ptrs.push_back(b.gate_up_w + e * gu_elems);
    b.down_ptrs.push_back(b.down_w + e * dn_elems);
  }
  auto table = [&](const std::vector<const void*>& p) {
    auto* d = DeviceAlloc<const uint16_t*>(p.size() * sizeof(void*));
    BENCH_CUDA(cudaMemcpy(d, p.data(), p.size() * sizeof(void*), cudaMemcpyHostToDevice));
    return static_cast<const uint16_t* const*>(d);
  };
  b.gate_up_dev = table(b.gate_up_ptrs);
  b.down_dev = table(b.down_ptrs);
  b.x32 = DeviceAlloc<float>(max_rows * kHidden * 4);
  b.x16 = DeviceAlloc<uint16_t>(max_rows * kHidden * 2);
  fill16(b.x16, max_rows * kHidden);
  BENCH_CUDA(cudaMemset(b.x32, 0x3c, max_rows * kHidden * 4));  // about 0.01 everywhere
  b.gu = DeviceAlloc<float>(max_rows * 2 * kInter * 4);
  b.act32 = DeviceAlloc<float>(max_rows * kInter * 4);
  b.act16 = DeviceAlloc<uint16_t>(max_rows * kInter * 2);
  BENCH_CUDA(cudaMemset(b.act32, 0x3c, max_rows * kInter * 4));
  fill16(b.act16, max_rows * kInter);
  b.y = DeviceAlloc<float>(max_rows * kHidden * 4);
  b.offsets_dev = DeviceAlloc<int32_t>((kExperts + 1) * 4);
  b.pointers_size = kernels::ExpertGemmPointerCount(max_rows, 64);
  b.pointers = DeviceAlloc<void*>(b.pointers_size * sizeof(void*));
  return b;
}

enum class Way { kDeviceGrouped, kCublasChunked, kCublasLoop, kCublasDense };
const char* Name(Way w, int chunk) {
  static char buf[32];
  switch (w) {
    case Way::kDeviceGrouped:
      return "device-grouped";
    case Way::kCublasChunked:
      std::snprintf(buf, sizeof(buf), "cublas-chunk%d", chunk);
      return buf;
    case Way::kCublasLoop:
      return "cublas-loop";
    case Way::kCublasDense:
      return "cublas-dense";
  }
  return "?";
}

// Issues gate_up and down for one routing; false (after printing why) if cuBLAS refused.
bool Issue(Way way, int chunk, const Buffers& b, const std::vector<int32_t>& plan, int tokens,
           cublasHandle_t cublas) {
  const int rows = tokens * kTopK;
  const int32_t* offsets = plan.data() + kExperts;
  if (way == Way::kDeviceGrouped) {
    BENCH_CUDA(cudaMemcpyAsync(b.offsets_dev, offsets, (kExperts + 1) * 4, cudaMemcpyHostToDevice,
                               nullptr));
    kernels::GroupedGemmBf16Params g;
    g.num_slots = kExperts;
    g.max_rows = rows;
    g.slot_offsets = b.offsets_dev;
    g.n = 2 * kInter;
    g.k = kHidden;
    g.x = b.x32;
    g.weights = b.gate_up_dev;
    g.y = b.gu;
    g.rows_per_slot_hint = tokens;
    BENCH_CUDA(kernels::GroupedGemmBf16(g, nullptr));
    g.n = kHidden;
    g.k = kInter;
    g.x = b.act32;
    g.weights = b.down_dev;
    g.y = b.y;
    BENCH_CUDA(kernels::GroupedGemmBf16(g, nullptr));
    return true;
  }
  if (way == Way::kCublasDense) {
    const float one = 1.0f, zero = 0.0f;
    BENCH_BLAS(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, 2 * kInter, rows, kHidden, &one,
                            b.gate_up_ptrs[0], CUDA_R_16BF, kHidden, b.x16, CUDA_R_16BF, kHidden,
                            &zero, b.gu, CUDA_R_32F, 2 * kInter, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
    BENCH_BLAS(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, kHidden, rows, kInter, &one,
                            b.down_ptrs[0], CUDA_R_16BF, kInter, b.act16, CUDA_R_16BF, kInter,
                            &zero, b.y, CUDA_R_32F, kHidden, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
    return true;
  }
  const auto algo = way == Way::kCublasChunked ? kernels::ExpertGemmCublasAlgo::kChunked
                                               : kernels::ExpertGemmCublasAlgo::kPerExpert;
  kernels::ExpertGemmCublasParams p;
  p.num_slots = kExperts;
  p.host_counts = plan.data();
  p.host_offsets = offsets;
  p.chunk_rows = chunk;
  p.device_pointers_size = b.pointers_size;
  p.host_weights = b.gate_up_ptrs.data();
  p.weight_type = CUDA_R_16BF;
  p.n = 2 * kInter;
  p.k = kHidden;
  p.x = b.x16;
  p.y = b.gu;
  p.device_pointers = b.pointers;
  cublasStatus_t st = kernels::ExpertGemmsCublas(cublas, p, algo);
  if (st == CUBLAS_STATUS_SUCCESS) {
    p.host_weights = b.down_ptrs.data();
    p.n = kHidden;
    p.k = kInter;
    p.x = b.act16;
    p.y = b.y;
    st = kernels::ExpertGemmsCublas(cublas, p, algo);
  }
  if (st != CUBLAS_STATUS_SUCCESS) {
    std::printf("tokens %5d  %-15s refused: %s\n", tokens, Name(way, chunk),
                cublasGetStatusName(st));
    return false;
  }
  return true;
}

void RunCase(Way way, int chunk, int tokens, bool same_routing, const Buffers& b,
             cublasHandle_t cublas) {
  std::mt19937 gen(tokens);
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  const int align = way == Way::kCublasChunked ? chunk : 1;
  std::vector<int32_t> plan = RandomPlan(tokens, align, gen);
  std::vector<double> gpu_us, host_us;
  for (int i = 0; i < kWarmup + kIters; ++i) {
    if (!same_routing) plan = RandomPlan(tokens, align, gen);
    BENCH_CUDA(cudaDeviceSynchronize());
    BENCH_CUDA(cudaEventRecord(start, nullptr));
    const auto t0 = std::chrono::steady_clock::now();
    if (!Issue(way, chunk, b, plan, tokens, cublas)) {
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
      return;
    }
    const auto t1 = std::chrono::steady_clock::now();
    BENCH_CUDA(cudaEventRecord(stop, nullptr));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
    if (i >= kWarmup) {
      gpu_us.push_back(ms * 1e3);
      host_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
  }
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  const double us = median(gpu_us), host = median(host_us);
  const double flops = 2.0 * tokens * kTopK * (3.0 * kInter * kHidden);
  const double tflops = flops / (us * 1e-6) / 1e12;
  std::printf(
      "tokens %5d  %-15s%-14s %9.1f us (host issue %8.1f us)  %6.1f TFLOP/s  %5.1f%% of %g\n",
      tokens, Name(way, chunk), same_routing ? " same-routing" : "", us, host, tflops,
      100.0 * tflops / kPeakTflops, kPeakTflops);
  std::fflush(stdout);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

int Main() {
  int device = 0;
  BENCH_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, device));
  int cublas_version = 0;
  cublasHandle_t cublas;
  BENCH_BLAS(cublasCreate(&cublas));
  BENCH_BLAS(cublasGetVersion(cublas, &cublas_version));
  std::printf("%s, cuBLAS %d; %d experts, top-%d, hidden %d, inter %d, bf16 weights\n", prop.name,
              cublas_version, kExperts, kTopK, kHidden, kInter);
  const Buffers b = Make();
  for (int tokens : {128, 256, 512, 1024, 2048, 4096, 8192}) {
    RunCase(Way::kDeviceGrouped, 0, tokens, /*same_routing=*/false, b, cublas);
    for (int chunk : {64, 128, 256}) {
      RunCase(Way::kCublasChunked, chunk, tokens, /*same_routing=*/false, b, cublas);
    }
    RunCase(Way::kCublasLoop, 0, tokens, /*same_routing=*/false, b, cublas);
    RunCase(Way::kCublasDense, 0, tokens, /*same_routing=*/false, b, cublas);
  }
  cublasDestroy(cublas);
  return 0;
}

}  // namespace
}  // namespace deepinfer

int main() { return deepinfer::Main(); }
