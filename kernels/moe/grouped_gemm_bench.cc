// grouped_gemm_bench: the decode expert GEMMs, every way, at 1, 8, 64, 128, 192 and 256 tokens of
// the Moonlight MoE shape (64 experts top-6; gate_up n = 2*1408, k = 2048; down n = 2048,
// k = 1408) and the DeepSeek-V3 one (256 experts top-8; gate_up n = 2*2048, k = 7168; down
// n = 7168, k = 2048), as GB/s of the ACTIVE experts' weights (the bytes a decode step must
// read) against the 4.3 TB/s copy roofline of the H200:
//   f32x-grouped    GroupedGemmBf16 kAuto, fp32 activations (the backend's path up to 2 tokens)
//   tc-hilo         GroupedGemmBf16 kTensorCore (x as bf16 hi + lo)
//   tc-bf16x        GroupedGemmBf16 kTensorCoreBf16X (x rounded to bf16: the batch-invariant
//                   mode's expert GEMMs at every size; its down GEMM)
//   tc-bf16x-in     the same with x given in bf16 (x_bf16)
//   bf16-mma        Bf16MmaGroupedGemm, bf16 x (the batch-invariant mode's expert GEMMs): the
//                   mode's launch (k split 1, kBf16BatchInvariantTile, hint twice the average
//                   rows an expert, at most the tokens), the same with the hint the average,
//                   then kBf16GroupedMmaTile (every pass the hint's row tiles) with one change
//                   each: none, k split 2 or picked from the shape, the hint the average or the
//                   tokens, the wide tile (wide+shared+2blocks, kGroupedMmaTile), all_rows (the
//                   mode's tile from a hint above 64: not reached at these sizes)
//   planned-cN      PlanExpertGemmBatches + one cublasGemmBatchedEx over chunks of N rows
//                   (padded layout, fixed batch ExpertGemmBatchBound; planner included), the
//                   dummies spread between the real chunks, fp32 or bf16 ("b16") outputs;
//                   "exact": the batch cut to the real chunks (no dummies: what a host-planned
//                   call pays, the floor for the dummies)
//
// Each timed launch is preceded by an L2 flush and timed alone with CUDA events. The flush
// READS 256 MiB (cublasIsamax) rather than writing, so no dirty L2 lines are written back during
// the timed kernel. Median of 15 after 3 warm-ups. Also times MoePermuteF32 and MoeCombineF32
// (hidden 2048).
//
// --decode: only the 1- and 2-token Moonlight GEMMs of the fp32-activation decode path (the
// backend's choice there: GroupedGemmBf16, CUDA cores), timed alone as above and back to back in
// a CUDA graph as in the decode step: launch i uses experts 6i .. 6i+5 (1 token) or 12i .. 12i+11
// (2 tokens, one row each), so no launch finds its weights in L2; time per launch = graph time
// / launches, median of 10 replays.
//
//   grouped_gemm_bench [--decode]  (prints one line per case; exit status 1 on a CUDA error)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/gemm/bf16_mma_gemm.h"
#include "kernels/moe/expert_gemm_plan.h"
#include "kernels/moe/expert_gemm_planned.h"
#include "kernels/moe/grouped_gemm.h"
#include "kernels/moe/moe_permute.h"
#include "kernels/moe/moe_reference.h"
#include "kernels/testing/bench_util.h"

