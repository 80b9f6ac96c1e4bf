// fp8_gemm_bench --variants: the tile variants (kernels::MmaTileOptions) still in question after
// the H200 measurement in docs/performance.md ("FP8 weights kept FP8"), side by side with bf16.
// Dense: kernels::Fp8MmaGemm with bf16 activations (the model's normed rows) as "narrow" (16
// weight rows a warp, activations per warp: the default up to 16 rows), "wide" (32 weight rows a
// warp), "narrow2" / "wide2" (the same with two_blocks_per_sm, at most 128 registers a thread),
// "wide+sh2" (wide2 with shared_activations) and "allrows" (all_rows, the default above 16
// rows); then bf16's fastest of cublasGemmEx and SmallMGemmBf16 (m <= 4) and the best variant's
// speed-up over it. Grouped (routed experts at about 1, 8 and 16 rows per expert, uniform random
// top-k): kernels::Fp8MmaGroupedGemm as "narrow" (the plain register loop), "+shared2"
// (shared_activations + two_blocks_per_sm) and "wide+sh2" (kernels::kGroupedMmaTile, the
// default), against kernels::GroupedGemmBf16; then the same for kernels::Mxfp4MmaGroupedGemm on the
// same routing. Each cell: microseconds per call and GB/s of weights (FP8: + scales; grouped: the
// busy experts'). Timing as fp8_gemm_bench's (CUDA graphs, the dense weights rotated over copies
// for 256 MiB; median of 7 replays).
#include "worker/backend/cuda/fp8_mma_variants_bench.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/gemm/fp8_mma_gemm.h"
#include "kernels/gemm/mxfp4_mma_gemm.h"
#include "kernels/gemm/small_m_gemm.h"
#include "kernels/moe/grouped_gemm.h"
#include "kernels/testing/bench_timer.h"
#include "kernels/testing/bench_util.h"

namespace deepinfer {
namespace {

using bench::DeviceAlloc;
using bench::GemmShape;
using bench::MoeShape;

constexpr size_t kRotateBytes = size_t{256} << 20;

double Micros(int copies, const std::function<void(int, cudaStream_t)>& launch) {
  return bench::GraphMicrosPerLaunch(copies, launch, 7);
}

struct Tile {
  const char* name;
  bool wide, shared, two_blocks, all_rows;
};
constexpr Tile kGroupedTiles[] = {{"narrow", false, false, false, false},
                                  {"+shared2", false, true, true, false},
                                  {"wide+sh2", true, true, true, false}};
constexpr Tile kDenseTiles[] = {
    {"narrow", false, false, false, false},  {"wide", true, false, false, false},
    {"narrow2", false, false, true, false},  {"wide2", true, false, true, false},
    {"wide+sh2", true, true, true, false},   {"allrows", false, false, false, true}};

void PrintCell(double us, double bytes) {
  if (us < 0) {
    std::printf(" %8s %5s", "-", "");
  } else {
    std::printf(" %8.2f %5.0f", us, bytes / us / 1e3);
  }
}

void DenseVariants(const GemmShape& s, cublasHandle_t blas) {
  const std::vector<int64_t> ms = {1, 8, 16, 32, 64, 128};
  const int64_t m_max = 128;
  const size_t bytes = static_cast<size_t>(s.n) * s.k;
  const std::vector<float> scales(kernels::Fp8ScaleRows(s.n, 0) * kernels::Fp8ScaleLd(s.k),
                                  1.0f / 448);
  const double fp8_bytes = bytes + scales.size() * 4.0;
  const int copies = static_cast<int>(std::max<size_t>(
      1, std::min<size_t>({64, kRotateBytes / bytes + 1, (size_t{3} << 30) / (3 * bytes)})));
  std::vector<uint8_t*> w8(copies);
  std::vector<float*> sc(copies);
  std::vector<uint16_t*> w16(copies);
  const std::vector<uint8_t> host8 = bench::RandomFp8(bytes, s.n + s.k);
  for (int c = 0; c < copies; ++c) {
    w8[c] = bench::Upload(host8);
    sc[c] = bench::Upload(scales);
    w16[c] = DeviceAlloc<uint16_t>(bytes * 2);
    BENCH_CUDA(cudaMemset(w16[c], 0x3c, bytes * 2));
  }
  float* a = bench::Upload(bench::Uniform(m_max * s.k, 7));
  uint16_t* a16 = DeviceAlloc<uint16_t>(m_max * s.k * 2);
  BENCH_CUDA(cudaMemset(a16, 0x3c, m_max * s.k * 2));
  float* out = DeviceAlloc<float>(m_max * s.n * sizeof(float));
  for (const int64_t m : ms) {
    std::printf("%-15s %6ld %6ld %4ld |", s.name, static_cast<long>(s.n), static_cast<long>(s.k),
                static_cast<long>(m));
    double best = -1;
    for (const Tile& t : kDenseTiles) {
      kernels::Fp8MmaGemmParams p;
      p.m = m, p.n = s.n, p.k = s.k, p.a = a16, p.a_bf16 = true, p.lda = s.k;
      p.w.data = w8[0], p.w.ldw = s.k, p.w.scales = sc[0];
      p.w.scale_ld = kernels::Fp8ScaleLd(s.k);
      p.c = out, p.ldc = s.n;
      p.tile.wide = t.wide;
      p.tile.shared_activations = t.shared;
      p.tile.two_blocks_per_sm = t.two_blocks;
      p.tile.all_rows = t.all_rows;
      double us = -1;
      if (kernels::Fp8MmaGemmSupports(p)) {
        us = Micros(copies, [&](int i, cudaStream_t st) {
          kernels::Fp8MmaGemmParams q = p;
          q.w.data = w8[i], q.w.scales = sc[i];
          BENCH_CUDA(kernels::Fp8MmaGemm(q, st));
        });
        if (best < 0 || us < best) best = us;
      }
      PrintCell(us, fp8_bytes);
    }
    double bf16 = Micros(copies, [&](int i, cudaStream_t st) {
      const float alpha = 1.0f, beta = 0.0f;
      if (cublasSetStream(blas, st) != CUBLAS_STATUS_SUCCESS ||
          cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s.n), static_cast<int>(m),
                       static_cast<int>(s.k), &alpha, w16[i], CUDA_R_16BF, static_cast<int>(s.k),
                       a16, CUDA_R_16BF, static_cast<int>(s.k), &beta, out, CUDA_R_32F,
                       static_cast<int>(s.n), CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "cublasGemmEx failed\n");
        std::exit(1);
      }
    });
    kernels::SmallMGemmParams sm;
    sm.m = m, sm.n = s.n, sm.k = s.k, sm.a = a, sm.lda = s.k, sm.w = w16[0], sm.ldw = s.k;
    sm.c = out, sm.ldc = s.n;
    if (kernels::SmallMGemmSupports(sm)) {
      bf16 = std::min(bf16, Micros(copies, [&](int i, cudaStream_t st) {
                        kernels::SmallMGemmParams q = sm;
                        q.w = w16[i];
                        BENCH_CUDA(kernels::SmallMGemmBf16(q, st));
                      }));
    }
    std::printf(" |");
    PrintCell(bf16, 2.0 * bytes);
    std::printf(" | %5.2fx\n", best > 0 ? bf16 / best : 0.0);
  }
  for (int c = 0; c < copies; ++c) {
    BENCH_CUDA(cudaFree(w8[c]));
    BENCH_CUDA(cudaFree(sc[c]));
    BENCH_CUDA(cudaFree(w16[c]));
  }
  for (void* p : std::vector<void*>{a, a16, out}) BENCH_CUDA(cudaFree(p));
}

