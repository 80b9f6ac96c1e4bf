// grouped_gemm_bench: achieved HBM bandwidth of GroupedGemmBf16 at the Moonlight MoE shapes
// (64 experts; gate_up n = 2*1408, k = 2048; down n = 2048, k = 1408) for 128 tokens x top-6
// (768 rows, every expert busy) and 1 token x top-6 (6 rows, 6 experts), against the 4.3 TB/s
// copy roofline of the H200. For reference it also times today's path (one cublasSgemm per
// expert on fp32 weights, offsets known on the host).
//
// Each timed launch is preceded by an L2 flush and timed alone with CUDA events; the 1-token
// case also rotates through 10 disjoint expert sets. The flush READS 256 MiB (cublasIsamax)
// rather than writing, so no dirty L2 lines are written back during the timed kernel (a
// memset flush gave numbers within about 10 % of these, either way, on the H200). Median of
// 50 after 5 warm-ups. Bytes = weights of the busy experts + x + y. Also times MoePermuteF32 and
// MoeCombineF32 at the same shapes (hidden 2048).
//
//   grouped_gemm_bench            (prints one line per case; exit status 1 on a CUDA error)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "kernels/moe/grouped_gemm.h"
#include "kernels/moe/moe_permute.h"
#include "kernels/moe/moe_reference.h"
#include "kernels/testing/bench_util.h"

namespace deepinfer {
namespace {

using bench::DeviceAlloc;

constexpr int kExperts = 64, kTopK = 6, kWarmup = 5, kIters = 50;
constexpr double kRooflineGBs = 4300.0;

struct Timer {
  explicit Timer(cublasHandle_t cublas) : cublas(cublas) {
    BENCH_CUDA(cudaEventCreate(&start));
    BENCH_CUDA(cudaEventCreate(&stop));
    flush = DeviceAlloc<float>(kFlushBytes);
    BENCH_CUDA(cudaMemset(flush, 0x3c, kFlushBytes));
  }
  ~Timer() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaFree(flush);
  }
  // Median microseconds of fn(i) over kIters, each after an L2 flush.
  template <typename Fn>
  double MedianUs(Fn fn) {
    std::vector<float> ms;
    for (int i = 0; i < kWarmup + kIters; ++i) {
      int max_at = 0;  // host result: returns once the read pass is done
      if (cublasIsamax(cublas, kFlushBytes / 4, flush, 1, &max_at) != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "cublasIsamax failed\n");
        std::exit(1);
      }
      BENCH_CUDA(cudaEventRecord(start, nullptr));
      fn(i);
      BENCH_CUDA(cudaEventRecord(stop, nullptr));
      BENCH_CUDA(cudaEventSynchronize(stop));
      float t = 0;
      BENCH_CUDA(cudaEventElapsedTime(&t, start, stop));
      if (i >= kWarmup) ms.push_back(t);
    }
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    return ms[ms.size() / 2] * 1e3;
  }
  static constexpr size_t kFlushBytes = size_t{256} << 20;
  cublasHandle_t cublas;
  cudaEvent_t start, stop;
  float* flush = nullptr;
};

void Report(const char* name, double us, double bytes) {
  const double gbs = bytes / (us * 1e-6) / 1e9;
  std::printf("%-44s %9.1f us  %8.1f GB/s  %5.1f%% of %.1f TB/s  (roofline %.1f us, %.1f MB)\n",
              name, us, gbs, 100.0 * gbs / kRooflineGBs, kRooflineGBs / 1e3,
              bytes / (kRooflineGBs * 1e9) * 1e6, bytes / 1e6);
}

