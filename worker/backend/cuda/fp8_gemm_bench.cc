// fp8_gemm_bench: the FP8 block-scaled GEMM paths of CudaBackend::Gemm against bf16 at the
// Moonlight-shaped and DeepSeek-V3 layer shapes, per row count m (decode batches to prefill).
// One line per (shape, m), microseconds per call of each path ("-": the path does not take it):
//   bf16 cublas  cublasGemmEx, bf16 weights and activations, fp32 output
//        small   kernels::SmallMGemmBf16 (m <= 4, where it takes the shape; fp32 activations)
//   fp8  core    kernels::Fp8SmallMGemm (CUDA cores, m <= 32)
//        mma     kernels::Fp8MmaGemm (bf16 tensor cores, the FP8 weight widened in registers;
//                the tile kernels::Fp8MmaDenseTile picks for m, as CudaBackend::Gemm),
//                fp32 activations; mma16: the same with bf16 activations (the model's normed rows)
//        tiled   kernels::Fp8TiledGemm (bf16 tensor cores, block tiles through shared memory; bf16
//                activations; 16 <= m <= 1024) with its default block rows and k split, its k
//                split's add included (CudaBackend::Gemm takes it from 17 rows and rounds fp32
//                rows to bf16 in a launch of its own first, not timed here); tbest: the fastest of
//                block rows 32 / 64 / 128 (128 only above 256 rows) x k split 1, the default and
//                twice it, named after the table as tiled=BM/split
//        w8a8    kernels::Fp8QuantizeRows + CublasLtFp8Gemm (FP8 tensor cores; compute
//                capability 9.0), and lt: the cuBLASLt GEMM alone
//        deq     kernels::Fp8DequantToBf16 + cublasGemmEx (m >= 33)
// then the fastest bf16 and FP8 path with TFLOP/s (2 m n k) and GB/s (weight bytes, FP8 with its
// scales, plus the activations read and the output written), and the FP8 speed-up. The FP8 paths
// read fp32 activations except mma16 and tiled (tbest is not a candidate for the fastest path).
// Then the routed experts' grouped GEMMs at decode token counts (uniform random top-k):
// kernels::Fp8MmaGroupedGemm (bf16 rows, the FP8 device path; "mma" its default tile
// kernels::kGroupedMmaTile, "mma narrow" the plain register loop; the same pair for MXFP4),
// kernels::Mxfp4MmaGroupedGemm (MXFP4 experts, a line of its own; "mxfp4 w4a8" beside it:
// kernels::Mxfp4W4a8GroupedGemm on the e4m3 rows that "quant" makes, FP8 tensor cores, sm_89+,
// and w4a8 + quant against mxfp4 mma), kernels::Fp8GroupedGemm (fp32
// rows, the FP8 fallback) and kernels::GroupedGemmBf16 (bf16 weights, the bf16 path's kernel at 1-2
// tokens), GB/s of the busy experts' weights; then "fp8 wgmma-swap":
// kernels::Fp8WgmmaSwapGroupedGemm (W8A8 on wgmma, weights on the M side; compute capability 9.0)
// on e4m3 rows in its persistent grid (the default), "per-tile" the same with one CTA per (weight
// tile, expert), "quant" the kernels::Fp8QuantizeRows launch that makes them from the bf16 rows
// (grouped scale layout), timed on its own, and the speed-ups of swap + quant against mma and bf16;
// "mxfp4 wgmma-swap": kernels::Mxfp4WgmmaSwapGroupedGemm (MXFP4 weights widened to e4m3 in
// registers, swap-AB on wgmma) on the same e4m3 rows, GB/s of the busy experts' MXFP4 bytes, and
// its speed-ups against mxfp4 mma, mxfp4 w4a8 and fp8 wgmma-swap (quant not included).
//
// Time: a CUDA graph of back-to-back launches, each on its own copy of the weights (copies for
// 256 MiB, so the weights come from HBM as in a model step; a single copy where one is larger),
// median of 7 replays, per launch. The H200's HBM peak is 4.8 TB/s, its dense bf16 / FP8 tensor
// peaks 989 / 1979 TFLOP/s.
//
//   fp8_gemm_bench [--quick | --variants | --grouped | --swap-pdl]   (--quick: m = 1, 8, 16, 32,
//   64, 128, 256, 1024 only; --grouped: the grouped section alone; --swap-pdl: the swap-AB GEMM
//   behind its input's kernel with programmatic dependent launch and without, Moonlight and V3 at
//   8, 64 and 128 tokens, fp8_swap_pdl_bench.cc;
//   --variants:
//       only the tile-loop variants of the tensor-core kernels against bf16, same shapes,
//       fp8_mma_variants_bench.cc; exit status 1 on a CUDA or cuBLAS error)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/gemm/fp8_mma_gemm.h"
#include "kernels/gemm/fp8_quantize.h"
#include "kernels/gemm/fp8_tiled_gemm.h"
#include "kernels/gemm/fp8_wgmma_decode.h"
#include "kernels/gemm/mxfp4_mma_gemm.h"
#include "kernels/gemm/mxfp4_w4a8_gemm.h"
#include "kernels/gemm/mxfp4_wgmma_decode.h"
#include "kernels/gemm/small_m_gemm.h"
#include "kernels/moe/grouped_gemm.h"
#include "kernels/testing/bench_timer.h"
#include "kernels/testing/bench_util.h"
#include "kernels/testing/gemm_bench_shapes.h"
#include "worker/backend/cuda/cublaslt_fp8_gemm.h"
#include "worker/backend/cuda/fp8_mma_variants_bench.h"
#include "worker/backend/cuda/fp8_swap_pdl_bench.h"

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
using bench::GemmShape;
using bench::MoeShape;
using bench::RandomFp8;