void GroupedVariants(const MoeShape& ms) {
  const int32_t E = ms.experts, K = ms.top_k;
  for (const bool gate_up : {true, false}) {
    const int64_t n = gate_up ? 2 * ms.inter : ms.hidden, k = gate_up ? ms.hidden : ms.inter;
    const int64_t split = gate_up ? ms.inter : 0;
    const size_t bytes = static_cast<size_t>(n) * k;
    const std::vector<float> scales(kernels::Fp8ScaleRows(n, split) * kernels::Fp8ScaleLd(k),
                                    1.0f / 448);
    const std::vector<uint8_t> host8 = bench::RandomFp8(bytes, n + k);
    // MXFP4: the first half of the FP8 bytes as e2m1 pairs, scale 2^-6.
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
    for (const int32_t per_expert : {1, 8, 16}) {
      const int32_t tokens = (per_expert * E + K - 1) / K;
      const bench::Routing routing = bench::RandomRouting(tokens, E, K);
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
      // As CudaBackend::ExpertGemmsFp8OnDevice sets it.
      mp.rows_per_group_hint = std::min(tokens, std::max(1, (tokens * K + E - 1) / E));
      const double fp8_busy = static_cast<double>(routing.busy) * (bytes + scales.size() * 4);
      std::printf("%-9s %-7s n=%5ld k=%5ld rows/expert=%2d tokens=%4d busy=%3d |", ms.name,
                  gate_up ? "gate_up" : "down", static_cast<long>(n), static_cast<long>(k),
                  per_expert, tokens, routing.busy);
      double best = -1;
      auto time = [&](const kernels::Fp8MmaGroupedGemmParams& q) {
        double us = -1;
        if (kernels::Fp8MmaGroupedGemmSupports(q)) {
          us = Micros(4,
                      [&](int, cudaStream_t st) { BENCH_CUDA(kernels::Fp8MmaGroupedGemm(q, st)); });
          if (best < 0 || us < best) best = us;
        }
        PrintCell(us, fp8_busy);
      };
      for (const Tile& t : kGroupedTiles) {
        kernels::Fp8MmaGroupedGemmParams q = mp;
        q.tile.wide = t.wide;
        q.tile.shared_activations = t.shared;
        q.tile.two_blocks_per_sm = t.two_blocks;
        time(q);
      }
      kernels::GroupedGemmBf16Params bp;
      bp.num_slots = E, bp.max_rows = rows, bp.slot_offsets = doff, bp.n = static_cast<int32_t>(n);
      bp.k = static_cast<int32_t>(k), bp.x = a, bp.weights = dw16, bp.y = c;
      bp.rows_per_slot_hint = tokens;
      const double bf16 =
          Micros(4, [&](int, cudaStream_t st) { BENCH_CUDA(kernels::GroupedGemmBf16(bp, st)); });
      std::printf(" |");
      PrintCell(bf16, static_cast<double>(routing.busy) * bytes * 2);
      std::printf(" | %5.2fx\n", best > 0 ? bf16 / best : 0.0);

      // The same routing on MXFP4 experts (kernels::Mxfp4MmaGroupedGemm).
      kernels::Mxfp4MmaGroupedGemmParams xp;
      xp.num_groups = E, xp.max_rows = rows, xp.offsets = doff, xp.n = n, xp.k = k, xp.a = a16;
      xp.weights = dw4, xp.scales = dsc4, xp.scale_ld = k / kernels::kMxfp4BlockSize, xp.c = c;
      xp.rows_per_group_hint = mp.rows_per_group_hint;
      const double mx_busy = static_cast<double>(routing.busy) * (bytes / 2 + mx_scales.size());
      std::printf("%-9s %-7s %-52s|", ms.name, gate_up ? "gate_up" : "down", "mxfp4");
      best = -1;
      auto time_mx = [&](const kernels::Mxfp4MmaGroupedGemmParams& q) {
        double us = -1;
        if (kernels::Mxfp4MmaGroupedGemmSupports(q)) {
          us = Micros(
              4, [&](int, cudaStream_t st) { BENCH_CUDA(kernels::Mxfp4MmaGroupedGemm(q, st)); });
          if (best < 0 || us < best) best = us;
        }
        PrintCell(us, mx_busy);
      };
      for (const Tile& t : kGroupedTiles) {
        kernels::Mxfp4MmaGroupedGemmParams q = xp;
        q.tile.wide = t.wide;
        q.tile.shared_activations = t.shared;
        q.tile.two_blocks_per_sm = t.two_blocks;
        time_mx(q);
      }
      std::printf(" |");
      PrintCell(bf16, static_cast<double>(routing.busy) * bytes * 2);
      std::printf(" | %5.2fx\n", best > 0 ? bf16 / best : 0.0);
      for (void* p : std::vector<void*>{doff, a, a16, c}) BENCH_CUDA(cudaFree(p));
    }
    for (int32_t e = 0; e < E; ++e) {
      BENCH_CUDA(cudaFree(const_cast<uint8_t*>(w8[e])));
      BENCH_CUDA(cudaFree(const_cast<uint8_t*>(w4[e])));
      BENCH_CUDA(cudaFree(const_cast<uint8_t*>(sc4[e])));
      BENCH_CUDA(cudaFree(const_cast<float*>(sc[e])));
      BENCH_CUDA(cudaFree(const_cast<uint16_t*>(w16[e])));
    }
    BENCH_CUDA(cudaFree(const_cast<uint8_t**>(dw8)));
    BENCH_CUDA(cudaFree(const_cast<uint8_t**>(dw4)));
    BENCH_CUDA(cudaFree(const_cast<uint8_t**>(dsc4)));
    BENCH_CUDA(cudaFree(const_cast<float**>(dsc)));
    BENCH_CUDA(cudaFree(const_cast<uint16_t**>(dw16)));
  }
}

}  // namespace

void RunTileVariants(const std::vector<GemmShape>& dense, const std::vector<MoeShape>& moe) {
  cublasHandle_t blas = nullptr;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasCreate failed\n");
    std::exit(1);
  }
  std::printf(
      "FP8 tile variants, dense (bf16 activations): us GB/s per variant, then bf16's best\n");
  std::printf("%-15s %6s %6s %4s |", "shape", "n", "k", "m");
  for (const Tile& t : kDenseTiles) std::printf(" %8s %5s", t.name, "GB/s");
  std::printf(" | %8s %5s | best fp8 vs bf16\n", "bf16", "GB/s");
  for (const GemmShape& s : dense) DenseVariants(s, blas);
  std::printf(
      "\nFP8 and MXFP4 tile variants, grouped experts: us GB/s (busy experts' weights; each FP8 "
      "line, then the same routing on MXFP4 experts)\n");
  std::printf("%-70s|", "");
  for (const Tile& t : kGroupedTiles) std::printf(" %8s %5s", t.name, "GB/s");
  std::printf(" | %8s %5s | best fp8 vs bf16\n", "bf16", "GB/s");
  for (const MoeShape& m : moe) GroupedVariants(m);
  cublasDestroy(blas);
}

}  // namespace deepinfer