namespace deepinfer {
namespace {

using bench::DeviceAlloc;
using bench::Upload;

constexpr int kExperts = 64, kTopK = 6, kWarmup = 3, kIters = 15;
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
  std::printf("%-72s %9.1f us  %8.1f GB/s  %5.1f%% of %.1f TB/s  (roofline %.1f us, %.1f MB)\n",
              name, us, gbs, 100.0 * gbs / kRooflineGBs, kRooflineGBs / 1e3,
              bytes / (kRooflineGBs * 1e9) * 1e6, bytes / 1e6);
}

struct MoeShape {
  const char* name;
  int32_t experts, top_k, n, k;
};

void RunShape(const MoeShape& shape, Timer& timer, cublasHandle_t cublas) {
  const int32_t E = shape.experts, K = shape.top_k, n = shape.n, k = shape.k;
  std::mt19937 gen(1234);
  // Weights: one random expert matrix copied to every expert (the bytes are what matters).
  const size_t per_expert = size_t(n) * k;
  std::vector<uint16_t> host_w(per_expert);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (auto& v : host_w) v = kernels::FloatToBf16(normal(gen));
  uint16_t* w = DeviceAlloc<uint16_t>(per_expert * E * sizeof(uint16_t));
  BENCH_CUDA(cudaMemcpy(w, host_w.data(), per_expert * 2, cudaMemcpyHostToDevice));
  for (int e = 1; e < E; ++e) {
    BENCH_CUDA(cudaMemcpy(w + e * per_expert, w, per_expert * 2, cudaMemcpyDeviceToDevice));
  }
  std::vector<uint64_t> ptrs(E);
  for (int e = 0; e < E; ++e) ptrs[e] = reinterpret_cast<uint64_t>(w + e * per_expert);
  uint64_t* dptrs = Upload(ptrs);

  constexpr int32_t kMaxTokens = 256, kMaxChunk = 64;
  const int64_t max_rows = int64_t{kMaxTokens} * K + int64_t{E} * (kMaxChunk - 1);
  std::vector<float> host_x(size_t(max_rows) * k);
  // 1024 random rows, repeated (values do not matter to the timing).
  const size_t random_values = std::min(host_x.size(), size_t{1024} * k);
  for (size_t i = 0; i < random_values; ++i) host_x[i] = normal(gen) * 50;
  for (size_t i = random_values; i < host_x.size(); ++i) host_x[i] = host_x[i - random_values];
  std::vector<uint16_t> host_xb(host_x.size());
  for (size_t i = 0; i < host_x.size(); ++i) host_xb[i] = kernels::FloatToBf16(host_x[i]);
  float* x = Upload(host_x);
  uint16_t* xb = Upload(host_xb);
  float* y = DeviceAlloc<float>(size_t(max_rows) * n * 4);
  float* dummy_y = DeviceAlloc<float>(size_t(kMaxChunk) * n * 4);
  uint16_t* yb = DeviceAlloc<uint16_t>(size_t(max_rows) * n * 2);
  void** pointers = DeviceAlloc<void*>(3 * size_t(max_rows) * sizeof(void*));
  int32_t* dplan = DeviceAlloc<int32_t>((2 * E + 1) * 4);  // counts | offsets

  char name[160];
  for (int32_t tokens : {1, 8, 64, 128, 192, 256}) {
    // Random distinct top-K experts per token.
    std::vector<int32_t> perm(E), counts(E, 0);
    std::iota(perm.begin(), perm.end(), 0);
    for (int t = 0; t < tokens; ++t) {
      std::shuffle(perm.begin(), perm.end(), gen);
      for (int j = 0; j < K; ++j) ++counts[perm[j]];
    }
    const int busy = static_cast<int>(
        std::count_if(counts.begin(), counts.end(), [](int32_t c) { return c > 0; }));
    const double bytes = double(busy) * per_expert * 2;
    const int32_t rows = tokens * K;
    auto upload_plan = [&](int32_t align) {
      std::vector<int32_t> plan(2 * E + 1, 0);
      for (int e = 0; e < E; ++e) {
        plan[e] = counts[e];
        plan[E + e + 1] = plan[E + e] + (counts[e] + align - 1) / align * align;
      }
      BENCH_CUDA(cudaMemcpy(dplan, plan.data(), plan.size() * 4, cudaMemcpyHostToDevice));
    };
    auto report = [&](const char* variant, double us) {
      std::snprintf(name, sizeof(name), "%s %3d tok (%3d experts) %s", shape.name, tokens, busy,
                    variant);
      Report(name, us, bytes);
    };
    upload_plan(1);
    {
      kernels::GroupedGemmBf16Params p;
      p.num_slots = E;
      p.max_rows = rows;
      p.slot_offsets = dplan + E;
      p.n = n;
      p.k = k;
      p.weights = reinterpret_cast<const uint16_t* const*>(dptrs);
      p.y = y;
      p.rows_per_slot_hint = tokens;
      p.x = x;
      report("f32x-grouped",
             timer.MedianUs([&](int) { BENCH_CUDA(kernels::GroupedGemmBf16(p, nullptr)); }));
      // The batch-invariant mode's algorithms: tensor cores at every size, x as hi + lo or
      // rounded to bf16 (the mode's choice).
      for (const auto& [variant, algo] :
           {std::pair{"tc-hilo", kernels::GroupedGemmAlgo::kTensorCore},
            std::pair{"tc-bf16x", kernels::GroupedGemmAlgo::kTensorCoreBf16X}}) {
        p.algo = algo;
        report(variant,
               timer.MedianUs([&](int) { BENCH_CUDA(kernels::GroupedGemmBf16(p, nullptr)); }));
      }
      // The mode's gate_up: x gathered in bf16.
      p.x = nullptr;
      p.x_bf16 = xb;
      report("tc-bf16x-in",
             timer.MedianUs([&](int) { BENCH_CUDA(kernels::GroupedGemmBf16(p, nullptr)); }));
    }
    {
      kernels::Bf16MmaGroupedGemmParams p;
      p.num_groups = E;
      p.max_rows = rows;
      p.offsets = dplan + E;
      p.n = n;
      p.k = k;
      p.a = xb;
      p.weights = reinterpret_cast<const uint16_t* const*>(dptrs);
      p.c = y;
      const int32_t average = std::max(1, (rows + E - 1) / E);
      p.rows_per_group_hint = std::min(tokens, 2 * average);
      p.k_split = 1;
      p.tile = kernels::kBf16BatchInvariantTile;
      struct Variant {
        const char* name;
        kernels::Bf16MmaGroupedGemmParams p;
      };
      std::vector<Variant> variants = {{"bf16-mma (mode)", p}};
      variants.push_back({"bf16-mma rows by group, hint average", p});
      variants.back().p.rows_per_group_hint = average;
      // The mode's launch without rows_by_group: every pass the hint's row tiles.
      p.tile = kernels::kBf16GroupedMmaTile;
      variants.push_back({"bf16-mma hint's tiles", p});
      variants.push_back({"bf16-mma k_split 2", p});
      variants.back().p.k_split = 2;
      variants.push_back({"bf16-mma k_split from shape", p});
      variants.back().p.k_split = 0;
      variants.push_back({"bf16-mma hint average", p});
      variants.back().p.rows_per_group_hint = average;
      variants.push_back({"bf16-mma hint tokens", p});
      variants.back().p.rows_per_group_hint = tokens;
      variants.push_back({"bf16-mma wide", p});
      variants.back().p.tile = kernels::kGroupedMmaTile;
      variants.push_back({"bf16-mma all_rows", p});
      variants.back().p.tile.all_rows = true;
      for (const Variant& v : variants) {
        if (!kernels::Bf16MmaGroupedGemmSupports(v.p)) {
          std::fprintf(stderr, "%s: not supported here\n", v.name);
          std::exit(1);
        }
        report(v.name,
               timer.MedianUs([&](int) { BENCH_CUDA(kernels::Bf16MmaGroupedGemm(v.p, nullptr)); }));
      }
    }
    // Small batches: the chunk sizes. From 64 tokens the grid of chunk sizes x output type, and
    // the exact batch.
    struct Planned {
      int32_t chunk;
      bool out_bf16, exact;
    };
    std::vector<Planned> variants;
    if (tokens < 64) {
      for (int32_t chunk : {8, 16, 32}) variants.push_back({chunk, false, false});
    } else {
      for (int32_t chunk : {16, 32, 48, 64}) {
        variants.push_back({chunk, false, false});
        variants.push_back({chunk, true, false});
        variants.push_back({chunk, false, true});
      }
    }
    for (const Planned& v : variants) {
      const int32_t chunk = v.chunk;
      upload_plan(chunk);
      int32_t real_chunks = 0;
      for (int32_t c : counts) real_chunks += (c + chunk - 1) / chunk;
      kernels::ExpertGemmPlanParams p;
      p.num_slots = E;
      p.slot_counts = dplan;
      p.slot_offsets = dplan + E;
      p.chunk_rows = chunk;
      p.batch = v.exact ? std::max(1, real_chunks) : kernels::ExpertGemmBatchBound(rows, E, chunk);
      p.num_gemms = 1;
      p.gemm[0].weights = reinterpret_cast<const void* const*>(dptrs);
      p.gemm[0].x = xb;
      p.gemm[0].x_row_bytes = int64_t{k} * 2;
      p.gemm[0].y = v.out_bf16 ? static_cast<void*>(yb) : static_cast<void*>(y);
      p.gemm[0].y_row_bytes = int64_t{n} * (v.out_bf16 ? 2 : 4);
      p.gemm[0].dummy_x = xb;
      p.gemm[0].dummy_y = dummy_y;
      p.gemm[0].pointers = pointers;
      const double us = timer.MedianUs([&](int) {
        BENCH_CUDA(kernels::PlanExpertGemmBatches(p, nullptr));
        if (kernels::PlannedExpertGemmsBf16(cublas, pointers, p.batch, n, k, chunk, v.out_bf16) !=
            CUBLAS_STATUS_SUCCESS) {
          std::fprintf(stderr, "cublasGemmBatchedEx failed\n");
          std::exit(1);
        }
      });
      char variant[96];
      std::snprintf(variant, sizeof(variant), "planned-c%d%s%s (batch %d, %d real)", chunk,
                    v.exact ? " exact" : "", v.out_bf16 ? " b16" : "", p.batch, real_chunks);
      report(variant, us);
      if (chunk == 16 && tokens < 64) {
        report("planner kernel alone", timer.MedianUs([&](int) {
          BENCH_CUDA(kernels::PlanExpertGemmBatches(p, nullptr));
        }));
      }
    }
  }
  for (void* ptr :
       {static_cast<void*>(w), static_cast<void*>(dptrs), static_cast<void*>(x),
        static_cast<void*>(xb), static_cast<void*>(y), static_cast<void*>(dummy_y),
        static_cast<void*>(yb), static_cast<void*>(pointers), static_cast<void*>(dplan)}) {
    cudaFree(ptr);
  }
}

// Microseconds per launch of a graph of launch(i, stream) for i < launches, back to back.
template <typename Fn>
double GraphUsPerLaunch(int launches, Fn launch) {
  cudaStream_t st;
  BENCH_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph;
  BENCH_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < launches; ++i) launch(i, st);
  BENCH_CUDA(cudaStreamEndCapture(st, &graph));
  cudaGraphExec_t exec;
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int i = 0; i < 2 + 10; ++i) {
    BENCH_CUDA(cudaEventRecord(start, st));
    BENCH_CUDA(cudaGraphLaunch(exec, st));
    BENCH_CUDA(cudaEventRecord(stop, st));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, start, stop));
    if (i >= 2) ms.push_back(t);
  }
  BENCH_CUDA(cudaEventDestroy(start));
  BENCH_CUDA(cudaEventDestroy(stop));
  BENCH_CUDA(cudaGraphExecDestroy(exec));
  BENCH_CUDA(cudaGraphDestroy(graph));
  BENCH_CUDA(cudaStreamDestroy(st));
  std::sort(ms.begin(), ms.end());
  return 1000.0 * ms[ms.size() / 2] / launches;
}