constexpr size_t kRotateBytes = size_t{256} << 20;
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// The most rows the tiled kernel is timed at.
constexpr int64_t kTiledMaxRows = 1024;

// Median microseconds per launch of `launch(copy, stream)` recorded `copies` times into one
// graph (7 timed replays).
double GraphMicros(int copies, const std::function<void(int, cudaStream_t)>& launch) {
  return bench::GraphMicrosPerLaunch(copies, launch, 7);
}

std::vector<float> Scales(int64_t rows, int64_t k) {
  return std::vector<float>(kernels::Fp8ScaleRows(rows, 0) * kernels::Fp8ScaleLd(k), 1.0f / 448);
}

struct Result {
  const char* path = nullptr;
  double us = 0;
};

// The fastest bf16 and FP8 path of one (shape, m), for the summary tables.
struct Cell {
  std::string shape;
  int64_t m = 0;
  const char* fp8_path = "-";  // the fastest FP8 path's column name
  double speedup = 0;          // best bf16 time / best FP8 time (0: no FP8 path)
};

// Two tables, one row per shape and one column per m: the FP8 speed-up over bf16 (both their
// fastest paths) and which FP8 path was fastest.
void PrintSummary(const std::vector<Cell>& cells, const std::vector<int64_t>& ms) {
  for (int table = 0; table < 2; ++table) {
    std::printf("\n%s\n%-15s",
                table == 0 ? "FP8 speed-up over bf16 (fastest path each)" : "fastest FP8 path",
                "shape \\ m");
    for (int64_t m : ms) std::printf(" %6ld", static_cast<long>(m));
    std::printf("\n");
    std::string shape;
    for (const Cell& c : cells) {
      if (c.shape != shape) {
        if (!shape.empty()) std::printf("\n");
        shape = c.shape;
        std::printf("%-15s", shape.c_str());
      }
      if (table == 0) {
        std::printf(" %6.2f", c.speedup);
      } else {
        std::printf(" %6s", c.fp8_path);
      }
    }
    std::printf("\n");
  }
}

// The GEMM shapes and the helpers shared by their paths.
class DenseBench {
 public:
  DenseBench() {
    BENCH_BLAS(cublasCreate(&blas_));
    workspace_ = DeviceAlloc<void>(kWorkspaceBytes);
    BENCH_BLAS(cublasSetWorkspace(blas_, workspace_, kWorkspaceBytes));
    auto lt = CublasLtFp8Gemm::Create(workspace_, kWorkspaceBytes);
    if (!lt.ok()) {
      std::fprintf(stderr, "CublasLtFp8Gemm::Create: %s\n", lt.status().ToString().c_str());
      std::exit(1);
    }
    lt_ = std::move(*lt);
    int device = 0;
    BENCH_CUDA(cudaGetDevice(&device));
    w8a8_device_ = CublasLtFp8Gemm::DeviceSupports(device);
  }

  const std::vector<Cell>& cells() const { return cells_; }

