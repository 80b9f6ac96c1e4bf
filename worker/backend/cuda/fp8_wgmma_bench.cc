// fp8_wgmma_bench: kernels::Fp8WgmmaGemm (FP8 wgmma + TMA, fp8_wgmma_gemm.h) against cuBLASLt's
// block-scaled FP8 GEMM (CublasLtFp8Gemm) and bf16 cublasGemmEx on the same shapes, the
// prefill sizes m = 1024, 4096, 16384, Moonlight's and DeepSeek-V3's weights; then the routed
// experts at prefill, 64 experts x 3072 rows (Moonlight: top-6 of 64 over 32 x 1024 tokens),
// gate_up and down: Fp8WgmmaGroupedGemm (one launch, its host set-up and descriptor copy
// included) against one CublasLtFp8Gemm and one cublasGemmEx per expert.
//
// The FP8 paths take quantised activations (e4m3 + per-row 1 x 128 scales) ready: the
// quantisation is not timed. Outputs fp32 ("f32") or bf16 ("bf16"); cuBLAS bf16 writes fp32.
// One line per case: microseconds (median of 20 runs, CUDA events) and TFLOP/s (2 m n k), and the
// wgmma kernel's speed-up over bf16 cuBLAS and over cuBLASLt FP8. The H200's dense bf16 / FP8
// tensor peaks are 989 / 1979 TFLOP/s. Exit status 1 on a CUDA or cuBLAS error, 2 where the
// device does not run the wgmma kernel.
//
//   fp8_wgmma_bench
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/gemm/fp8_wgmma_gemm.h"
#include "kernels/testing/bench_util.h"
#include "kernels/testing/gemm_bench_shapes.h"
#include "worker/backend/cuda/cublaslt_fp8_gemm.h"