void RunShape(const char* shape, int32_t n, int32_t k, Timer& timer, cublasHandle_t cublas) {
  std::mt19937 gen(1234);
  // Weights: one random expert matrix, copied to every expert (the bytes are what matters).
  const size_t per_expert = size_t(n) * k;
  std::vector<uint16_t> host_w(per_expert);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (auto& v : host_w) v = kernels::FloatToBf16(normal(gen));
  uint16_t* w = DeviceAlloc<uint16_t>(per_expert * kExperts * sizeof(uint16_t));
  for (int e = 0; e < kExperts; ++e) {
    BENCH_CUDA(
        cudaMemcpy(w + e * per_expert, host_w.data(), per_expert * 2, cudaMemcpyHostToDevice));
  }
  std::vector<uint64_t> ptrs(kExperts);
  for (int e = 0; e < kExperts; ++e) ptrs[e] = reinterpret_cast<uint64_t>(w + e * per_expert);
  uint64_t* dptrs = DeviceAlloc<uint64_t>(kExperts * sizeof(uint64_t));
  BENCH_CUDA(cudaMemcpy(dptrs, ptrs.data(), kExperts * 8, cudaMemcpyHostToDevice));

  const int32_t max_rows = 128 * kTopK;
  std::vector<float> host_x(size_t(max_rows) * k);
  for (auto& v : host_x) v = normal(gen) * 50;
  float* x = DeviceAlloc<float>(host_x.size() * 4);
  float* y = DeviceAlloc<float>(size_t(max_rows) * n * 4);
  BENCH_CUDA(cudaMemcpy(x, host_x.data(), host_x.size() * 4, cudaMemcpyHostToDevice));

  // Routing cases: offsets for 128 random tokens, and 10 disjoint single-token expert sets.
  std::vector<int32_t> perm(kExperts);
  std::iota(perm.begin(), perm.end(), 0);
  std::vector<int32_t> counts(kExperts, 0);
  for (int t = 0; t < 128; ++t) {
    std::shuffle(perm.begin(), perm.end(), gen);
    for (int j = 0; j < kTopK; ++j) ++counts[perm[j]];
  }
  std::vector<std::vector<int32_t>> offsets_sets;
  auto add_offsets = [&](const std::vector<int32_t>& c) {
    std::vector<int32_t> off(kExperts + 1, 0);
    for (int e = 0; e < kExperts; ++e) off[e + 1] = off[e] + c[e];
    offsets_sets.push_back(off);
  };
  add_offsets(counts);
  constexpr int kSingleSets = kExperts / kTopK;
  for (int s = 0; s < kSingleSets; ++s) {
    std::vector<int32_t> c(kExperts, 0);
    for (int j = 0; j < kTopK; ++j) c[s * kTopK + j] = 1;
    add_offsets(c);
  }
  int32_t* doff = DeviceAlloc<int32_t>(offsets_sets.size() * (kExperts + 1) * 4);
  for (size_t i = 0; i < offsets_sets.size(); ++i) {
    BENCH_CUDA(cudaMemcpy(doff + i * (kExperts + 1), offsets_sets[i].data(), (kExperts + 1) * 4,
                          cudaMemcpyHostToDevice));
  }

  kernels::GroupedGemmBf16Params p;
  p.num_slots = kExperts;
  p.n = n;
  p.k = k;
  p.x = x;
  p.weights = reinterpret_cast<const uint16_t* const*>(dptrs);
  p.y = y;
  char name[128];
  const std::pair<kernels::GroupedGemmAlgo, const char*> algos[] = {
      {kernels::GroupedGemmAlgo::kCudaCore, "cuda-core"},
      {kernels::GroupedGemmAlgo::kTensorCore, "tensor-core"}};
  for (const auto& [algo, algo_name] : algos) {
    p.algo = algo;
    {  // 128 tokens x top-6.
      p.max_rows = max_rows;
      p.rows_per_slot_hint = 128;
      p.slot_offsets = doff;
      const double us =
          timer.MedianUs([&](int) { BENCH_CUDA(kernels::GroupedGemmBf16(p, nullptr)); });
      const double bytes = double(kExperts) * per_expert * 2 + double(max_rows) * (k + n) * 4;
      std::snprintf(name, sizeof(name), "%s 128 tok x top6 bf16 %s", shape, algo_name);
      Report(name, us, bytes);
    }
    if (algo == kernels::GroupedGemmAlgo::kTensorCore) {
      // A tighter rows_per_slot_hint (the busiest slot has about 25 rows here) picks a smaller
      // register tile (more resident warps).
      for (int hint : {16, 32}) {
        p.max_rows = max_rows;
        p.rows_per_slot_hint = hint;
        p.slot_offsets = doff;
        const double us =
            timer.MedianUs([&](int) { BENCH_CUDA(kernels::GroupedGemmBf16(p, nullptr)); });
        const double bytes = double(kExperts) * per_expert * 2 + double(max_rows) * (k + n) * 4;
        std::snprintf(name, sizeof(name), "%s 128 tok x top6 bf16 %s hint %d", shape, algo_name,
                      hint);
        Report(name, us, bytes);
      }
    }
    {  // 1 token x top-6.
      p.max_rows = kTopK;
      p.rows_per_slot_hint = 1;
      const double us = timer.MedianUs([&](int i) {
        p.slot_offsets = doff + (1 + i % kSingleSets) * (kExperts + 1);
        BENCH_CUDA(kernels::GroupedGemmBf16(p, nullptr));
      });
      const double bytes = double(kTopK) * per_expert * 2 + double(kTopK) * (k + n) * 4;
      std::snprintf(name, sizeof(name), "%s 1 tok x top6 bf16 %s", shape, algo_name);
      Report(name, us, bytes);
    }
  }
  BENCH_CUDA(cudaFree(w));

  // Today's path for comparison: fp32 weights, one cublasSgemm per busy expert.
  std::vector<float> host_wf(per_expert);
  for (size_t i = 0; i < per_expert; ++i) host_wf[i] = kernels::Bf16ToFloat(host_w[i]);
  float* wf = DeviceAlloc<float>(per_expert * kExperts * 4);
  for (int e = 0; e < kExperts; ++e) {
    BENCH_CUDA(
        cudaMemcpy(wf + e * per_expert, host_wf.data(), per_expert * 4, cudaMemcpyHostToDevice));
  }
  auto sgemm_groups = [&](const std::vector<int32_t>& off) {
    const float one = 1.0f, zero = 0.0f;
    for (int e = 0; e < kExperts; ++e) {
      const int rows = off[e + 1] - off[e];
      if (rows == 0) continue;
      if (cublasSgemm(cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &one, wf + e * per_expert, k,
                      x + size_t(off[e]) * k, k, &zero, y + size_t(off[e]) * n,
                      n) != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "cublasSgemm failed\n");
        std::exit(1);
      }
    }
  };
  {
    const double us = timer.MedianUs([&](int) { sgemm_groups(offsets_sets[0]); });
    const double bytes = double(kExperts) * per_expert * 4 + double(max_rows) * (k + n) * 4;
    std::snprintf(name, sizeof(name), "%s 128 tok x top6 fp32 cublasSgemm/expert", shape);
    Report(name, us, bytes);
  }
  {
    const double us =
        timer.MedianUs([&](int i) { sgemm_groups(offsets_sets[1 + i % kSingleSets]); });
    const double bytes = double(kTopK) * per_expert * 4 + double(kTopK) * (k + n) * 4;
    std::snprintf(name, sizeof(name), "%s 1 tok x top6 fp32 cublasSgemm/expert", shape);
    Report(name, us, bytes);
  }
  cudaFree(wf);
  cudaFree(x);
  cudaFree(y);
  cudaFree(dptrs);
  cudaFree(doff);
}

