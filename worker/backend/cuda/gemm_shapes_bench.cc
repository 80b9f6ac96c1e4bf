// gemm_shapes_bench: the prefill's dense GEMMs at the Moonlight shape (hidden 2048; q_proj,
// kv_a, the non-absorbed kv_b, o_proj, the shared experts' and the first layer's dense MLP
// gate_up / down) at 8192 and 32768 rows, bf16 weights and bf16 activations, fp32 output:
//
//   backend   CudaBackend::Gemm as the model calls it, CudaTuning::gemm_autotune off
//             (cublasGemmEx, CUBLAS_GEMM_DEFAULT)
//   lt #i     each of cuBLASLt's heuristic algorithms for the same problem
//             (cublasLtMatmulAlgoGetHeuristic, up to 8, workspace up to the backend's 32 MiB),
//             timed one by one: whether a per-shape algorithm choice would gain
//   tuned     CudaBackend::Gemm of a second backend with gemm_autotune on (the default;
//             CublasLtGemmTuner: the first call, not timed, picks the fastest candidate; the
//             time is the chosen algorithm's)
//   bf16 out  the pair Gemm (fp32) + SiluMulBf16 against GateUpSiluMulBf16 (bf16 gate_up
//             output), without and with gemm_autotune
//
// Time: CUDA events around 5 back-to-back calls, median of 5 such rounds after 2 warm-up calls;
// TFLOP/s of 2·m·n·k and the fraction of 790 (docs/performance.md's peak).
//
// `v4`: DeepSeek-V4-Flash's prefill GEMMs whose output has one bf16 reader, as the model ran
// them and with a bf16 output (gemm_autotune on, the default): q_b (n 32768, k 1024) by Gemm
// (fp32 out) against GemmToBf16; the grouped o_a (8 groups, n 1024, k 4096 of a row of 32768)
// then o_b (n 4096, k 8192) by BatchedGemm (fp32 out) + Gemm (which rounds its fp32 operand to
// bf16 first) against BatchedGemmToBf16 + Gemm on the bf16 operand.
//
//   gemm_shapes_bench [rows ...]     (default 8192 32768; exit status 1 on an error)
//   gemm_shapes_bench v4 [rows ...]  (default 8192 32768)
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/dummy_fill.h"

namespace deepinfer {
namespace {

constexpr double kPeakFlops = 790e12;
constexpr int kMaxAlgos = 8;

void Fail(const char* what, int code) {
  std::fprintf(stderr, "gemm_shapes_bench: %s failed (%d)\n", what, code);
  std::exit(1);
}

void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Fail(what, static_cast<int>(e));
}

void CheckLt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) Fail(what, static_cast<int>(s));
}

struct Shape {
  const char* name;
  int64_t n, k;
  bool gate_up;  // a SwiGLU gate_up (n = 2 * inter): also timed with a bf16 output
};

