// moe_prefill_bench: the expert GEMMs of one MoE layer (gate_up then down) at the Moonlight
// shape (64 experts, top-6, hidden 2048, moe_intermediate 1408, bf16 weights) for batches of
// 128 to 8192 tokens with uniform random routing, these ways:
//
//   device-grouped   GroupedGemmBf16 (offsets read on the device; what decode uses), fp32 x
//   cublas-chunkN    ExpertGemmsCublas kChunked, N rows per chunk (each expert padded to a
//                    multiple of N, one cublasGemmBatchedEx per GEMM), bf16 x
//   cublas-loop      ExpertGemmsCublas kPerExpert (one cublasGemmEx per expert), bf16 x
//   cublas-dense     one cublasGemmEx over all rows with expert 0's weights: the ceiling
//                    (same FLOPs, no grouping), bf16 x
//
// each cuBLAS way with fp32 output ("f32", what the backend used before) and bf16 output
// ("b16", what it uses now for bf16 weights).
//
// GPU time: CUDA events around the two GEMMs, median of 10 after 3 warm-ups, on a fresh routing
// every iteration (the group sizes of real prefill batches rarely repeat; cuBLAS caches its
// heuristic per shape). "host" is the wall time the host spends issuing the calls (no sync):
// when it exceeds the GPU time, the GPU waits for the host.
// TFLOP/s = 2 * rows * (2*I*H + H*I) / time; H200 dense bf16 peak 989 (SXM spec) — we quote
// 790 as in docs/performance.md.
//
// Then, at 4096 and 8192 tokens, the memory passes around the GEMMs, old and new form each
// (bench::MedianMs): the permutation (bf16 gather, padded for chunks or not), SiLU-mul (fp32
// gate_up in vs bf16 in, bf16 out), the combine (memset + fp32 expert outputs added in vs bf16
// expert outputs, out overwritten); and one whole layer the way CudaBackend::RoutedExperts runs
// it (permute, counts to the host, gate_up, SiLU-mul, down, combine): "before" = chunks of 128
// with fp32 GEMM outputs, "after" = bf16 outputs with chunks of 128 / 256.
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
#include <string>
#include <vector>

#include "kernels/activation/elementwise.h"
#include "kernels/moe/expert_activation.h"
#include "kernels/moe/expert_gemm_cublas.h"
#include "kernels/moe/grouped_gemm.h"
#include "kernels/moe/moe_permute.h"
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
  float* gu = nullptr;        // [rows, 2I] (also as bf16 [rows, 2I])
  float* act32 = nullptr;     // [rows, I]
  uint16_t* act16 = nullptr;  // [rows, I]
  float* y = nullptr;         // [rows, H] (also as bf16 [rows, H])
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
std::string Name(Way w, int chunk, bool bf16_out) {
  const char* out = bf16_out ? " b16" : " f32";
  switch (w) {
    case Way::kDeviceGrouped:
      return "device-grouped";
    case Way::kCublasChunked:
      return "cublas-chunk" + std::to_string(chunk) + out;
    case Way::kCublasLoop:
      return std::string("cublas-loop") + out;
    case Way::kCublasDense:
      return std::string("cublas-dense") + out;
  }
  return "?";
}

// Issues gate_up and down for one routing; false (after printing why) if cuBLAS refused.
bool Issue(Way way, int chunk, bool bf16_out, const Buffers& b, const std::vector<int32_t>& plan,
           int tokens, cublasHandle_t cublas) {
  const cudaDataType_t out_type = bf16_out ? CUDA_R_16BF : CUDA_R_32F;
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
                            &zero, b.gu, out_type, 2 * kInter, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
    BENCH_BLAS(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, kHidden, rows, kInter, &one,
                            b.down_ptrs[0], CUDA_R_16BF, kInter, b.act16, CUDA_R_16BF, kInter,
                            &zero, b.y, out_type, kHidden, CUBLAS_COMPUTE_32F,
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
  p.output_type = out_type;
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
    std::printf("tokens %5d  %-20s refused: %s\n", tokens, Name(way, chunk, bf16_out).c_str(),
                cublasGetStatusName(st));
    return false;
  }
  return true;
}