#define BENCH_BLAS(expr)                                                              \
  do {                                                                                \
    cublasStatus_t s_ = (expr);                                                       \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                \
      std::fprintf(stderr, "%s:%d %s: cuBLAS status %d\n", __FILE__, __LINE__, #expr, \
                   static_cast<int>(s_));                                             \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

namespace deepinfer {
namespace {

using bench::DeviceAlloc;

constexpr size_t kWorkspaceBytes = size_t{64} << 20;

struct Shape {
  const char* name;
  int64_t n, k, split;
};

// Device operands of one weight shape: e4m3 weight, its scales, the bf16 weight (random bits of
// a modest range: the time does not depend on the values).
struct Weight {
  uint8_t* w8 = nullptr;
  float* scales = nullptr;
  uint16_t* w16 = nullptr;
  kernels::Fp8BlockWeight View(int64_t k, int64_t split) const {
    kernels::Fp8BlockWeight w;
    w.data = w8, w.ldw = k, w.scales = scales, w.scale_ld = kernels::Fp8ScaleLd(k);
    w.split_rows = split;
    return w;
  }
};

Weight MakeWeight(int64_t n, int64_t k, uint64_t seed) {
  Weight w;
  w.w8 = bench::Upload(bench::RandomFp8(n * k, seed));
  std::vector<float> s(kernels::Fp8ScaleRows(n, 0) * kernels::Fp8ScaleLd(k), 1.0f / 64);
  w.scales = bench::Upload(s);
  std::vector<uint16_t> h(n * k);
  const std::vector<float> u = bench::Uniform(n * k, seed + 1);
  for (size_t i = 0; i < h.size(); ++i)
    h[i] = static_cast<uint16_t>(0x3C00 + (u[i] > 0 ? 0 : 0x8000));
  w.w16 = bench::Upload(h);
  return w;
}

double Tflops(int64_t m, int64_t n, int64_t k, double us) {
  return us > 0 ? 2.0 * m * n * k / (us * 1e6) : 0.0;
}

class Bench {
 public:
  Bench() {
    BENCH_BLAS(cublasCreate(&blas_));
    workspace_ = DeviceAlloc<void>(kWorkspaceBytes);
    BENCH_BLAS(cublasSetWorkspace(blas_, workspace_, kWorkspaceBytes));
    auto lt = CublasLtFp8Gemm::Create(workspace_, kWorkspaceBytes);
    if (!lt.ok()) {
      std::fprintf(stderr, "CublasLtFp8Gemm::Create: %s\n", lt.status().ToString().c_str());
      std::exit(1);
    }
    lt_ = std::move(*lt);
  }

  // Activations of up to `a_elems` elements (rows x k) and their scales, outputs of up to
  // `c_elems`.
  void Reserve(int64_t a_elems, int64_t c_elems) {
    a8_ = bench::Upload(bench::RandomFp8(a_elems, 7));
    a16_ = DeviceAlloc<uint16_t>(a_elems * 2);
    BENCH_CUDA(cudaMemset(a16_, 0x3C, a_elems * 2));
    sa_ = bench::Upload(std::vector<float>(a_elems / 128 + 1, 1.0f / 32));
    c_ = DeviceAlloc<float>(c_elems * 4);
  }

  void CublasBf16(int64_t m, int64_t n, int64_t k, const uint16_t* w, const uint16_t* a, float* c) {
    const float alpha = 1.0f, beta = 0.0f;
    BENCH_BLAS(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n),
                            static_cast<int>(m), static_cast<int>(k), &alpha, w, CUDA_R_16BF,
                            static_cast<int>(k), a, CUDA_R_16BF, static_cast<int>(k), &beta, c,
                            CUDA_R_32F, static_cast<int>(n), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
  }

  // false: cuBLASLt refuses the shape.
  bool Lt(int64_t m, int64_t n, int64_t k, const uint8_t* q, const float* qs,
          const kernels::Fp8BlockWeight& w, float* c) {
    Fp8LtGemm g;
    g.m = m, g.n = n, g.k = k, g.q = q, g.ldq = k, g.q_scales = qs, g.w = w;
    g.d = c, g.ldd = n;
    auto ran = lt_->Run(g, nullptr);
    if (!ran.ok()) {
      std::fprintf(stderr, "CublasLtFp8Gemm::Run: %s\n", ran.status().ToString().c_str());
      std::exit(1);
    }
    return *ran;
  }

  cudaError_t Wgmma(int64_t m, int64_t n, int64_t k, const uint8_t* q, const float* qs,
                    int64_t qs_ld, const kernels::Fp8BlockWeight& w, void* c, bool bf16) {
    kernels::Fp8WgmmaGemmParams p;
    p.m = m, p.n = n, p.k = k, p.a = q, p.lda = k, p.a_scales = qs, p.a_scale_ld = qs_ld;
    p.w = w, p.c = c, p.ldc = n, p.c_bf16 = bf16;
    return kernels::Fp8WgmmaGemm(p, nullptr);
  }

  void Dense(const Shape& s, const std::vector<int64_t>& ms) {
    const Weight w = MakeWeight(s.n, s.k, s.n * 31 + s.k);
    for (int64_t m : ms) {
      const double bf16 = bench::MedianMs([&] {
                            CublasBf16(m, s.n, s.k, w.w16, a16_, c_);
                            return cudaSuccess;
                          }) *
                          1e3;
      bool lt_ok = true;
      const double lt = bench::MedianMs([&] {
                          lt_ok = Lt(m, s.n, s.k, a8_, sa_, w.View(s.k, s.split), c_) && lt_ok;
                          return cudaSuccess;
                        }) *
                        1e3;
      const double f32 = bench::MedianMs([&] {
                           return Wgmma(m, s.n, s.k, a8_, sa_, m, w.View(s.k, s.split), c_, false);
                         }) *
                         1e3;
      const double b16 = bench::MedianMs([&] {
                           return Wgmma(m, s.n, s.k, a8_, sa_, m, w.View(s.k, s.split), c_, true);
                         }) *
                         1e3;
      Print(s.name, m, s.n, s.k, bf16, lt_ok ? lt : -1, f32, b16);
    }
  }

  // `experts` experts of rows_each rows, one weight each.
  void Grouped(const Shape& s, int32_t experts, int32_t rows_each) {
    std::vector<Weight> ws;
    std::vector<kernels::Fp8BlockWeight> views;
    for (int32_t e = 0; e < experts; ++e) {
      ws.push_back(MakeWeight(s.n, s.k, 1000 + e));
      views.push_back(ws.back().View(s.k, s.split));
    }
    std::vector<int32_t> offsets(experts + 1);
    for (int32_t e = 0; e <= experts; ++e) offsets[e] = e * rows_each;
    const int64_t rows = offsets[experts], blocks = kernels::Fp8ScaleCols(s.k);
    void* ws_dev =
        DeviceAlloc<void>(kernels::Fp8WgmmaGroupedWorkspaceBytes(experts, offsets.data()));
    const double bf16 =
        bench::MedianMs([&] {
          for (int32_t e = 0; e < experts; ++e) {
            CublasBf16(rows_each, s.n, s.k, ws[e].w16, a16_ + int64_t{offsets[e]} * s.k,
                       c_ + int64_t{offsets[e]} * s.n);
          }
          return cudaSuccess;
        }) *
        1e3;
    bool lt_ok = true;
    const double lt = bench::MedianMs([&] {
                        for (int32_t e = 0; e < experts; ++e) {
                          lt_ok = Lt(rows_each, s.n, s.k, a8_ + int64_t{offsets[e]} * s.k,
                                     sa_ + int64_t{offsets[e]} * blocks, views[e],
                                     c_ + int64_t{offsets[e]} * s.n) &&
                                  lt_ok;
                        }
                        return cudaSuccess;
                      }) *
                      1e3;
    auto grouped = [&](bool bf16_out) {
      kernels::Fp8WgmmaGroupedGemmParams p;
      p.num_groups = experts, p.host_offsets = offsets.data(), p.n = s.n, p.k = s.k;
      p.a = a8_, p.lda = s.k, p.a_scales = sa_, p.weights = views.data();
      p.c = c_, p.ldc = s.n, p.c_bf16 = bf16_out, p.workspace = ws_dev;
      return kernels::Fp8WgmmaGroupedGemm(p, nullptr);
    };
    const double f32 = bench::MedianMs([&] { return grouped(false); }) * 1e3;
    const double b16 = bench::MedianMs([&] { return grouped(true); }) * 1e3;
    char name[64];
    std::snprintf(name, sizeof(name), "%s x%d", s.name, experts);
    Print(name, rows, s.n, s.k, bf16, lt_ok ? lt : -1, f32, b16);
  }

  static void Header() {
    std::printf("%-22s %6s %6s %6s | %-16s | %-16s | %-16s | %-16s | %6s %6s\n", "shape", "m", "n",
                "k", "bf16 cublas", "fp8 cublasLt", "wgmma f32", "wgmma bf16", "x bf16", "x lt");
    std::printf("%-22s %6s %6s %6s | %-16s | %-16s | %-16s | %-16s |\n", "", "", "", "",
                "us TFLOP/s", "us TFLOP/s", "us TFLOP/s", "us TFLOP/s");
  }

 private:
  static void Print(const char* name, int64_t m, int64_t n, int64_t k, double bf16, double lt,
                    double f32, double b16) {
    auto cell = [&](double us) {
      static char buf[4][32];
      static int i = 0;
      char* b = buf[i++ % 4];
      if (us < 0) {
        std::snprintf(b, 32, "%16s", "-");
      } else {
        std::snprintf(b, 32, "%8.1f %7.1f", us, Tflops(m, n, k, us));
      }
      return b;
    };
    const double best = std::min(f32, b16);
    std::printf("%-22s %6lld %6lld %6lld | %s | %s | %s | %s | %6.2f %6.2f\n", name,
                static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                cell(bf16), cell(lt), cell(f32), cell(b16), bf16 / best, lt > 0 ? lt / best : 0.0);
    std::fflush(stdout);
  }

  cublasHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;
  std::unique_ptr<CublasLtFp8Gemm> lt_;
  uint8_t* a8_ = nullptr;
  uint16_t* a16_ = nullptr;
  float* sa_ = nullptr;
  float* c_ = nullptr;
};

int Main() {
  if (!kernels::Fp8WgmmaDeviceSupports()) {
    std::fprintf(stderr, "fp8_wgmma_bench: this device or binary does not run the wgmma kernel\n");
    return 2;
  }
  Bench b;
  const std::vector<int64_t> ms = {1024, 4096, 16384};
  const std::vector<Shape> dense = {
      {"moonlight gate_up", 2816, 2048, 1408}, {"moonlight down", 2048, 1408, 0},
      {"moonlight q/o 2048", 2048, 2048, 0},   {"v3 q_b", 24576, 1536, 0},
      {"v3 expert gu", 4096, 7168, 2048},      {"v3 o_proj", 7168, 16384, 0}};
  b.Reserve(std::max<int64_t>(16384 * 16384, 64 * 3072 * 2048),
            std::max<int64_t>(16384 * 24576, 64 * 3072 * 2816));
  Bench::Header();
  for (const Shape& s : dense) b.Dense(s, ms);
  b.Grouped({"moonlight gate_up", 2816, 2048, 1408}, 64, 3072);
  b.Grouped({"moonlight down", 2048, 1408, 0}, 64, 3072);
  return 0;
}

}  // namespace
}  // namespace deepinfer

int main() { return deepinfer::Main(); }
