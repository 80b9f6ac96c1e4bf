// small_m_gemm_bench: the decode-step GEMMs of the Moonlight shape (hidden 2048, 16 heads,
// kv_lora 512, shared experts 2 x 1408, dense intermediate 11264, vocab 129280) at m = 1 and
// m = 4 rows, three ways: cuBLAS on an fp32 activation rounded to bf16 first (the CudaBackend's
// Gemm before this kernel: two launches), cuBLAS on an activation already in bf16 (one launch),
// and SmallMGemmBf16 reading the fp32 activation in both layouts (kRowPerGroup, kSplitK). Each
// timed launch follows an L2 flush (a 256 MiB read), as in the model, where no layer's weights
// are still in L2. Median of 30. A launch timed alone this way carries a few microseconds of
// event and launch overhead, so the small-m kernels are also timed as in the decode graph: a
// CUDA graph of back-to-back launches, each on its own copy of the weights (copies enough for
// 256 MiB, so no launch finds its weights in L2), time per launch = graph time / launches
// (median of 10 replays). Bandwidth = weight bytes / time against the H200's 4.3 TB/s.
//
//   small_m_gemm_bench            (one line per case; exit status 1 on a CUDA error)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "kernels/activation/elementwise.h"
#include "kernels/gemm/small_m_gemm.h"
#include "kernels/testing/bench_util.h"

namespace deepinfer {
namespace {

using bench::DeviceAlloc;

constexpr size_t kFlushBytes = size_t{256} << 20;
constexpr int kIters = 30;

void Blas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s failed: %d\n", what, static_cast<int>(st));
    std::exit(1);
  }
}

struct Shape {
  const char* name;
  int64_t batch, n, k;  // per product: [m, k] x [n, k]^T
};

class Bench {
 public:
  Bench() {
    Blas(cublasCreate(&cublas_), "cublasCreate");
    flush_ = DeviceAlloc<float>(kFlushBytes);
    BENCH_CUDA(cudaMemset(flush_, 0, kFlushBytes));
    BENCH_CUDA(cudaEventCreate(&start_));
    BENCH_CUDA(cudaEventCreate(&stop_));
  }