void RunCase(Way way, int chunk, bool bf16_out, int tokens, const Buffers& b,
             cublasHandle_t cublas) {
  std::mt19937 gen(tokens);
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  const int align = way == Way::kCublasChunked ? chunk : 1;
  std::vector<int32_t> plan = RandomPlan(tokens, align, gen);
  std::vector<double> gpu_us, host_us;
  for (int i = 0; i < kWarmup + kIters; ++i) {
    plan = RandomPlan(tokens, align, gen);
    BENCH_CUDA(cudaDeviceSynchronize());
    BENCH_CUDA(cudaEventRecord(start, nullptr));
    const auto t0 = std::chrono::steady_clock::now();
    if (!Issue(way, chunk, bf16_out, b, plan, tokens, cublas)) {
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
  std::printf("tokens %5d  %-20s %9.1f us (host issue %8.1f us)  %6.1f TFLOP/s  %5.1f%% of %g\n",
              tokens, Name(way, chunk, bf16_out).c_str(), us, host, tflops,
              100.0 * tflops / kPeakTflops, kPeakTflops);
  std::fflush(stdout);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

// A device routing of `tokens` tokens (K distinct experts each, ascending, as the router emits
// them), the hidden rows, and the permutation's and combine's buffers, sized for kMaxTokens.
struct DeviceRouting {
  int32_t* ids = nullptr;             // [tokens, K]
  int32_t* slot_of_expert = nullptr;  // [E]: identity
  float* weights = nullptr;           // [tokens, K]
  float* hidden = nullptr;            // [tokens, H]
  float* out = nullptr;               // [tokens, H]
  int32_t* plan = nullptr;            // counts [E] | offsets [E + 1]
  int32_t* choice_row = nullptr;      // [tokens, K]
  int32_t* row_token = nullptr;       // [padded rows]
  uint16_t* permuted = nullptr;       // [padded rows, H]
};

DeviceRouting MakeDeviceRouting() {
  DeviceRouting r;
  const size_t max_rows = size_t{kMaxTokens} * kTopK + size_t{kExperts} * 256;
  r.ids = DeviceAlloc<int32_t>(size_t{kMaxTokens} * kTopK * 4);
  std::vector<int32_t> identity(kExperts);
  for (int e = 0; e < kExperts; ++e) identity[e] = e;
  r.slot_of_expert = bench::Upload(identity);
  std::vector<float> w = bench::Uniform(size_t{kMaxTokens} * kTopK, 3);
  for (float& v : w) v = 0.5f + 0.5f * v;
  r.weights = bench::Upload(w);
  r.hidden = bench::Upload(bench::Uniform(size_t{kMaxTokens} * kHidden, 4));
  r.out = DeviceAlloc<float>(size_t{kMaxTokens} * kHidden * 4);
  r.plan = DeviceAlloc<int32_t>((2 * kExperts + 1) * 4);
  r.choice_row = DeviceAlloc<int32_t>(size_t{kMaxTokens} * kTopK * 4);
  r.row_token = DeviceAlloc<int32_t>(max_rows * 4);
  r.permuted = DeviceAlloc<uint16_t>(max_rows * kHidden * 2);
  return r;
}

// Fresh uniform random ids for `tokens` tokens into r.ids.
void Reroute(const DeviceRouting& r, int tokens, std::mt19937& gen) {
  std::vector<int32_t> ids, all(kExperts);
  for (int t = 0; t < tokens; ++t) {
    for (int e = 0; e < kExperts; ++e) all[e] = e;
    std::shuffle(all.begin(), all.end(), gen);
    std::sort(all.begin(), all.begin() + kTopK);
    ids.insert(ids.end(), all.begin(), all.begin() + kTopK);
  }
  BENCH_CUDA(cudaMemcpy(r.ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
}

kernels::MoePermuteParams PermuteParams(const DeviceRouting& r, int tokens, int align) {
  kernels::MoePermuteParams p;
  p.num_tokens = tokens;
  p.top_k = kTopK;
  p.num_experts = kExperts;
  p.num_slots = kExperts;
  p.topk_ids = r.ids;
  p.slot_of_expert = r.slot_of_expert;
  p.hidden_size = kHidden;
  p.hidden = r.hidden;
  p.slot_counts = r.plan;
  p.slot_offsets = r.plan + kExperts;
  p.choice_row = r.choice_row;
  p.row_token = r.row_token;
  p.permuted_hidden_bf16 = r.permuted;
  p.row_align = align;
  return p;
}

kernels::MoeCombineParams CombineParams(const DeviceRouting& r, int tokens, const void* expert_out,
                                        bool bf16) {
  kernels::MoeCombineParams c;
  c.num_tokens = tokens;
  c.top_k = kTopK;
  c.hidden_size = kHidden;
  c.choice_row = r.choice_row;
  c.topk_weights = r.weights;
  if (bf16) {
    c.expert_out_bf16 = static_cast<const uint16_t*>(expert_out);
    c.accumulate = false;
  } else {
    c.expert_out = static_cast<const float*>(expert_out);
  }
  c.out = r.out;
  return c;
}

// Old combine: zero the output, then add the fp32 expert outputs in.
cudaError_t CombineBefore(const kernels::MoeCombineParams& c) {
  const cudaError_t e =
      cudaMemsetAsync(c.out, 0, sizeof(float) * c.num_tokens * c.hidden_size, nullptr);
  return e != cudaSuccess ? e : kernels::MoeCombineF32(c, nullptr);
}

void PrintPass(int tokens, const char* name, double ms, double bytes) {
  std::printf("tokens %5d  pass %-40s %8.1f us  %7.0f GB/s of %.0f MB\n", tokens, name, ms * 1e3,
              bytes / (ms * 1e-3) / 1e9, bytes / 1e6);
  std::fflush(stdout);
}

// The memory passes around the expert GEMMs, old and new form each. Bytes: what each pass must
// move at least (hidden read once per token, every row written once, ...).
void MemoryPasses(int tokens, const Buffers& b) {
  static const DeviceRouting r = MakeDeviceRouting();
  std::mt19937 gen(tokens);
  Reroute(r, tokens, gen);
  const double rows = double{1} * tokens * kTopK, T = tokens, H = kHidden, I = kInter;
  for (int align : {128, 1}) {
    const kernels::MoePermuteParams p = PermuteParams(r, tokens, align);
    const std::string name = "permute bf16 gather, row_align " + std::to_string(align);
    PrintPass(tokens, name.c_str(),
              bench::MedianMs([&] { return kernels::MoePermuteF32(p, nullptr); }),
              T * H * 4 + rows * H * 2);
  }
  const int64_t n = tokens * kTopK;
  PrintPass(tokens, "silu-mul before: fp32 gate_up in, bf16 out", bench::MedianMs([&] {
              return kernels::SiluMulF32ToBf16(n, kInter, b.gu, b.act16, nullptr);
            }),
            rows * (2 * I * 4 + I * 2));
  PrintPass(tokens, "silu-mul after: bf16 gate_up in, bf16 out", bench::MedianMs([&] {
              return kernels::SiluMulBf16(n, kInter, reinterpret_cast<const uint16_t*>(b.gu),
                                          b.act16, nullptr);
            }),
            rows * (2 * I * 2 + I * 2));
  // choice_row of the last (unpadded) permutation; expert outputs as the GEMM runs left them.
  const kernels::MoeCombineParams before = CombineParams(r, tokens, b.y, false);
  const kernels::MoeCombineParams after = CombineParams(r, tokens, b.y, true);
  PrintPass(tokens, "combine before: memset + fp32 expert out",
            bench::MedianMs([&] { return CombineBefore(before); }), T * H * 4 * 3 + rows * H * 4);
  PrintPass(tokens, "combine after: bf16 expert out, overwrite",
            bench::MedianMs([&] { return kernels::MoeCombineF32(after, nullptr); }),
            T * H * 4 + rows * H * 2);
}

struct LayerWay {
  const char* name;
  kernels::ExpertGemmCublasAlgo algo;
  int chunk;  // row_align of the permutation
  bool bf16_out;
};

// One MoE layer's routed experts as CudaBackend::RoutedExperts runs them for a prefill batch
// (bf16 weights): permute, counts and offsets to the host (synchronising), gate_up, SiLU-mul,
// down, combine. CUDA events around all of it, median of kIters after kWarmup, a fresh routing
// each time.
void WholeLayer(int tokens, const LayerWay& w, const Buffers& b, cublasHandle_t cublas) {
  static const DeviceRouting r = MakeDeviceRouting();
  std::mt19937 gen(tokens + 7);
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  std::vector<double> us;
  std::vector<int32_t> plan(2 * kExperts + 1);
  for (int i = 0; i < kWarmup + kIters; ++i) {
    Reroute(r, tokens, gen);
    BENCH_CUDA(cudaDeviceSynchronize());
    BENCH_CUDA(cudaEventRecord(start, nullptr));
    BENCH_CUDA(kernels::MoePermuteF32(PermuteParams(r, tokens, w.chunk), nullptr));
    BENCH_CUDA(
        cudaMemcpyAsync(plan.data(), r.plan, plan.size() * 4, cudaMemcpyDeviceToHost, nullptr));
    BENCH_CUDA(cudaStreamSynchronize(nullptr));
    kernels::ExpertGemmCublasParams p;
    p.num_slots = kExperts;
    p.host_counts = plan.data();
    p.host_offsets = plan.data() + kExperts;
    p.chunk_rows = w.chunk;
    p.device_pointers = b.pointers;
    p.device_pointers_size = b.pointers_size;
    p.host_weights = b.gate_up_ptrs.data();
    p.weight_type = CUDA_R_16BF;
    p.output_type = w.bf16_out ? CUDA_R_16BF : CUDA_R_32F;
    p.n = 2 * kInter;
    p.k = kHidden;
    p.x = r.permuted;
    p.y = b.gu;
    BENCH_BLAS(kernels::ExpertGemmsCublas(cublas, p, w.algo));
    const int64_t act_rows = plan[2 * kExperts];
    if (w.bf16_out) {
      BENCH_CUDA(kernels::SiluMulBf16(act_rows, kInter, reinterpret_cast<const uint16_t*>(b.gu),
                                      b.act16, nullptr));
    } else {
      BENCH_CUDA(kernels::SiluMulF32ToBf16(act_rows, kInter, b.gu, b.act16, nullptr));
    }
    p.host_weights = b.down_ptrs.data();
    p.n = kHidden;
    p.k = kInter;
    p.x = b.act16;
    p.y = b.y;
    BENCH_BLAS(kernels::ExpertGemmsCublas(cublas, p, w.algo));
    const kernels::MoeCombineParams c = CombineParams(r, tokens, b.y, w.bf16_out);
    BENCH_CUDA(w.bf16_out ? kernels::MoeCombineF32(c, nullptr) : CombineBefore(c));
    BENCH_CUDA(cudaEventRecord(stop, nullptr));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
    if (i >= kWarmup) us.push_back(ms * 1e3);
  }
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  const double t = us[us.size() / 2];
  const double tflops = 2.0 * tokens * kTopK * (3.0 * kInter * kHidden) / (t * 1e-6) / 1e12;
  std::printf("tokens %5d  layer %-28s %9.1f us  %6.1f TFLOP/s of expert GEMMs  %5.1f%% of %g\n",
              tokens, w.name, t, tflops, 100.0 * tflops / kPeakTflops, kPeakTflops);
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
    if (tokens <= 1024) RunCase(Way::kDeviceGrouped, 0, false, tokens, b, cublas);
    for (int chunk : {64, 128, 256}) RunCase(Way::kCublasChunked, chunk, false, tokens, b, cublas);
    for (int chunk : {64, 128, 256}) RunCase(Way::kCublasChunked, chunk, true, tokens, b, cublas);
    if (tokens >= 2048) RunCase(Way::kCublasLoop, 0, true, tokens, b, cublas);
    RunCase(Way::kCublasDense, 0, false, tokens, b, cublas);
    RunCase(Way::kCublasDense, 0, true, tokens, b, cublas);
  }
  for (int tokens : {4096, 8192}) {
    MemoryPasses(tokens, b);
    for (const LayerWay& w :
         {LayerWay{"before: chunk128 f32", kernels::ExpertGemmCublasAlgo::kChunked, 128, false},
          LayerWay{"after: chunk128 b16", kernels::ExpertGemmCublasAlgo::kChunked, 128, true},
          LayerWay{"after: chunk256 b16", kernels::ExpertGemmCublasAlgo::kChunked, 256, true}}) {
      WholeLayer(tokens, w, b, cublas);
    }
  }
  cublasDestroy(cublas);
  return 0;
}

}  // namespace
}  // namespace deepinfer

int main() { return deepinfer::Main(); }
