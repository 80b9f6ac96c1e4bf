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
// (median of 10 replays). Bandwidth = weight bytes / time against the H200's 4.3 TB/s. The staged
// GEMV (kernels/gemm/staged_gemv.h) is timed the same way (every product in one launch), and
// first, the attention input of a decode step (AddRmsNorm, q_proj, kv_a) before and with it.
// First of all, RunStaged: the staged GEMV against the small-m kernel at m = 1, 2, 4, also after
// a GEMV.
//
// "batch-invariant": the batch-invariant mode's dense GEMM candidates instead, at m = 1, 64, 128
// and 256 bf16 rows of the same shapes (batch 1), each launch timed alone after the L2 flush:
// cublasGemmEx (not batch-invariant: the floor), kernels::BatchInvariantGemmTc and
// kernels::BatchInvariantGemmPipelined (the mode's dense kernel where the device runs it).
//
// "v4": the same ways (small-m kernels, staged GEMV) on DeepSeek-V4-Flash's decode GEMVs at one
// row (hidden 4096, q_lora 1024, 64 heads x 512, 8 output groups of o_lora 1024, 64 indexer heads
// x 128, vocab 129280); the staged cases also q_b + index_q_b behind the q norm without a
// residual add (the model's call), against AddRmsNormF32 + two small-m launches.
//
// "batch-invariant-tiles": the same at m = 1, 16, 32, 64, 128, 256, BatchInvariantGemmPipelined
// also at each of its tiles (rows x columns: microseconds).
//
//   small_m_gemm_bench [staged | batch-invariant | batch-invariant-tiles | v4]   (one line per
//                                 case; exit status 1 on a CUDA error; "staged": RunStaged only)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/activation/elementwise.h"
#include "kernels/gemm/batch_invariant_gemm.h"
#include "kernels/gemm/small_m_gemm.h"
#include "kernels/gemm/staged_gemv.h"
#include "kernels/norm/rms_norm.h"
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
    return GraphUsN(static_cast<int64_t>(ws.size()),
                    [&](int64_t i, cudaStream_t st) { launch(ws[i], st); });
  }

  // Microseconds per i of a graph holding launch(i, stream) for i < count, back to back.
  template <typename Fn>
  double GraphUsN(int64_t count, Fn launch) {
    cudaStream_t st;
    BENCH_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t graph;
    BENCH_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int64_t i = 0; i < count; ++i) launch(i, st);
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
    return 1000.0 * ms[ms.size() / 2] / static_cast<double>(count);
  }

  // The attention input of a decode step: x += y, RMS norm, q_proj (3072 x 2048) and kv_a
  // (576 x 2048) from the normed rows. Before: AddRmsNormF32 (bf16 out) + two SmallMGemmBf16
  // (kAuto); the staged GEMV on AddRmsNormF32's rows (two targets, one launch); the staged GEMV
  // with the norm prologue (one launch in all). Per step in a graph, each step on its own copy of
  // the weights.
  void RunNormQkv(int64_t m) {
    const int64_t k = 2048, nq = 3072, nkv = 576;
    const int64_t bytes = 2 * (nq + nkv) * k;
    const int64_t copies = (int64_t{256} << 20) / bytes + 1;
    std::vector<uint16_t*> wq, wkv;
    for (int64_t i = 0; i < copies; ++i) {
      wq.push_back(DeviceAlloc<uint16_t>(2 * nq * k));
      BENCH_CUDA(kernels::RoundF32ToBf16(nq * k, FillF32(nq * k), wq.back(), nullptr));
      wkv.push_back(DeviceAlloc<uint16_t>(2 * nkv * k));
      BENCH_CUDA(kernels::RoundF32ToBf16(nkv * k, FillF32(nkv * k), wkv.back(), nullptr));
      for (float* f : fills_) BENCH_CUDA(cudaFree(f));
      fills_.clear();
    }
    float* x = bench::Upload(bench::Uniform(m * k, 2));
    float* y = bench::Upload(bench::Uniform(m * k, 3));
    float* gamma = bench::Upload(bench::Uniform(k, 4));
    uint16_t* act = DeviceAlloc<uint16_t>(2 * m * k);
    float* cq = DeviceAlloc<float>(4 * m * nq);
    float* ckv = DeviceAlloc<float>(4 * m * nkv);
    unsigned int* counter = DeviceAlloc<unsigned int>(sizeof(unsigned int));
    BENCH_CUDA(cudaMemset(counter, 0, sizeof(unsigned int)));
    auto small_m = [&](int64_t n, const uint16_t* w, float* c, cudaStream_t st) {
      kernels::SmallMGemmParams p;
      p.m = m, p.n = n, p.k = k, p.a = act, p.a_bf16 = true, p.lda = k, p.w = w, p.ldw = k;
      p.c = c, p.ldc = n;
      BENCH_CUDA(kernels::SmallMGemmBf16(p, st));
    };
    kernels::StagedGemvParams sp;
    sp.m = m, sp.k = k, sp.num_targets = 2;
    sp.a = act, sp.a_bf16 = true, sp.lda = k;
    sp.x = x, sp.y = y, sp.norm_weight = gamma, sp.eps = 1e-6f, sp.counter = counter;
    const double before = GraphUsN(copies, [&](int64_t i, cudaStream_t st) {
      BENCH_CUDA(kernels::AddRmsNormF32(m, k, x, y, gamma, 1e-6f, nullptr, act, st));
      small_m(nq, wq[i], cq, st);
      small_m(nkv, wkv[i], ckv, st);
    });
    const double staged = GraphUsN(copies, [&](int64_t i, cudaStream_t st) {
      BENCH_CUDA(kernels::AddRmsNormF32(m, k, x, y, gamma, 1e-6f, nullptr, act, st));
      kernels::StagedGemvParams q = sp;
      q.prologue = kernels::StagedGemvPrologue::kCopy;
      q.targets[0] = {nq, wq[i], k, cq, nq, false};
      q.targets[1] = {nkv, wkv[i], k, ckv, nkv, false};
      BENCH_CUDA(kernels::StagedGemvBf16(q, st));
    });
    const double fused = GraphUsN(copies, [&](int64_t i, cudaStream_t st) {
      kernels::StagedGemvParams q = sp;
      q.prologue = kernels::StagedGemvPrologue::kAddRmsNorm;
      q.targets[0] = {nq, wq[i], k, cq, nq, false};
      q.targets[1] = {nkv, wkv[i], k, ckv, nkv, false};
      BENCH_CUDA(kernels::StagedGemvBf16(q, st));
    });
    const double gb = bytes / 1e9;
    auto pct = [&](double us) { return 100.0 * gb / (us * 1e-6) / 4300.0; };
    std::printf(
        "norm + q_proj + kv_a   m %lld  weights %7.2f MB  roofline %7.2f us | per step in a "
        "graph: AddRmsNorm + 2 small-m %7.2f us (%5.1f%%) | AddRmsNorm + staged (2 "
        "targets) %7.2f us (%5.1f%%) | fused norm + staged %7.2f us (%5.1f%%)\n",
        static_cast<long long>(m), gb * 1e3, gb / 4300.0 * 1e6, before, pct(before), staged,
        pct(staged), fused, pct(fused));
    std::fflush(stdout);
    for (int64_t i = 0; i < copies; ++i) {
      BENCH_CUDA(cudaFree(wq[i]));
      BENCH_CUDA(cudaFree(wkv[i]));
    }
    for (void* p : {static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(gamma),
                    static_cast<void*>(act), static_cast<void*>(cq), static_cast<void*>(ckv),
                    static_cast<void*>(counter)}) {
      BENCH_CUDA(cudaFree(p));
    }
  }

  // One case of RunStaged: m rows against the targets' concatenated rows, with the norm
  // prologue (x += y, RMS norm) or a copied fp32 activation.
  struct StagedCase {
    const char* name;
    std::vector<int64_t> ns;
    int64_t k;
    bool norm;
    bool add_y = true;  // with the norm: x += y first (false: the norm of x alone)
  };

  // The decode GEMVs in two or three ways, each timed as the model runs them (back-to-back
  // launches in a CUDA graph with programmatic edges, each launch on its own weight copy, 256 MiB
  // of copies): the small-m kernel (kAuto; with the norm: AddRmsNormF32 first), the staged GEMV
  // (with the norm: its fused prologue), and with the norm also AddRmsNormF32 then the staged GEMV
  // on its bf16 rows. "chain": per launch in a chain of the same launch. "after a GEMV": the
  // launch's added time in a chain that alternates it with an 8.4 MB small-m GEMV (o_proj's shape
  // on its own copies), i.e. the pair's time minus that GEMV's own chain time: what the launch
  // costs after a different kernel.
  void RunStaged(const StagedCase& lc, int64_t m) {
    const int64_t k = lc.k;
    int64_t rows = 0;
    for (int64_t n : lc.ns) rows += n;
    const int64_t bytes = 2 * rows * k;
    const int64_t copies = std::clamp<int64_t>((int64_t{256} << 20) / bytes + 1, 2, 64);
    std::vector<uint16_t*> ws;
    for (int64_t i = 0; i < copies; ++i) {
      ws.push_back(DeviceAlloc<uint16_t>(bytes));
      BENCH_CUDA(cudaMemset(ws.back(), 0x3c, bytes));  // bf16 1.15, everywhere
    }
    // The predecessor GEMV of "after a GEMV": 2048 x 2048 on its own copies.
    const int64_t pred_n = 2048, pred_k = 2048, pred_bytes = 2 * pred_n * pred_k;
    std::vector<uint16_t*> pred_ws;
    for (int64_t i = 0; i < copies; ++i) {
      pred_ws.push_back(DeviceAlloc<uint16_t>(pred_bytes));
      BENCH_CUDA(cudaMemset(pred_ws.back(), 0x3c, pred_bytes));
    }
    float* pred_a = bench::Upload(bench::Uniform(pred_k, 5));
    float* pred_c = DeviceAlloc<float>(4 * pred_n);
    float* a = bench::Upload(bench::Uniform(m * k, 1));
    float* x = bench::Upload(bench::Uniform(m * k, 2));
    float* y = bench::Upload(bench::Uniform(m * k, 3));
    std::vector<float> host_y = bench::Uniform(m * k, 3);
    for (float& v : host_y) v *= 1e-6f;  // x += y every launch: keep x's scale
    BENCH_CUDA(cudaMemcpy(y, host_y.data(), 4 * m * k, cudaMemcpyHostToDevice));
    float* gamma = bench::Upload(bench::Uniform(k, 4));
    uint16_t* act = DeviceAlloc<uint16_t>(2 * m * k);
    float* c = DeviceAlloc<float>(4 * m * rows);
    unsigned int* counter = DeviceAlloc<unsigned int>(sizeof(unsigned int));
    BENCH_CUDA(cudaMemset(counter, 0, sizeof(unsigned int)));

    float* add = lc.add_y ? y : nullptr;
    auto small_m = [&](int64_t i, cudaStream_t st) {
      if (lc.norm) {
        BENCH_CUDA(kernels::AddRmsNormF32(m, k, x, add, gamma, 1e-6f, nullptr, act, st));
      }
      int64_t at = 0;
      for (int64_t n : lc.ns) {
        kernels::SmallMGemmParams p;
        p.m = m, p.n = n, p.k = k, p.a = lc.norm ? static_cast<const void*>(act) : a;
        p.a_bf16 = lc.norm, p.lda = k, p.w = ws[i] + at * k, p.ldw = k;
        p.c = c + m * at, p.ldc = n;
        BENCH_CUDA(kernels::SmallMGemmBf16(p, st));
        at += n;
      }
    };
    // fused_norm: the staged GEMV's norm prologue; otherwise (with the norm) AddRmsNormF32 first.
    auto staged = [&](bool fused_norm) {
      return [&, fused_norm](int64_t i, cudaStream_t st) {
        kernels::StagedGemvParams p;
        p.m = m, p.k = k;
        if (lc.norm && fused_norm) {
          p.prologue = kernels::StagedGemvPrologue::kAddRmsNorm;
          p.x = x, p.y = add, p.norm_weight = gamma, p.eps = 1e-6f, p.counter = counter;
        } else if (lc.norm) {
          BENCH_CUDA(kernels::AddRmsNormF32(m, k, x, add, gamma, 1e-6f, nullptr, act, st));
          p.a = act, p.a_bf16 = true, p.lda = k;
        } else {
          p.a = a, p.lda = k;
        }
        p.num_targets = static_cast<int>(lc.ns.size());
        int64_t at = 0;
        for (size_t t = 0; t < lc.ns.size(); ++t) {
          p.targets[t] = {lc.ns[t], ws[i] + at * k, k, c + m * at, lc.ns[t], false};
          at += lc.ns[t];
        }
        BENCH_CUDA(kernels::StagedGemvBf16(p, st));
      };
    };
    auto pred = [&](int64_t i, cudaStream_t st) {
      kernels::SmallMGemmParams p;
      p.m = 1, p.n = pred_n, p.k = pred_k, p.a = pred_a, p.lda = pred_k, p.w = pred_ws[i];
      p.ldw = pred_k, p.c = pred_c, p.ldc = pred_n;
      BENCH_CUDA(kernels::SmallMGemmBf16(p, st));
    };
    const double pred_alone = GraphUsN(copies, pred);
    const double gb = bytes / 1e9;
    auto pct = [&](double us) { return 100.0 * gb / (us * 1e-6) / 4300.0; };
    std::printf("staged %-16s m %lld  weights %6.2f MB  roofline %5.2f us |", lc.name,
                static_cast<long long>(m), gb * 1e3, gb / 4300.0 * 1e6);
    // The staged GEMV's pass size for this k (the weights' values do not matter to it).
    kernels::StagedGemvParams layout;
    layout.m = m, layout.k = k;
    std::printf(" staged %d chunks a lane |", kernels::StagedGemvLaneChunks(layout));
    using Launch = std::function<void(int64_t, cudaStream_t)>;
    std::vector<std::pair<const char*, Launch>> ways = {{"small-m", small_m},
                                                        {"staged", staged(true)}};
    if (lc.norm) ways.emplace_back("AddRmsNorm + staged", staged(false));
    for (const auto& [name, launch] : ways) {
      const double chain = GraphUsN(copies, launch);
      const double pair = GraphUsN(copies, [&](int64_t i, cudaStream_t st) {
        pred(i, st);
        launch(i, st);
      });
      std::printf(" %s: chain %6.2f us (%5.1f%%), after a GEMV +%6.2f us (%5.1f%%) |", name, chain,
                  pct(chain), pair - pred_alone, pct(pair - pred_alone));
    }
    std::printf(" (the 8.4 MB GEMV alone: %.2f us)\n", pred_alone);
    std::fflush(stdout);
    for (uint16_t* w : ws) BENCH_CUDA(cudaFree(w));
    for (uint16_t* w : pred_ws) BENCH_CUDA(cudaFree(w));
    for (void* q : {static_cast<void*>(pred_a), static_cast<void*>(pred_c), static_cast<void*>(a),
                    static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(gamma),
                    static_cast<void*>(act), static_cast<void*>(c), static_cast<void*>(counter)}) {
      BENCH_CUDA(cudaFree(q));
    }
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
        std::printf(
            "%-22s m %lld    small-m %s: alone %8.2f us (%5.1f%%) | in a graph %8.2f us "
            "(%5.1f%%, %lld launches)\n",
            s.name, static_cast<long long>(m), name, t_alone, pct(t_alone), t_graph, pct(t_graph),
            static_cast<long long>(copies));
        std::fflush(stdout);
      }
      // The staged GEMV (kernels/gemm/staged_gemv.h) on the same copies, all B products in one
      // launch.
      kernels::StagedGemvParams sp;
      sp.m = m, sp.k = k, sp.a = a, sp.lda = k, sp.num_targets = 1;
      sp.targets[0] = {n, w, k, c, n, false};
      sp.batch = B, sp.stride_a = m * k, sp.stride_w = n * k, sp.stride_c = m * n;
      if (kernels::StagedGemvSupports(sp)) {
        const double t_graph = GraphUs(ws, [&](const uint16_t* wi, cudaStream_t st) {
          kernels::StagedGemvParams q = sp;
          q.targets[0].w = wi;
          BENCH_CUDA(kernels::StagedGemvBf16(q, st));
        });
        std::printf(
            "%-22s m %lld    staged GEMV (%d chunks a lane):  in a graph %8.2f us (%5.1f%%, %lld "
            "launches)\n",
            s.name, static_cast<long long>(m), kernels::StagedGemvLaneChunks(sp), t_graph,
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

  // "batch-invariant": shape s (batch 1) at m bf16 rows, each way alone after the L2 flush. With
  // all_tiles, also BatchInvariantGemmPipelined at each of its tiles (the same bits at each).
  void RunBatchInvariant(const Shape& s, int64_t m, bool all_tiles) {
    const int64_t k = s.k, n = s.n;
    float* a = bench::Upload(bench::Uniform(m * k, 1));
    uint16_t* a16 = DeviceAlloc<uint16_t>(m * k * 2);
    BENCH_CUDA(kernels::RoundF32ToBf16(m * k, a, a16, nullptr));
    uint16_t* w = DeviceAlloc<uint16_t>(n * k * 2);
    BENCH_CUDA(kernels::RoundF32ToBf16(n * k, FillF32(n * k), w, nullptr));
    float* c = DeviceAlloc<float>(m * n * 4);
    const double gb = 2.0 * n * k / 1e9;
    auto pct = [&](double us) { return 100.0 * gb / (us * 1e-6) / 4300.0; };
    const float alpha = 1.0f, beta = 0.0f;
    std::printf("%-22s m %4lld  weights %7.2f MB |", s.name, static_cast<long long>(m), gb * 1e3);
    const double t_cublas = MedianUs([&] {
      Blas(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, k, a16,
                        CUDA_R_16BF, k, &beta, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT),
           "cublasGemmEx");
    });
    std::printf(" cuBLAS %8.2f us (%5.1f%%) |", t_cublas, pct(t_cublas));
    kernels::BatchInvariantGemmParams b;
    b.m = m, b.n = n, b.k = k, b.a = a16, b.a_bf16 = true, b.lda = k, b.w = w, b.ldw = k;
    b.c = c, b.ldc = n;
    if (kernels::BatchInvariantGemmTcSupports(b)) {
      const double t = MedianUs([&] { BENCH_CUDA(kernels::BatchInvariantGemmTc(b, nullptr)); });
      std::printf(" BatchInvariantGemmTc %8.2f us (%5.1f%%) |", t, pct(t));
    }
    if (kernels::BatchInvariantGemmPipelinedSupports(b)) {
      const double t =
          MedianUs([&] { BENCH_CUDA(kernels::BatchInvariantGemmPipelined(b, nullptr)); });
      std::printf(" BatchInvariantGemmPipelined (%d splits) %8.2f us (%5.1f%%) |",
                  kernels::BatchInvariantGemmSplits(1, n, k), t, pct(t));
      for (const int columns : {64, 128}) {
        for (const int rows : {16, 32, 64, 128}) {
          if (all_tiles) {
            const kernels::BatchInvariantGemmTile tile{rows, columns};
            const double tt = MedianUs(
                [&] { BENCH_CUDA(kernels::BatchInvariantGemmPipelined(b, nullptr, tile)); });
            std::printf(" %dx%d %.2f |", rows, columns, tt);
          }
        }
      }
    }
    std::printf("\n");
    std::fflush(stdout);
    for (void* q : {static_cast<void*>(a), static_cast<void*>(a16), static_cast<void*>(w),
                    static_cast<void*>(c)}) {
      BENCH_CUDA(cudaFree(q));
    }
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

int main(int argc, char** argv) {
  using deepinfer::Shape;
  // "staged": only RunStaged (staged against small-m), for a short device run.
  const bool staged_only = argc > 1 && std::string(argv[1]) == "staged";
  const bool all_tiles = argc > 1 && std::string(argv[1]) == "batch-invariant-tiles";
  const bool batch_invariant =
      argc > 1 && (std::string(argv[1]) == "batch-invariant" || all_tiles);
  deepinfer::Bench bench;
  if (argc > 1 && std::string(argv[1]) == "v4") {
    const deepinfer::Bench::StagedCase v4_cases[] = {
        {"norm+q_a+kv", {1024, 512}, 4096, true},
        {"q_b+index_q_b", {32768, 8192}, 1024, false},
        {"norm+q_b+index_q", {32768, 8192}, 1024, true, false},
        {"o_b", {4096}, 8192, false},
    };
    for (const auto& lc : v4_cases) bench.RunStaged(lc, 1);
    const Shape v4_shapes[] = {
        {"v4 q_b", 1, 32768, 1024},     {"v4 index_q_b", 1, 8192, 1024},
        {"v4 o_a (8 groups)", 8, 1024, 4096}, {"v4 o_b", 1, 4096, 8192},
        {"v4 q_a", 1, 1024, 4096},      {"v4 lm_head", 1, 129280, 4096},
    };
    for (const Shape& s : v4_shapes) bench.Run(s, 1);
    return 0;
  }
  if (!batch_invariant) {
    const deepinfer::Bench::StagedCase cases[] = {
        {"norm+q+kv_a", {3072, 576}, 2048, true}, {"q+kv_a", {3072, 576}, 2048, false},
        {"o_proj", {2048}, 2048, false},          {"shared gate_up", {5632}, 2048, false},
        {"gate_up 2816", {2816}, 2048, false},    {"shared down", {2048}, 2816, false},
        {"down 1408", {2048}, 1408, false},
    };
    for (int64_t m : {1, 2, 4}) {
      for (const auto& lc : cases) bench.RunStaged(lc, m);
    }
  }
  if (staged_only) return 0;
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
  if (batch_invariant) {
    for (const Shape& s : shapes) {
      if (s.batch != 1) continue;
      if (all_tiles) {
        for (int64_t m : {1, 16, 32, 64, 128, 256}) bench.RunBatchInvariant(s, m, true);
      } else {
        for (int64_t m : {1, 64, 128, 256}) bench.RunBatchInvariant(s, m, false);
      }
    }
    return 0;
  }
  for (int64_t m : {1, 4}) bench.RunNormQkv(m);
  for (int64_t m : {1, 4}) {
    for (const Shape& s : shapes) bench.Run(s, m);
  }
  return 0;
}