  template <typename Fn>
  double MedianUs(Fn fn) {
    std::vector<float> ms;
    for (int i = 0; i < 3 + kIters; ++i) {
      int at = 0;
      Blas(cublasIsamax(cublas_, kFlushBytes / 4, flush_, 1, &at), "cublasIsamax");
      BENCH_CUDA(cudaEventRecord(start_));
      fn();
      BENCH_CUDA(cudaEventRecord(stop_));
      BENCH_CUDA(cudaEventSynchronize(stop_));
      float t = 0;
      BENCH_CUDA(cudaEventElapsedTime(&t, start_, stop_));
      if (i >= 3) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return 1000.0 * ms[ms.size() / 2];
  }

  // Microseconds per launch of a graph holding launch(ws[i], stream) for every i, back to back.
  template <typename Fn>
  double GraphUs(const std::vector<uint16_t*>& ws, Fn launch) {
    cudaStream_t st;
    BENCH_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t graph;
    BENCH_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (const uint16_t* wi : ws) launch(wi, st);
    BENCH_CUDA(cudaStreamEndCapture(st, &graph));
    cudaGraphExec_t exec;
    BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    std::vector<float> ms;
    for (int i = 0; i < 2 + 10; ++i) {
      BENCH_CUDA(cudaEventRecord(start_, st));
      BENCH_CUDA(cudaGraphLaunch(exec, st));
      BENCH_CUDA(cudaEventRecord(stop_, st));
      BENCH_CUDA(cudaEventSynchronize(stop_));
      float t = 0;
      BENCH_CUDA(cudaEventElapsedTime(&t, start_, stop_));
      if (i >= 2) ms.push_back(t);
    }
    BENCH_CUDA(cudaGraphExecDestroy(exec));
    BENCH_CUDA(cudaGraphDestroy(graph));
    BENCH_CUDA(cudaStreamDestroy(st));
    std::sort(ms.begin(), ms.end());
    return 1000.0 * ms[ms.size() / 2] / static_cast<double>(ws.size());
  }

  void Run(const Shape& s, int64_t m) {
    const int64_t k = s.k, n = s.n, B = s.batch;
    const std::vector<float> host_a = bench::Uniform(B * m * k, 1);
    float* a = bench::Upload(host_a);
    uint16_t* a16 = DeviceAlloc<uint16_t>(B * m * k * 2);
    BENCH_CUDA(kernels::RoundF32ToBf16(B * m * k, a, a16, nullptr));
    uint16_t* w = DeviceAlloc<uint16_t>(B * n * k * 2);
    BENCH_CUDA(kernels::RoundF32ToBf16(B * n * k, FillF32(B * n * k), w, nullptr));
    float* c = DeviceAlloc<float>(B * m * n * 4);
    const float alpha = 1.0f, beta = 0.0f;
    auto cublas_bf16 = [&](const void* act) {
      if (B == 1) {
        Blas(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, k,
                          act, CUDA_R_16BF, k, &beta, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx");
      } else {
        Blas(cublasGemmStridedBatchedEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w,
                                        CUDA_R_16BF, k, n * k, act, CUDA_R_16BF, k, m * k, &beta, c,
                                        CUDA_R_32F, n, m * n, B, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT),
             "cublasGemmStridedBatchedEx");
      }
    };
    const double t_round = MedianUs([&] {
      BENCH_CUDA(kernels::RoundF32ToBf16(B * m * k, a, a16, nullptr));
      cublas_bf16(a16);
    });
    const double t_cublas = MedianUs([&] { cublas_bf16(a16); });
    kernels::SmallMGemmParams p;
    p.m = m, p.n = n, p.k = k, p.a = a, p.lda = k, p.w = w, p.ldw = k, p.c = c, p.ldc = n;
    p.batch = B, p.stride_a = m * k, p.stride_w = n * k, p.stride_c = m * n;
    const double gb = 2.0 * B * n * k / 1e9;
    auto pct = [&](double us) { return us > 0 ? 100.0 * gb / (us * 1e-6) / 4300.0 : 0.0; };
    std::printf(
        "%-22s m %lld  weights %7.2f MB  roofline %7.2f us | round+cuBLAS %8.2f us (%5.1f%%) | "
        "cuBLAS bf16 a %8.2f us (%5.1f%%)\n",
        s.name, static_cast<long long>(m), gb * 1e3, gb / 4300.0 * 1e6, t_round, pct(t_round),
        t_cublas, pct(t_cublas));
    std::fflush(stdout);
    if (kernels::SmallMGemmSupports(p)) {
      // The weight copies of the graph timing; copy 0 is w.
      const int64_t bytes = 2 * B * n * k;
      const int64_t copies = std::clamp<int64_t>((int64_t{256} << 20) / bytes + 1, 1, 64);
      std::vector<uint16_t*> ws = {w};
      for (int64_t i = 1; i < copies; ++i) {
        ws.push_back(DeviceAlloc<uint16_t>(bytes));
        BENCH_CUDA(cudaMemcpy(ws.back(), w, bytes, cudaMemcpyDeviceToDevice));
      }
      for (const auto& [algo, name] :
           {std::pair{kernels::SmallMGemmAlgo::kRowPerGroup, "kRowPerGroup"},
            std::pair{kernels::SmallMGemmAlgo::kSplitK, "kSplitK     "}}) {
        p.algo = algo;
        p.w = w;
        const double t_alone = MedianUs([&] { BENCH_CUDA(kernels::SmallMGemmBf16(p, nullptr)); });
        const double t_graph = GraphUs(ws, [&](const uint16_t* wi, cudaStream_t st) {
          kernels::SmallMGemmParams q = p;
          q.w = wi;
          BENCH_CUDA(kernels::SmallMGemmBf16(q, st));
        });
        std::printf("%-22s m %lld    small-m %s: alone %8.2f us (%5.1f%%) | in a graph %8.2f us "
                    "(%5.1f%%, %lld launches)\n",
                    s.name, static_cast<long long>(m), name, t_alone, pct(t_alone), t_graph,
                    pct(t_graph), static_cast<long long>(copies));
        std::fflush(stdout);
      }
      for (size_t i = 1; i < ws.size(); ++i) BENCH_CUDA(cudaFree(ws[i]));
    }
    BENCH_CUDA(cudaFree(a));
    BENCH_CUDA(cudaFree(a16));
    BENCH_CUDA(cudaFree(w));
    BENCH_CUDA(cudaFree(c));
    for (float* f : fills_) BENCH_CUDA(cudaFree(f));
    fills_.clear();
  }

 private:
  float* FillF32(int64_t n) {
    float* f = DeviceAlloc<float>(n * 4);
    // One finite value everywhere (0x3c3c3c3c): the timing does not depend on the values.
    BENCH_CUDA(cudaMemset(f, 0x3c, n * 4));
    fills_.push_back(f);
    return f;
  }

  cublasHandle_t cublas_;
  float* flush_;
  cudaEvent_t start_, stop_;
  std::vector<float*> fills_;
};

}  // namespace
}  // namespace deepinfer

int main() {
  using deepinfer::Shape;
  const Shape shapes[] = {
      {"q_proj", 1, 3072, 2048},
      {"kv_a_proj", 1, 576, 2048},
      {"o_proj", 1, 2048, 2048},
      {"shared gate_up", 1, 5632, 2048},
      {"shared down", 1, 2048, 2816},
      {"dense gate_up", 1, 22528, 2048},
      {"dense down", 1, 2048, 11264},
      {"lm_head", 1, 129280, 2048},
      {"absorb W_uk (16 heads)", 16, 512, 128},
      {"lift W_uv (16 heads)", 16, 128, 512},
  };
  deepinfer::Bench bench;
  for (int64_t m : {1, 4}) {
    for (const Shape& s : shapes) bench.Run(s, m);
  }
  return 0;
}