// Median over 5 rounds of the mean time of 5 back-to-back calls, in µs.
double TimeUs(cudaStream_t stream, const std::function<void()>& call) {
  cudaEvent_t start, stop;
  CheckCuda(cudaEventCreate(&start), "cudaEventCreate");
  CheckCuda(cudaEventCreate(&stop), "cudaEventCreate");
  call();
  call();
  std::vector<double> rounds;
  for (int r = 0; r < 5; ++r) {
    CheckCuda(cudaEventRecord(start, stream), "cudaEventRecord");
    for (int i = 0; i < 5; ++i) call();
    CheckCuda(cudaEventRecord(stop, stream), "cudaEventRecord");
    CheckCuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0f;
    CheckCuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    rounds.push_back(ms * 1000.0 / 5);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

void Report(const char* shape, int64_t m, int64_t n, int64_t k, const std::string& variant,
            double us, double base_us) {
  const double tflops = 2.0 * m * n * k / (us * 1e-6) / 1e12;
  std::printf("%-14s %6lld %6lld %6lld | %-44s %9.1f %7.1f %5.1f%% %+6.1f%%\n", shape,
              static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
              variant.c_str(), us, tflops, 100.0 * tflops * 1e12 / kPeakFlops,
              100.0 * (us - base_us) / base_us);
}

// The `v4` mode (above) on a backend with gemm_autotune on.
int MainV4(const std::vector<int64_t>& row_counts) {
  auto created = CudaBackend::Create(0, WeightDType::kBFloat16, CudaTuning());
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
    return 1;
  }
  CudaBackend& b = **created;
  cudaStream_t stream = b.stream();
  constexpr int64_t kQl = 1024, kQ = 64 * 512, kGroups = 8, kOl = 1024, kHidden = 4096;
  constexpr int64_t kIn = kQ / kGroups;
  DummyFill fw, fa;
  fw.key = 11, fw.amplitude = 0.05f;
  fa.key = 12, fa.amplitude = 1.0f;
  auto bf16 = [&](int64_t n, const DummyFill& f) {
    auto buf = b.Allocate(n * sizeof(uint16_t));
    b.FillDummy(f, n, WeightDType::kBFloat16, buf->data());
    return buf;
  };
  auto q_b = bf16(kQ * kQl, fw), o_a = bf16(kGroups * kOl * kIn, fw);
  auto o_b = bf16(kHidden * kGroups * kOl, fw);
  const WeightView q_bv{q_b->data(), WeightDType::kBFloat16};
  const WeightView o_av{o_a->data(), WeightDType::kBFloat16};
  const WeightView o_bv{o_b->data(), WeightDType::kBFloat16};
  std::printf("%-14s %6s %6s %6s | %-44s %9s %7s %6s %7s\n", "shape", "m", "n", "k", "variant",
              "us", "TFLOP/s", "peak", "vs fp32");
  for (int64_t m : row_counts) {
    {
      auto a = bf16(m * kQl, fa);
      auto c = b.Allocate(m * kQ * sizeof(float));
      auto c16 = b.Allocate(m * kQ * sizeof(uint16_t));
      const ActivationView av = ActivationView::Bf16(a->as<uint16_t>());
      const double f32 = TimeUs(
          stream, [&] { b.Gemm(m, kQ, kQl, av, kQl, q_bv, kQl, c->as<float>(), kQ, false); });
      Report("q_b", m, kQ, kQl, "Gemm (fp32 out)", f32, f32);
      const double out16 = TimeUs(stream, [&] {
        if (!b.GemmToBf16(m, kQ, kQl, av, kQl, q_bv, kQl, c16->as<uint16_t>(), kQ)) {
          Fail("GemmToBf16 declined", 0);
        }
      });
      Report("q_b", m, kQ, kQl, "GemmToBf16 (bf16 out)", out16, f32);
    }
    {
      // FLOPs reported as o_a's and o_b's together (k: o_a's per group).
      auto o = bf16(m * kQ, fa);
      auto og = b.Allocate(m * kGroups * kOl * sizeof(float));
      auto og16 = b.Allocate(m * kGroups * kOl * sizeof(uint16_t));
      auto out = b.Allocate(m * kHidden * sizeof(float));
      const ActivationView ov = ActivationView::Bf16(o->as<uint16_t>());
      const int64_t n_equiv = kGroups * kOl + kHidden * kGroups * kOl / kIn;
      const double f32 = TimeUs(stream, [&] {
        b.BatchedGemm(kGroups, m, kOl, kIn, ov, kQ, kIn, o_av, kIn, kOl * kIn, og->as<float>(),
                      kGroups * kOl, kOl);
        b.Gemm(m, kHidden, kGroups * kOl, og->as<float>(), kGroups * kOl, o_bv, kGroups * kOl,
               out->as<float>(), kHidden, false);
      });
      Report("o_a+o_b", m, n_equiv, kIn, "BatchedGemm (fp32 out) + Gemm", f32, f32);
      const double out16 = TimeUs(stream, [&] {
        if (!b.BatchedGemmToBf16(kGroups, m, kOl, kIn, ov, kQ, kIn, o_av, kIn, kOl * kIn,
                                 og16->as<uint16_t>(), kGroups * kOl, kOl)) {
          Fail("BatchedGemmToBf16 declined", 0);
        }
        b.Gemm(m, kHidden, kGroups * kOl, ActivationView::Bf16(og16->as<uint16_t>()), kGroups * kOl,
               o_bv, kGroups * kOl, out->as<float>(), kHidden, false);
      });
      Report("o_a+o_b", m, n_equiv, kIn, "BatchedGemmToBf16 + Gemm (bf16 operand)", out16, f32);
    }
    CheckCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    if (!b.status().ok()) {
      std::fprintf(stderr, "%s\n", b.status().ToString().c_str());
      return 1;
    }
  }
  return 0;
}

int Main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "v4") {
    std::vector<int64_t> rows;
    for (int i = 2; i < argc; ++i) rows.push_back(std::atoll(argv[i]));
    if (rows.empty()) rows = {8192, 32768};
    return MainV4(rows);
  }
  std::vector<int64_t> row_counts;
  for (int i = 1; i < argc; ++i) row_counts.push_back(std::atoll(argv[i]));
  if (row_counts.empty()) row_counts = {8192, 32768};
  CudaTuning plain;
  plain.gemm_autotune = false;
  auto created = CudaBackend::Create(0, WeightDType::kBFloat16, plain);
  auto created_tuned = CudaBackend::Create(0, WeightDType::kBFloat16, CudaTuning());
  for (const auto* c : {&created, &created_tuned}) {
    if (!c->ok()) {
      std::fprintf(stderr, "%s\n", c->status().ToString().c_str());
      return 1;
    }
  }
  // b: the plain GEMMs and the buffers; tuned_be: the tuned GEMMs on b's buffers (b synchronised
  // first; each timing ends with its stream synchronised).
  CudaBackend& b = **created;
  CudaBackend& tuned_be = **created_tuned;
  cudaStream_t stream = b.stream();
  cublasLtHandle_t lt;
  CheckLt(cublasLtCreate(&lt), "cublasLtCreate");
  size_t ws_bytes = CudaBackend::kCublasWorkspaceBytes;
  auto workspace = b.Allocate(ws_bytes);

  const Shape shapes[] = {
      {"q_proj", 3072, 2048, false},        {"kv_a", 576, 2048, false},
      {"kv_b", 4096, 512, false},           {"o_proj", 2048, 2048, false},
      {"shared_gate_up", 5632, 2048, true}, {"shared_down", 2048, 2816, false},
      {"dense_gate_up", 22528, 2048, true}, {"dense_down", 2048, 11264, false},
  };
  std::printf("%-14s %6s %6s %6s | %-44s %9s %7s %6s %7s\n", "shape", "m", "n", "k", "variant",
              "us", "TFLOP/s", "peak", "vs be");
  for (int64_t m : row_counts) {
    for (const Shape& s : shapes) {
      auto w = b.Allocate(s.n * s.k * sizeof(uint16_t));
      auto a = b.Allocate(m * s.k * sizeof(uint16_t));
      auto c = b.Allocate(m * s.n * sizeof(float));
      DummyFill fw, fa;
      fw.key = 11, fw.amplitude = 0.05f;
      fa.key = 12, fa.amplitude = 1.0f;
      b.FillDummy(fw, s.n * s.k, WeightDType::kBFloat16, w->data());
      b.FillDummy(fa, m * s.k, WeightDType::kBFloat16, a->data());
      const WeightView wv{w->data(), WeightDType::kBFloat16};
      const ActivationView av = ActivationView::Bf16(a->as<uint16_t>());
      const double base = TimeUs(
          stream, [&] { b.Gemm(m, s.n, s.k, av, s.k, wv, s.k, c->as<float>(), s.n, false); });
      Report(s.name, m, s.n, s.k, "backend Gemm (cublasGemmEx, fp32 out)", base, base);
      b.Synchronize();
      const double tuned = TimeUs(tuned_be.stream(), [&] {
        tuned_be.Gemm(m, s.n, s.k, av, s.k, wv, s.k, c->as<float>(), s.n, false);
      });
      Report(s.name, m, s.n, s.k, "backend Gemm, gemm_autotune (cuBLASLt)", tuned, base);

      // The same problem through cuBLASLt, each heuristic algorithm in turn.
      cublasLtMatmulDesc_t op;
      CheckLt(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "DescCreate");
      const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      CheckLt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
              "TRANSA");
      CheckLt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
              "TRANSB");
      cublasLtMatrixLayout_t la, lb, lc;
      CheckLt(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.k, s.n, s.k), "layout A");
      CheckLt(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.k, m, s.k), "layout B");
      CheckLt(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, s.n, m, s.n), "layout C");
      cublasLtMatmulPreference_t pref;
      CheckLt(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
      CheckLt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &ws_bytes, sizeof(ws_bytes)),
              "MAX_WORKSPACE_BYTES");
      cublasLtMatmulHeuristicResult_t found[kMaxAlgos];
      int num_found = 0;
      CheckLt(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, kMaxAlgos, found,
                                             &num_found),
              "AlgoGetHeuristic");
      const float alpha = 1.0f, beta = 0.0f;
      double best = 1e30;
      int best_i = -1;
      for (int i = 0; i < num_found; ++i) {
        if (found[i].state != CUBLAS_STATUS_SUCCESS) continue;
        int tile = 0, stages = 0, split_k = 0, id = 0;
        size_t unused = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&found[i].algo, CUBLASLT_ALGO_CONFIG_ID, &id,
                                             sizeof(id), &unused);
        cublasLtMatmulAlgoConfigGetAttribute(&found[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                             sizeof(tile), &unused);
        cublasLtMatmulAlgoConfigGetAttribute(&found[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID,
                                             &stages, sizeof(stages), &unused);
        cublasLtMatmulAlgoConfigGetAttribute(&found[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                             &split_k, sizeof(split_k), &unused);
        const double us = TimeUs(stream, [&] {
          CheckLt(
              cublasLtMatmul(lt, op, &alpha, w->data(), la, a->data(), lb, &beta, c->data(), lc,
                             c->data(), lc, &found[i].algo, workspace->data(), ws_bytes, stream),
              "cublasLtMatmul");
        });
        char name[96];
        std::snprintf(name, sizeof(name), "lt #%d (algo %d tile %d stages %d splitk %d ws %zuK)", i,
                      id, tile, stages, split_k, found[i].workspaceSize >> 10);
        Report(s.name, m, s.n, s.k, name, us, base);
        if (us < best) best = us, best_i = i;
      }
      if (best_i >= 0) {
        Report(s.name, m, s.n, s.k, "BEST lt #" + std::to_string(best_i), best, base);
      }
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(la);
      cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(lc);
      cublasLtMatmulDescDestroy(op);

      if (s.gate_up) {
        const int64_t inter = s.n / 2;
        auto act = b.Allocate(m * inter * sizeof(uint16_t));
        const double pair_f32 = TimeUs(stream, [&] {
          b.Gemm(m, s.n, s.k, av, s.k, wv, s.k, c->as<float>(), s.n, false);
          b.SiluMulBf16(m, inter, c->as<float>(), act->as<uint16_t>());
        });
        Report(s.name, m, s.n, s.k, "Gemm fp32 + SiluMulBf16 (before)", pair_f32, base);
        const double pair_b16 = TimeUs(stream, [&] {
          if (!b.GateUpSiluMulBf16(m, inter, s.k, av, s.k, wv, s.k, /*swiglu_limit=*/0.0f,
                                   act->as<uint16_t>())) {
            Fail("GateUpSiluMulBf16 declined", 0);
          }
        });
        Report(s.name, m, s.n, s.k, "GateUpSiluMulBf16 (bf16 out + SiLU)", pair_b16, pair_f32);
        b.Synchronize();
        const double pair_tuned = TimeUs(tuned_be.stream(), [&] {
          if (!tuned_be.GateUpSiluMulBf16(m, inter, s.k, av, s.k, wv, s.k, /*swiglu_limit=*/0.0f,
                                          act->as<uint16_t>())) {
            Fail("GateUpSiluMulBf16 declined", 0);
          }
        });
        Report(s.name, m, s.n, s.k, "GateUpSiluMulBf16, gemm_autotune", pair_tuned, pair_f32);
      }
      CheckCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      for (const CudaBackend* be : {&b, &tuned_be}) {
        if (!be->status().ok()) {
          std::fprintf(stderr, "%s\n", be->status().ToString().c_str());
          return 1;
        }
      }
    }
  }
  cublasLtDestroy(lt);
  return 0;
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) { return deepinfer::Main(argc, argv); }