// --decode: the CUDA-core grouped kernel at 1 and 2 tokens, alone and in a graph.
void RunDecode(const MoeShape& shape, Timer& timer) {
  const int32_t E = shape.experts, K = shape.top_k, n = shape.n, k = shape.k;
  const size_t per_expert = size_t(n) * k;
  std::vector<uint16_t> host_w(per_expert);
  std::mt19937 gen(1234);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (auto& v : host_w) v = kernels::FloatToBf16(normal(gen));
  uint16_t* w = DeviceAlloc<uint16_t>(per_expert * E * sizeof(uint16_t));
  BENCH_CUDA(cudaMemcpy(w, host_w.data(), per_expert * 2, cudaMemcpyHostToDevice));
  for (int e = 1; e < E; ++e) {
    BENCH_CUDA(cudaMemcpy(w + e * per_expert, w, per_expert * 2, cudaMemcpyDeviceToDevice));
  }
  std::vector<uint64_t> ptrs(E);
  for (int e = 0; e < E; ++e) ptrs[e] = reinterpret_cast<uint64_t>(w + e * per_expert);
  uint64_t* dptrs = Upload(ptrs);
  std::vector<float> host_x(size_t(2) * K * k);
  for (auto& v : host_x) v = normal(gen) * 50;
  float* x = Upload(host_x);
  float* y = DeviceAlloc<float>(size_t(2) * K * n * 4);
  for (int32_t tokens : {1, 2}) {
    const int32_t busy = tokens * K, launches = E / busy;
    // Launch i: experts busy*i .. busy*i + busy - 1, one row each.
    std::vector<int32_t> offsets(size_t(launches) * (E + 1), 0);
    for (int i = 0; i < launches; ++i) {
      int32_t* o = offsets.data() + size_t(i) * (E + 1);
      for (int e = 0; e < E; ++e) o[e + 1] = o[e] + (e >= busy * i && e < busy * (i + 1));
    }
    int32_t* doffsets = Upload(offsets);
    const double bytes = double(busy) * per_expert * 2;
    {
      const char* variant = "f32x kCudaCore";
      kernels::GroupedGemmBf16Params p;
      p.num_slots = E;
      p.max_rows = busy;
      p.n = n;
      p.k = k;
      p.x = x;
      p.weights = reinterpret_cast<const uint16_t* const*>(dptrs);
      p.y = y;
      p.rows_per_slot_hint = tokens;
      p.algo = kernels::GroupedGemmAlgo::kCudaCore;
      auto launch = [&](int i, cudaStream_t st) {
        kernels::GroupedGemmBf16Params q = p;
        q.slot_offsets = doffsets + size_t(i) * (E + 1);
        BENCH_CUDA(kernels::GroupedGemmBf16(q, st));
      };
      char name[160];
      std::snprintf(name, sizeof(name), "%s %d tok (%2d experts) %s alone", shape.name, tokens,
                    busy, variant);
      Report(name, timer.MedianUs([&](int) { launch(0, nullptr); }), bytes);
      std::snprintf(name, sizeof(name), "%s %d tok (%2d experts) %s graph x%d", shape.name, tokens,
                    busy, variant, launches);
      Report(name, GraphUsPerLaunch(launches, launch), bytes);
      std::fflush(stdout);
    }
    cudaFree(doffsets);
  }
  for (void* ptr : {static_cast<void*>(w), static_cast<void*>(dptrs), static_cast<void*>(x),
                    static_cast<void*>(y)}) {
    cudaFree(ptr);
  }
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

int main(int argc, char** argv) {
  const bool decode_only = argc == 2 && std::string_view(argv[1]) == "--decode";
  if (argc > 2 || (argc == 2 && !decode_only)) {
    std::fprintf(stderr, "usage: grouped_gemm_bench [--decode]\n");
    return 2;
  }
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
  // Moonlight first (the 4-layer bench's shape), then DeepSeek-V3.
  const deepinfer::MoeShape shapes[] = {{"moonlight gate_up n=2816 k=2048", 64, 6, 2816, 2048},
                                        {"moonlight down    n=2048 k=1408", 64, 6, 2048, 1408},
                                        {"v3 gate_up n=4096 k=7168", 256, 8, 4096, 7168},
                                        {"v3 down    n=7168 k=2048", 256, 8, 7168, 2048}};
  if (decode_only) {
    deepinfer::RunDecode(shapes[0], timer);
    deepinfer::RunDecode(shapes[1], timer);
    cublasDestroy(cublas);
    return 0;
  }
  for (const auto& shape : shapes) deepinfer::RunShape(shape, timer, cublas);
  std::fflush(stdout);
  deepinfer::RunPermuteCombine(128, timer);
  deepinfer::RunPermuteCombine(1, timer);
  cublasDestroy(cublas);
  return 0;
}