void RunPermuteCombine(int32_t tokens, Timer& timer) {
  const int32_t hidden = 2048, choices = tokens * kTopK;
  std::mt19937 gen(99);
  std::vector<int32_t> ids, map(kExperts);
  std::iota(map.begin(), map.end(), 0);
  std::vector<int32_t> perm = map;
  for (int t = 0; t < tokens; ++t) {
    std::shuffle(perm.begin(), perm.end(), gen);
    ids.insert(ids.end(), perm.begin(), perm.begin() + kTopK);
  }
  std::vector<float> host(size_t(choices) * hidden, 0.5f);
  int32_t* dids = DeviceAlloc<int32_t>(choices * 4);
  int32_t* dmap = DeviceAlloc<int32_t>(kExperts * 4);
  int32_t* ints = DeviceAlloc<int32_t>((kExperts * 2 + 1 + choices * 2) * 4);
  float* hid = DeviceAlloc<float>(size_t(tokens) * hidden * 4);
  float* perm_h = DeviceAlloc<float>(size_t(choices) * hidden * 4);
  float* wts = DeviceAlloc<float>(choices * 4);
  float* out = DeviceAlloc<float>(size_t(tokens) * hidden * 4);
  BENCH_CUDA(cudaMemcpy(dids, ids.data(), choices * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(dmap, map.data(), kExperts * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(hid, host.data(), size_t(tokens) * hidden * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(perm_h, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(wts, host.data(), choices * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(out, host.data(), size_t(tokens) * hidden * 4, cudaMemcpyHostToDevice));
  kernels::MoePermuteParams p;
  p.num_tokens = tokens;
  p.top_k = kTopK;
  p.num_experts = kExperts;
  p.num_slots = kExperts;
  p.topk_ids = dids;
  p.slot_of_expert = dmap;
  p.hidden_size = hidden;
  p.hidden = hid;
  p.slot_counts = ints;
  p.slot_offsets = ints + kExperts;
  p.choice_row = ints + 2 * kExperts + 1;
  p.row_token = ints + 2 * kExperts + 1 + choices;
  p.permuted_hidden = perm_h;
  char name[128];
  std::snprintf(name, sizeof(name), "MoePermuteF32 %d tok x top6 hidden 2048", tokens);
  double us = timer.MedianUs([&](int) { BENCH_CUDA(kernels::MoePermuteF32(p, nullptr)); });
  Report(name, us, double(choices) * hidden * 4 * 2);
  kernels::MoeCombineParams c;
  c.num_tokens = tokens;
  c.top_k = kTopK;
  c.hidden_size = hidden;
  c.choice_row = p.choice_row;
  c.topk_weights = wts;
  c.expert_out = perm_h;
  c.out = out;
  std::snprintf(name, sizeof(name), "MoeCombineF32 %d tok x top6 hidden 2048", tokens);
  us = timer.MedianUs([&](int) { BENCH_CUDA(kernels::MoeCombineF32(c, nullptr)); });
  Report(name, us, double(choices) * hidden * 4 + double(tokens) * hidden * 8);
  for (void* ptr : {static_cast<void*>(dids), static_cast<void*>(dmap), static_cast<void*>(ints),
                    static_cast<void*>(hid), static_cast<void*>(perm_h), static_cast<void*>(wts),
                    static_cast<void*>(out)}) {
    cudaFree(ptr);
  }
}

}  // namespace
}  // namespace deepinfer

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "grouped_gemm_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  cublasHandle_t cublas;
  if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) return 1;
  deepinfer::Timer timer(cublas);
  deepinfer::RunShape("gate_up n=2816 k=2048", 2 * 1408, 2048, timer, cublas);
  deepinfer::RunShape("down    n=2048 k=1408", 2048, 1408, timer, cublas);
  deepinfer::RunPermuteCombine(128, timer);
  deepinfer::RunPermuteCombine(1, timer);
  cublasDestroy(cublas);
  return 0;
}