  void Run(const GemmShape& s, const std::vector<int64_t>& ms) {
    const int64_t m_max = *std::max_element(ms.begin(), ms.end());
    const size_t fp8_bytes = static_cast<size_t>(s.n) * s.k;
    const std::vector<float> scales = Scales(s.n, s.k);
    const size_t scale_bytes = scales.size() * sizeof(float);
    // Copies enough to leave L2 behind; fewer where the bf16 and FP8 copies would pass ~3 GiB.
    const int copies = static_cast<int>(std::max<size_t>(
        1,
        std::min<size_t>({64, kRotateBytes / fp8_bytes + 1, (size_t{3} << 30) / (3 * fp8_bytes)})));
    std::vector<uint8_t*> w8(copies);
    std::vector<float*> sc(copies);
    std::vector<uint16_t*> w16(copies);
    const std::vector<uint8_t> host8 = RandomFp8(fp8_bytes, s.n + s.k);
    for (int c = 0; c < copies; ++c) {
      w8[c] = bench::Upload(host8);
      sc[c] = bench::Upload(scales);
      w16[c] = DeviceAlloc<uint16_t>(fp8_bytes * 2);
      BENCH_CUDA(cudaMemset(w16[c], 0x3c, fp8_bytes * 2));
    }
    float* a = bench::Upload(bench::Uniform(m_max * s.k, 7));
    uint16_t* a16 = DeviceAlloc<uint16_t>(m_max * s.k * 2);
    BENCH_CUDA(cudaMemset(a16, 0x3c, m_max * s.k * 2));
    float* c = DeviceAlloc<float>(m_max * s.n * sizeof(float));
    const int64_t m4_max = (m_max + 3) / 4 * 4;
    uint8_t* q = DeviceAlloc<uint8_t>(m4_max * s.k);
    float* qs = DeviceAlloc<float>(kernels::Fp8ScaleCols(s.k) * m4_max * sizeof(float));
    uint16_t* deq = DeviceAlloc<uint16_t>(fp8_bytes * 2);
    float* d_pad = DeviceAlloc<float>(m4_max * s.n * sizeof(float));
    // The tiled kernel's configurations and the largest workspace one of them takes.
    const int32_t auto_split = kernels::Fp8TiledKSplit(s.n, s.k);
    const int64_t k_blocks = (s.k + 127) / 128;
    std::vector<int32_t> splits;
    for (const int32_t split : {1, auto_split, 2 * auto_split}) {
      if (split <= std::min<int64_t>(k_blocks, kernels::kFp8TiledMaxKSplit) &&
          std::find(splits.begin(), splits.end(), split) == splits.end()) {
        splits.push_back(split);
      }
    }
    const int64_t tiled_rows = std::min<int64_t>(m_max, kTiledMaxRows);
    float* tiled_ws = DeviceAlloc<float>(std::max<size_t>(
        16, *std::max_element(splits.begin(), splits.end()) * tiled_rows * s.n * sizeof(float)));

    for (int64_t m : ms) {
      auto weight = [&](int i) {
        kernels::Fp8BlockWeight w;
        w.data = w8[i], w.ldw = s.k, w.scales = sc[i], w.scale_ld = kernels::Fp8ScaleLd(s.k);
        return w;
      };
      auto cublas_bf16 = [&](const uint16_t* w, const uint16_t* act, cudaStream_t st) {
        const float alpha = 1.0f, beta = 0.0f;
        BENCH_BLAS(cublasSetStream(blas_, st));
        BENCH_BLAS(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s.n),
                                static_cast<int>(m), static_cast<int>(s.k), &alpha, w, CUDA_R_16BF,
                                static_cast<int>(s.k), act, CUDA_R_16BF, static_cast<int>(s.k),
                                &beta, c, CUDA_R_32F, static_cast<int>(s.n), CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
      };
      std::vector<Result> bf16, fp8;
      bf16.push_back({"cublas", GraphMicros(copies, [&](int i, cudaStream_t st) {
                        cublas_bf16(w16[i], a16, st);
                      })});
      kernels::SmallMGemmParams sm;
      sm.m = m, sm.n = s.n, sm.k = s.k, sm.a = a, sm.lda = s.k, sm.w = w16[0], sm.ldw = s.k;
      sm.c = c, sm.ldc = s.n;
      double small_us = -1;
      if (kernels::SmallMGemmSupports(sm)) {
        small_us = GraphMicros(copies, [&](int i, cudaStream_t st) {
          kernels::SmallMGemmParams p = sm;
          p.w = w16[i];
          BENCH_CUDA(kernels::SmallMGemmBf16(p, st));
        });
        bf16.push_back({"small", small_us});
      }
      double core_us = -1, mma_us = -1, mma16_us = -1, w8a8_us = -1, lt_us = -1, deq_us = -1;
      double tiled_us = -1, tbest_us = -1;
      char tbest_name[32] = "";
      kernels::Fp8SmallMGemmParams core;
      core.m = m, core.n = s.n, core.k = s.k, core.a = a, core.lda = s.k, core.w = weight(0);
      core.c = c, core.ldc = s.n;
      if (m <= 32 && kernels::Fp8SmallMGemmSupports(core)) {
        core_us = GraphMicros(copies, [&](int i, cudaStream_t st) {
          kernels::Fp8SmallMGemmParams p = core;
          p.w = weight(i);
          BENCH_CUDA(kernels::Fp8SmallMGemm(p, st));
        });
        fp8.push_back({"core", core_us});
      }
      kernels::Fp8MmaGemmParams mma;
      mma.m = m, mma.n = s.n, mma.k = s.k, mma.a = a, mma.lda = s.k, mma.w = weight(0);
      mma.c = c, mma.ldc = s.n, mma.tile = kernels::Fp8MmaDenseTile(m);
      if (kernels::Fp8MmaGemmSupports(mma)) {
        mma_us = GraphMicros(copies, [&](int i, cudaStream_t st) {
          kernels::Fp8MmaGemmParams p = mma;
          p.w = weight(i);
          BENCH_CUDA(kernels::Fp8MmaGemm(p, st));
        });
        fp8.push_back({"mma", mma_us});
        kernels::Fp8MmaGemmParams mma16 = mma;
        mma16.a = a16;
        mma16.a_bf16 = true;
        mma16_us = GraphMicros(copies, [&](int i, cudaStream_t st) {
          kernels::Fp8MmaGemmParams p = mma16;
          p.w = weight(i);
          BENCH_CUDA(kernels::Fp8MmaGemm(p, st));
        });
        fp8.push_back({"mma16", mma16_us});
      }
      kernels::Fp8TiledGemmParams tp;
      tp.m = m, tp.n = s.n, tp.k = s.k, tp.a = a16, tp.lda = s.k, tp.w = weight(0);
      tp.c = c, tp.ldc = s.n, tp.workspace = tiled_ws;
      auto tiled_micros = [&](int32_t block_rows, int32_t split) {
        kernels::Fp8TiledGemmParams q = tp;
        q.block_rows = block_rows, q.k_split = split;
        if (!kernels::Fp8TiledGemmSupports(q)) return -1.0;
        return GraphMicros(copies, [&](int i, cudaStream_t st) {
          kernels::Fp8TiledGemmParams one = q;
          one.w = weight(i);
          BENCH_CUDA(kernels::Fp8TiledGemm(one, st));
        });
      };
      if (m >= 16 && m <= kTiledMaxRows) {
        tiled_us = tiled_micros(0, 0);
        if (tiled_us >= 0) fp8.push_back({"tiled", tiled_us});
        for (const int32_t bm : kernels::kFp8TiledBlockRows) {
          if (m > 256 && bm < 128) continue;
          for (const int32_t split : splits) {
            const double us = tiled_micros(bm, split);
            if (us >= 0 && (tbest_us < 0 || us < tbest_us)) {
              tbest_us = us;
              std::snprintf(tbest_name, sizeof(tbest_name), " tiled=%d/%d", bm, split);
            }
          }
        }
      }
      // W8A8 as CudaBackend::Gemm runs it: quantise, GEMM (into scratch and moved when m is not
      // a multiple of 4).
      const int64_t m4 = (m + 3) / 4 * 4;
      Fp8LtGemm g;
      g.m = m4, g.n = s.n, g.k = s.k, g.q = q, g.ldq = s.k, g.q_scales = qs, g.w = weight(0);
      g.d = m4 == m ? static_cast<void*>(c) : static_cast<void*>(d_pad), g.ldd = s.n;
      auto ready = lt_->Ready(g);
      if (w8a8_device_ && ready.ok() && *ready) {
        kernels::Fp8QuantizeParams qp;
        qp.m = m, qp.k = s.k, qp.a = a, qp.lda = s.k, qp.q = q, qp.ldq = s.k, qp.scales = qs;
        qp.m_pad = m4;
        auto gemm = [&](int i, cudaStream_t st) {
          Fp8LtGemm one = g;
          one.w = weight(i);
          auto ran = lt_->Run(one, st);
          if (!ran.ok() || !*ran) {
            std::fprintf(stderr, "CublasLtFp8Gemm::Run failed\n");
            std::exit(1);
          }
        };
        w8a8_us = GraphMicros(copies, [&](int i, cudaStream_t st) {
          BENCH_CUDA(kernels::Fp8QuantizeRows(qp, st));
          gemm(i, st);
          if (m4 != m) {
            BENCH_CUDA(kernels::AddRowsF32(m, s.n, d_pad, s.n, c, s.n, false, st));
          }
        });
        lt_us = GraphMicros(copies, gemm);
        fp8.push_back({"w8a8", w8a8_us});
      }
      if (m > 32) {
        deq_us = GraphMicros(copies, [&](int i, cudaStream_t st) {
          BENCH_CUDA(kernels::Fp8DequantToBf16(weight(i), s.n, s.k, deq, st));
          cublas_bf16(deq, a16, st);
        });
        fp8.push_back({"deq", deq_us});
      }
      auto cell = [](double us) {
        static char buf[16][16];
        static int next = 0;
        char* b = buf[next++ % 16];
        if (us < 0) {
          std::snprintf(b, 16, "%9s", "-");
        } else {
          std::snprintf(b, 16, "%9.2f", us);
        }
        return b;
      };
      auto best = [](const std::vector<Result>& v) {
        return *std::min_element(v.begin(), v.end(),
                                 [](const Result& x, const Result& y) { return x.us < y.us; });
      };
      const Result b16 = best(bf16);
      const double flops = 2.0 * m * s.n * s.k;
      const double act_out = m * s.k * 4.0 + m * s.n * 4.0;
      std::printf("%-15s %6ld %6ld %5ld |%s%s |%s%s%s%s%s%s%s%s |", s.name, static_cast<long>(s.n),
                  static_cast<long>(s.k), static_cast<long>(m), cell(bf16[0].us), cell(small_us),
                  cell(core_us), cell(mma_us), cell(mma16_us), cell(tiled_us), cell(tbest_us),
                  cell(w8a8_us), cell(lt_us), cell(deq_us));
      std::printf(" %-6s %6.1f %6.0f |", b16.path, flops / b16.us / 1e6,
                  (2.0 * fp8_bytes + act_out) / b16.us / 1e3);
      if (fp8.empty()) {
        std::printf(" no FP8 path%s\n", tbest_name);
        cells_.push_back({s.name, m, "-", 0.0});
        continue;
      }
      const Result b8 = best(fp8);
      std::printf(" %-5s %6.1f %6.0f | %5.2fx%s\n", b8.path, flops / b8.us / 1e6,
                  (fp8_bytes + scale_bytes + act_out) / b8.us / 1e3, b16.us / b8.us, tbest_name);
      cells_.push_back({s.name, m, b8.path, b16.us / b8.us});
    }
    for (int i = 0; i < copies; ++i) {
      BENCH_CUDA(cudaFree(w8[i]));
      BENCH_CUDA(cudaFree(sc[i]));
      BENCH_CUDA(cudaFree(w16[i]));
    }
    for (void* p : std::vector<void*>{a, a16, c, q, qs, deq, d_pad, tiled_ws}) {
      BENCH_CUDA(cudaFree(p));
    }
  }

