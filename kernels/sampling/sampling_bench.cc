// sampling_bench: time of the sampling kernels at DeepSeek-V3's vocabulary (129280), then
// Moonlight's (163840), for 1, 64, 128 and 256 rows, against the time to read the logits once
// at the H200's 4.3 TB/s copy roofline: ArgmaxRowsF32, GreedySampleRowsF32, SampleRowsF32
// (temperature only, top-k 50, top-p 0.9, both, and T 0.8 with top-p 0.95) and
// TopLogprobsF32 (n 5 and 20).
//
// Each timed launch follows a 256 MiB memset (so the logits come from HBM, not L2) and is
// timed alone with CUDA events; median of 20 after 3 warm-ups.
//
//   sampling_bench            (one line per case; exit status 1 on a CUDA error)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/sampling/argmax.h"
#include "kernels/sampling/sample.h"
#include "kernels/testing/bench_util.h"

namespace deepinfer {
namespace {

using bench::DeviceAlloc;

constexpr int64_t kVocabs[] = {129280, 163840};
constexpr int64_t kMaxVocab = 163840;
constexpr int kWarmup = 3, kIters = 20;
constexpr double kRooflineGBs = 4300.0;
constexpr size_t kFlushBytes = size_t{256} << 20;

struct Timer {
  Timer() {
    BENCH_CUDA(cudaEventCreate(&start));
    BENCH_CUDA(cudaEventCreate(&stop));
    flush = DeviceAlloc<char>(kFlushBytes);
  }
  ~Timer() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaFree(flush);
  }
  template <typename Fn>
  double MedianUs(Fn fn) {
    std::vector<float> ms;
    for (int i = 0; i < kWarmup + kIters; ++i) {
      BENCH_CUDA(cudaMemset(flush, i & 0xff, kFlushBytes));
      BENCH_CUDA(cudaEventRecord(start, nullptr));
      BENCH_CUDA(fn());
      BENCH_CUDA(cudaEventRecord(stop, nullptr));
      BENCH_CUDA(cudaEventSynchronize(stop));
      float t = 0;
      BENCH_CUDA(cudaEventElapsedTime(&t, start, stop));
      if (i >= kWarmup) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return 1000.0 * ms[ms.size() / 2];
  }
  cudaEvent_t start, stop;
  char* flush;
};

void Report(const char* op, const std::string& variant, int64_t vocab, int64_t rows, double us) {
  const double bytes = static_cast<double>(rows) * vocab * sizeof(float);
  const double roofline_us = bytes / (kRooflineGBs * 1e3);
  std::printf(
      "%-12s %-14s vocab %6lld rows %4lld  %9.1f us  %7.1f GB/s  read-once roofline %.1f us "
      "(%.0f%%)\n",
      op, variant.c_str(), static_cast<long long>(vocab), static_cast<long long>(rows), us,
      bytes / (us * 1e3), roofline_us, 100.0 * roofline_us / us);
  std::fflush(stdout);
}

int Main() {
  const int64_t max_rows = 256;
  std::vector<float> host(max_rows * kMaxVocab);
  std::mt19937 gen(1);
  std::normal_distribution<float> d(0.0f, 2.5f);
  for (float& x : host) x = d(gen);
  float* logits = DeviceAlloc<float>(host.size() * sizeof(float));
  BENCH_CUDA(cudaMemcpy(logits, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  void* ws = DeviceAlloc<char>(kernels::ArgmaxWorkspaceBytes(max_rows, kMaxVocab));
  int32_t* tok = DeviceAlloc<int32_t>(max_rows * kMaxTopLogprobs * sizeof(int32_t));
  float* lp = DeviceAlloc<float>(max_rows * kMaxTopLogprobs * sizeof(float));
  RowSamplingParams* params = DeviceAlloc<RowSamplingParams>(max_rows * sizeof(RowSamplingParams));
  Timer timer;
  struct Variant {
    const char* name;
    float temperature;
    int32_t top_k;
    float top_p;
  };
  const Variant variants[] = {{"T=1", 1.0f, 0, 1.0f},
                              {"T=1,k=50", 1.0f, 50, 1.0f},
                              {"T=1,p=0.9", 1.0f, 0, 0.9f},
                              {"T=1,k=50,p=.9", 1.0f, 50, 0.9f},
                              {"T=.8,p=.95", 0.8f, 0, 0.95f}};
  for (int64_t vocab : kVocabs) {
    for (int64_t rows : {1, 64, 128, 256}) {
      Report("ArgmaxRows", "", vocab, rows, timer.MedianUs([&] {
        return kernels::ArgmaxRowsF32(rows, vocab, logits, ws, tok, nullptr);
      }));
      Report("GreedySample", "", vocab, rows, timer.MedianUs([&] {
        return kernels::GreedySampleRowsF32(rows, vocab, logits, ws, tok, lp, nullptr);
      }));
      for (const Variant& v : variants) {
        std::vector<RowSamplingParams> p(rows);
        for (int64_t r = 0; r < rows; ++r) {
          p[r].temperature = v.temperature;
          p[r].top_k = v.top_k;
          p[r].top_p = v.top_p;
          p[r].seed = 1000 + r;
          p[r].position = r;
        }
        BENCH_CUDA(
            cudaMemcpy(params, p.data(), rows * sizeof(RowSamplingParams), cudaMemcpyHostToDevice));
        Report("SampleRows", v.name, vocab, rows, timer.MedianUs([&] {
          return kernels::SampleRowsF32(rows, vocab, logits, params, tok, lp, nullptr);
        }));
      }
      for (int32_t n : {5, kMaxTopLogprobs}) {
        Report("TopLogprobs", "n=" + std::to_string(n), vocab, rows, timer.MedianUs([&] {
          return kernels::TopLogprobsF32(rows, vocab, logits, n, tok, lp, nullptr);
        }));
      }
    }
  }
  BENCH_CUDA(cudaDeviceSynchronize());
  return 0;
}

}  // namespace
}  // namespace deepinfer

int main() { return deepinfer::Main(); }