 private:
  cublasHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;
  std::unique_ptr<CublasLtFp8Gemm> lt_;
  bool w8a8_device_ = false;
  std::vector<Cell> cells_;
};

void GroupedBench(const MoeShape& ms) {
  const int32_t E = ms.experts, K = ms.top_k;
  for (const bool gate_up : {true, false}) {
    const int64_t n = gate_up ? 2 * ms.inter : ms.hidden, k = gate_up ? ms.hidden : ms.inter;
    const int64_t split = gate_up ? ms.inter : 0;
    const size_t bytes = static_cast<size_t>(n) * k;
    const std::vector<float> scales(kernels::Fp8ScaleRows(n, split) * kernels::Fp8ScaleLd(k),
                                    1.0f / 448);
    const std::vector<uint8_t> host8 = RandomFp8(bytes, n + k);
    // MXFP4: any byte is two e2m1 values; scales 2^-6.
    const std::vector<uint8_t> host4(host8.begin(), host8.begin() + bytes / 2);
    const std::vector<uint8_t> mx_scales(bytes / kernels::kMxfp4BlockSize, 121);
    std::vector<const uint8_t*> w8(E), w4(E), sc4(E);
    std::vector<const float*> sc(E);
    std::vector<const uint16_t*> w16(E);
    for (int32_t e = 0; e < E; ++e) {
      w8[e] = bench::Upload(host8);
      sc[e] = bench::Upload(scales);
      w4[e] = bench::Upload(host4);
      sc4[e] = bench::Upload(mx_scales);
      uint16_t* b = DeviceAlloc<uint16_t>(bytes * 2);
      BENCH_CUDA(cudaMemset(b, 0x3c, bytes * 2));
      w16[e] = b;
    }
    const uint8_t* const* dw8 = bench::Upload(w8);
    const uint8_t* const* dw4 = bench::Upload(w4);
    const uint8_t* const* dsc4 = bench::Upload(sc4);
    const float* const* dsc = bench::Upload(sc);
    const uint16_t* const* dw16 = bench::Upload(w16);
    // The swap-AB kernel's weight descriptors, built once per weight set.
    const bool swap_ok = kernels::Fp8WgmmaSwapDeviceSupports();
    void* swap_maps = DeviceAlloc<void>(kernels::Fp8WgmmaSwapWeightMapsBytes(E));
    if (swap_ok) {
      BENCH_CUDA(kernels::Fp8WgmmaSwapBuildWeightMaps(E, w8.data(), n, k, k, swap_maps, nullptr));
    }
    // The MXFP4 swap-AB kernel's descriptors and its exponent-bound check (the bench's scales are
    // all equal: every matrix fits).
    const bool mx_swap_ok = kernels::Mxfp4WgmmaSwapDeviceSupports() && E <= 1024;
    void* mx_swap_maps = DeviceAlloc<void>(kernels::Mxfp4WgmmaSwapWeightMapsBytes(E));
    bool mx_fits = false;
    if (mx_swap_ok) {
      BENCH_CUDA(kernels::Mxfp4WgmmaSwapBuildWeightMaps(E, w4.data(), n, k, mx_swap_maps, nullptr));
      BENCH_CUDA(kernels::Mxfp4WgmmaSwapCheck(E, dw4, dsc4, n, k, k / kernels::kMxfp4BlockSize,
                                              &mx_fits, nullptr));
    }
    for (int32_t tokens : {1, 8, 32, 64, 128, 256}) {
      const bench::Routing routing = bench::RandomRouting(tokens, E, K);
      const int32_t busy = routing.busy;
      const int32_t rows = tokens * K;
      int32_t* doff = bench::Upload(routing.offsets);
      float* a = bench::Upload(bench::Uniform(static_cast<size_t>(rows) * k, 3));
      uint16_t* a16 = DeviceAlloc<uint16_t>(static_cast<size_t>(rows) * k * 2);
      BENCH_CUDA(cudaMemset(a16, 0x3c, static_cast<size_t>(rows) * k * 2));
      float* c = DeviceAlloc<float>(static_cast<size_t>(rows) * n * sizeof(float));
      kernels::Fp8MmaGroupedGemmParams mp;
      mp.num_groups = E, mp.max_rows = rows, mp.offsets = doff, mp.n = n, mp.k = k, mp.a = a16;
      mp.weights = dw8, mp.scales = dsc, mp.scale_ld = kernels::Fp8ScaleLd(k);
      mp.split_rows = split, mp.c = c;
      mp.rows_per_group_hint = std::min(tokens, std::max(1, (tokens * K + E - 1) / E));
      kernels::Mxfp4MmaGroupedGemmParams xp;
      xp.num_groups = E, xp.max_rows = rows, xp.offsets = doff, xp.n = n, xp.k = k, xp.a = a16;
      xp.weights = dw4, xp.scales = dsc4, xp.scale_ld = k / kernels::kMxfp4BlockSize, xp.c = c;
      xp.rows_per_group_hint = mp.rows_per_group_hint;
      kernels::Fp8GroupedGemmParams op;
      op.num_groups = E, op.max_rows = rows, op.offsets = doff, op.n = n, op.k = k, op.a = a;
      op.weights = dw8, op.scales = dsc, op.scale_ld = kernels::Fp8ScaleLd(k);
      op.split_rows = split, op.c = c;
      kernels::GroupedGemmBf16Params bp;
      bp.num_slots = E, bp.max_rows = rows, bp.slot_offsets = doff, bp.n = static_cast<int32_t>(n);
      bp.k = static_cast<int32_t>(k), bp.x = a, bp.weights = dw16, bp.y = c;
      bp.rows_per_slot_hint = tokens;
      // One replay reads each busy expert's weights once (4 launches a graph: L2 may keep a
      // single token's few experts between launches).
      // The tensor-core kernel with its default tile and with the plain register loop.
      auto mma_micros = [&](const kernels::MmaTileOptions& tile) {
        kernels::Fp8MmaGroupedGemmParams q = mp;
        q.tile = tile;
        return kernels::Fp8MmaGroupedGemmSupports(q)
                   ? GraphMicros(4,
                                 [&](int, cudaStream_t st) {
                                   BENCH_CUDA(kernels::Fp8MmaGroupedGemm(q, st));
                                 })
                   : -1;
      };
      const double mma_us = mma_micros(kernels::kGroupedMmaTile),
                   regs_us = mma_micros(kernels::MmaTileOptions());
      auto mx_micros = [&](const kernels::MmaTileOptions& tile) {
        kernels::Mxfp4MmaGroupedGemmParams q = xp;
        q.tile = tile;
        return kernels::Mxfp4MmaGroupedGemmSupports(q)
                   ? GraphMicros(4,
                                 [&](int, cudaStream_t st) {
                                   BENCH_CUDA(kernels::Mxfp4MmaGroupedGemm(q, st));
                                 })
                   : -1;
      };
      const double mx_us = mx_micros(kernels::kGroupedMmaTile),
                   mx_regs_us = mx_micros(kernels::MmaTileOptions());
      const double old_us = GraphMicros(
          4, [&](int, cudaStream_t st) { BENCH_CUDA(kernels::Fp8GroupedGemm(op, st)); });
      const double bf16_us = GraphMicros(
          4, [&](int, cudaStream_t st) { BENCH_CUDA(kernels::GroupedGemmBf16(bp, st)); });
      // W8A8 swap-AB: e4m3 rows and their grouped scales from the bf16 rows.
      const int64_t blocks = kernels::Fp8ScaleCols(k);
      uint8_t* q8 = DeviceAlloc<uint8_t>(static_cast<size_t>(rows) * k);
      float* qs = DeviceAlloc<float>(static_cast<size_t>(rows) * blocks * sizeof(float));
      kernels::Fp8QuantizeParams qp;
      qp.m = rows, qp.k = k, qp.a = a16, qp.a_bf16 = true, qp.lda = k, qp.q = q8, qp.ldq = k;
      qp.scales = qs, qp.m_pad = rows, qp.group_offsets = doff, qp.num_groups = E;
      BENCH_CUDA(kernels::Fp8QuantizeRows(qp, nullptr));
      kernels::Fp8WgmmaSwapGroupedGemmParams sp;
      sp.num_groups = E, sp.max_rows = rows, sp.offsets = doff, sp.n = n, sp.k = k, sp.a = q8;
      sp.lda = k, sp.a_scales = qs, sp.weight_maps = swap_maps, sp.scales = dsc;
      sp.scale_ld = kernels::Fp8ScaleLd(k), sp.split_rows = split, sp.c = c, sp.ldc = n;
      sp.rows_per_group_hint = mp.rows_per_group_hint;
      const bool swap_takes = swap_ok && kernels::Fp8WgmmaSwapGroupedGemmSupports(sp);
      const double swap_us =
          swap_takes ? GraphMicros(4,
                                   [&](int, cudaStream_t st) {
                                     BENCH_CUDA(kernels::Fp8WgmmaSwapGroupedGemm(sp, st));
                                   })
                     : -1;
      // The same kernel with one CTA per (weight tile, expert) instead of the persistent grid.
      kernels::Fp8WgmmaSwapGroupedGemmParams tp = sp;
      tp.persistent = false;
      const double tile_us =
          swap_takes ? GraphMicros(4,
                                   [&](int, cudaStream_t st) {
                                     BENCH_CUDA(kernels::Fp8WgmmaSwapGroupedGemm(tp, st));
                                   })
                     : -1;
      // The persistent form writing bf16 (c_bf16, into c's memory): RunFp8SwapGroups' gate_up.
      kernels::Fp8WgmmaSwapGroupedGemmParams bp16 = sp;
      bp16.c = nullptr;
      bp16.c_bf16 = reinterpret_cast<uint16_t*>(c);
      const double swap_bf16_us =
          swap_takes ? GraphMicros(4,
                                   [&](int, cudaStream_t st) {
                                     BENCH_CUDA(kernels::Fp8WgmmaSwapGroupedGemm(bp16, st));
                                   })
                     : -1;
      const double quant_us =
          swap_takes
              ? GraphMicros(
                    4, [&](int, cudaStream_t st) { BENCH_CUDA(kernels::Fp8QuantizeRows(qp, st)); })
              : -1;
      // MXFP4 W4A8: the same e4m3 rows and grouped scales as the swap kernel's.
      kernels::Mxfp4W4a8GroupedGemmParams wp;
      wp.num_groups = E, wp.max_rows = rows, wp.offsets = doff, wp.n = n, wp.k = k, wp.a = q8;
      wp.a_scales = qs, wp.weights = dw4, wp.scales = dsc4;
      wp.scale_ld = k / kernels::kMxfp4BlockSize, wp.c = c;
      wp.rows_per_group_hint = mp.rows_per_group_hint;
      const bool w4a8_takes = kernels::Mxfp4W4a8GroupedGemmSupports(wp);
      const double w4a8_us = w4a8_takes
                                 ? GraphMicros(4,
                                               [&](int, cudaStream_t st) {
                                                 BENCH_CUDA(kernels::Mxfp4W4a8GroupedGemm(wp, st));
                                               })
                                 : -1;
      const double w4a8_quant_us =
          w4a8_takes
              ? GraphMicros(
                    4, [&](int, cudaStream_t st) { BENCH_CUDA(kernels::Fp8QuantizeRows(qp, st)); })
              : -1;
      // MXFP4 x e4m3 swap-AB on wgmma: the same e4m3 rows and grouped scales.
      kernels::Mxfp4WgmmaSwapGroupedGemmParams xs;
      xs.num_groups = E, xs.max_rows = rows, xs.offsets = doff, xs.n = n, xs.k = k, xs.a = q8;
      xs.lda = k, xs.a_scales = qs, xs.weight_maps = mx_swap_maps, xs.scales = dsc4;
      xs.scale_ld = k / kernels::kMxfp4BlockSize, xs.c = c, xs.ldc = n;
      xs.rows_per_group_hint = mp.rows_per_group_hint;
      const bool mx_swap_takes =
          mx_swap_ok && mx_fits && kernels::Mxfp4WgmmaSwapGroupedGemmSupports(xs);
      const double mx_swap_us =
          mx_swap_takes ? GraphMicros(4,
                                      [&](int, cudaStream_t st) {
                                        BENCH_CUDA(kernels::Mxfp4WgmmaSwapGroupedGemm(xs, st));
                                      })
                        : -1;
      const double fp8_busy = static_cast<double>(busy) * (bytes + scales.size() * 4);
      const double bf16_busy = static_cast<double>(busy) * bytes * 2;
      std::printf(
          "%-10s %-8s n=%5ld k=%5ld tokens=%3d busy=%3d | fp8 mma %8.2f us %5.0f GB/s | "
          "mma narrow %8.2f us %5.0f GB/s | fp8 core %8.2f us %5.0f GB/s | bf16 %8.2f us %5.0f "
          "GB/s | mma vs bf16 %5.2fx\n",
          ms.name, gate_up ? "gate_up" : "down", static_cast<long>(n), static_cast<long>(k), tokens,
          busy, mma_us, mma_us > 0 ? fp8_busy / mma_us / 1e3 : 0.0, regs_us,
          regs_us > 0 ? fp8_busy / regs_us / 1e3 : 0.0, old_us, fp8_busy / old_us / 1e3, bf16_us,
          bf16_busy / bf16_us / 1e3, mma_us > 0 ? bf16_us / mma_us : 0.0);
      const double mx_busy = static_cast<double>(busy) * (bytes / 2 + mx_scales.size());
      std::printf(
          "%-10s %-8s n=%5ld k=%5ld tokens=%3d busy=%3d | mxfp4 mma %8.2f us %5.0f GB/s | "
          "mxfp4 narrow %8.2f us %5.0f GB/s | mxfp4 vs bf16 %5.2fx | mxfp4 vs fp8 mma %5.2fx\n",
          ms.name, gate_up ? "gate_up" : "down", static_cast<long>(n), static_cast<long>(k), tokens,
          busy, mx_us, mx_us > 0 ? mx_busy / mx_us / 1e3 : 0.0, mx_regs_us,
          mx_regs_us > 0 ? mx_busy / mx_regs_us / 1e3 : 0.0, mx_us > 0 ? bf16_us / mx_us : 0.0,
          mx_us > 0 && mma_us > 0 ? mma_us / mx_us : 0.0);
      std::printf(
          "%-10s %-8s n=%5ld k=%5ld tokens=%3d busy=%3d | mxfp4 w4a8 %8.2f us %5.0f GB/s | quant "
          "%6.2f us | w4a8 vs mxfp4 mma %5.2fx | w4a8+quant vs mxfp4 mma %5.2fx\n",
          ms.name, gate_up ? "gate_up" : "down", static_cast<long>(n), static_cast<long>(k), tokens,
          busy, w4a8_us, w4a8_us > 0 ? mx_busy / w4a8_us / 1e3 : 0.0, w4a8_quant_us,
          w4a8_us > 0 && mx_us > 0 ? mx_us / w4a8_us : 0.0,
          w4a8_us > 0 && mx_us > 0 ? mx_us / (w4a8_us + w4a8_quant_us) : 0.0);
      std::printf(
          "%-10s %-8s n=%5ld k=%5ld tokens=%3d busy=%3d | mxfp4 wgmma-swap %8.2f us %5.0f GB/s | "
          "vs mxfp4 mma %5.2fx | vs mxfp4 w4a8 %5.2fx | vs fp8 wgmma-swap %5.2fx (N %d)\n",
          ms.name, gate_up ? "gate_up" : "down", static_cast<long>(n), static_cast<long>(k), tokens,
          busy, mx_swap_us, mx_swap_us > 0 ? mx_busy / mx_swap_us / 1e3 : 0.0,
          mx_swap_us > 0 && mx_us > 0 ? mx_us / mx_swap_us : 0.0,
          mx_swap_us > 0 && w4a8_us > 0 ? w4a8_us / mx_swap_us : 0.0,
          mx_swap_us > 0 && swap_us > 0 ? swap_us / mx_swap_us : 0.0,
          kernels::Mxfp4WgmmaSwapChunkRows(xs.rows_per_group_hint));
      const double swap_all = swap_us + quant_us;
      std::printf(
          "%-10s %-8s n=%5ld k=%5ld tokens=%3d busy=%3d | fp8 wgmma-swap %8.2f us %5.0f GB/s | "
          "per-tile %8.2f us %5.0f GB/s | bf16 out %8.2f us | quant %6.2f us | swap+quant vs mma "
          "%5.2fx | swap+quant vs bf16 %5.2fx (hint %d, N %d)\n",
          ms.name, gate_up ? "gate_up" : "down", static_cast<long>(n), static_cast<long>(k), tokens,
          busy, swap_us, swap_us > 0 ? fp8_busy / swap_us / 1e3 : 0.0, tile_us,
          tile_us > 0 ? fp8_busy / tile_us / 1e3 : 0.0, swap_bf16_us, quant_us,
          swap_us > 0 && mma_us > 0 ? mma_us / swap_all : 0.0,
          swap_us > 0 ? bf16_us / swap_all : 0.0, sp.rows_per_group_hint,
          kernels::Fp8WgmmaSwapChunkRows(sp.rows_per_group_hint));
      for (void* p : std::vector<void*>{doff, a, a16, c, q8, qs}) BENCH_CUDA(cudaFree(p));
    }
    for (int32_t e = 0; e < E; ++e) {
      BENCH_CUDA(cudaFree(const_cast<uint8_t*>(w8[e])));
      BENCH_CUDA(cudaFree(const_cast<float*>(sc[e])));
      BENCH_CUDA(cudaFree(const_cast<uint8_t*>(w4[e])));
      BENCH_CUDA(cudaFree(const_cast<uint8_t*>(sc4[e])));
      BENCH_CUDA(cudaFree(const_cast<uint16_t*>(w16[e])));
    }
    BENCH_CUDA(cudaFree(const_cast<uint8_t**>(dw8)));
    BENCH_CUDA(cudaFree(const_cast<float**>(dsc)));
    BENCH_CUDA(cudaFree(const_cast<uint8_t**>(dw4)));
    BENCH_CUDA(cudaFree(const_cast<uint8_t**>(dsc4)));
    BENCH_CUDA(cudaFree(const_cast<uint16_t**>(dw16)));
    BENCH_CUDA(cudaFree(swap_maps));
    BENCH_CUDA(cudaFree(mx_swap_maps));
  }
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) {
  using deepinfer::bench::GemmShape;
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const bool variants = argc > 1 && std::strcmp(argv[1], "--variants") == 0;
  const bool grouped = argc > 1 && std::strcmp(argv[1], "--grouped") == 0;
  const bool swap_pdl = argc > 1 && std::strcmp(argv[1], "--swap-pdl") == 0;
  const std::vector<int64_t> ms =
      quick ? std::vector<int64_t>{1, 8, 16, 32, 64, 128, 256, 1024}
            : std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096};
  std::vector<GemmShape> shapes = {
      // Moonlight-shaped (hidden 2048, 16 heads, no q_lora, dense intermediate 11264, two
      // shared experts of 1408, routed experts of 1408).
      {"moon q_proj", 3072, 2048},    {"moon kv_a", 576, 2048},
      {"moon o_proj", 2048, 2048},    {"moon shared gu", 5632, 2048},
      {"moon shared dn", 2048, 2816}, {"moon dense gu", 22528, 2048},
      {"moon dense dn", 2048, 11264}, {"moon expert gu", 2816, 2048},
      {"moon expert dn", 2048, 1408},
  };
  for (const GemmShape& s : deepinfer::bench::DeepSeekV3Gemms()) shapes.push_back(s);
  if (variants) {
    deepinfer::RunTileVariants(
        shapes, {{"moonlight", 64, 6, 2048, 1408}, deepinfer::bench::DeepSeekV3Moe()});
    return 0;
  }
  if (swap_pdl) {
    // Moonlight: two shared experts of 1408 (two parts); V3: one shared expert of 2048.
    deepinfer::RunSwapPdlBench(
        {{{"moonlight", 64, 6, 2048, 1408}, 2}, {deepinfer::bench::DeepSeekV3Moe(), 1}},
        {8, 64, 128});
    return 0;
  }
  if (grouped) {
    deepinfer::GroupedBench({"moonlight", 64, 6, 2048, 1408});
    deepinfer::GroupedBench(deepinfer::bench::DeepSeekV3Moe());
    return 0;
  }
  std::printf(
      "%-15s %6s %6s %5s |%9s%9s |%9s%9s%9s%9s%9s%9s%9s%9s | %-6s %6s %6s | %-5s %6s %6s | "
      "fp8\n",
      "shape", "n", "k", "m", "cublas", "small", "core", "mma", "mma16", "tiled", "tbest", "w8a8",
      "lt", "deq", "bf16", "TF/s", "GB/s", "fp8", "TF/s", "GB/s");
  deepinfer::DenseBench dense;
  for (const GemmShape& s : shapes) dense.Run(s, ms);
  deepinfer::PrintSummary(dense.cells(), ms);
  std::printf("\n");
  deepinfer::GroupedBench({"moonlight", 64, 6, 2048, 1408});
  deepinfer::GroupedBench(deepinfer::bench::DeepSeekV3Moe());
  return 0;
}
