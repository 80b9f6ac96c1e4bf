// fp8_block_gemm_bench: the FP8 block-scaled decode GEMMs against the bf16 ones at DeepSeek-V3's
// decode shapes (hidden 7168, q_lora 1536, kv_lora 512 + rope 64, 128 heads, dense intermediate
// 18432, one shared expert of 2048):
//  * Fp8SmallMGemm at m = 1, 2, 4, 8, 16 against SmallMGemmBf16 (m <= 4, where it takes them),
//    fp32 activations;
//  * Fp8GroupedGemm over 256 experts (top-8 of random routing) at 1, 8 and 64 tokens, gate_up
//    (4096 x 7168) and down (7168 x 2048).
// Each case is a CUDA graph of back-to-back launches, each on its own copy of the weights (copies
// enough for 256 MiB, so no launch finds its weights in L2), time per launch = graph time /
// launches (median of 10 replays). GB/s = weight bytes read (FP8: + scales) / time; the H200's
// HBM peak is 4.8 TB/s (4.3 measured by the roofline). One line per case; exit status 1 on a
// CUDA error.
//
// `--decode`: only the decode GEMVs at m = 1 and 2 (Moonlight's q_proj, kv_a and o_proj,
// DeepSeek-V3's q_a, q_b, o_proj, kv_a, the dense MLP's gate_up and down and the shared expert's
// gate_up and down): Fp8SmallMGemm in its default form, then each Fp8GemvForm
// ("forms pipelined1 / pipelined2") and the default form at each k split ("ksplit
// 1/2/4/8", microseconds), the staged GEMV's FP8 form (the copy prologue,
// one target) and SmallMGemmBf16 on the same shape. `--decode --no-pdl`: the same without
// programmatic dependent launch (the kernels that use it then run in full stream order).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/common/pdl.h"
#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/gemm/small_m_gemm.h"
#include "kernels/gemm/staged_gemv.h"
#include "kernels/testing/bench_timer.h"
#include "kernels/testing/bench_util.h"
#include "kernels/testing/gemm_bench_shapes.h"

namespace deepinfer {
namespace {

using bench::DeviceAlloc;
using bench::GemmShape;
using bench::RandomFp8;

// Median microseconds per launch of `launch(copy)` recorded `copies` times into one graph (10
// timed replays).
double GraphMicros(int copies, const std::function<cudaError_t(int, cudaStream_t)>& launch) {
  return bench::GraphMicrosPerLaunch(
      copies, [&](int c, cudaStream_t s) { BENCH_CUDA(launch(c, s)); }, 10);
}

constexpr size_t kRotateBytes = size_t{256} << 20;

int CopiesFor(size_t bytes) {
  return static_cast<int>(std::max<size_t>(2, std::min<size_t>(64, kRotateBytes / bytes + 1)));
}

// staged: also time StagedGemvBf16's FP8 form (where it takes the shape).
void DenseShapes(const std::vector<GemmShape>& shapes, const std::vector<int64_t>& ms,
                 bool staged) {
  for (const GemmShape& s : shapes) {
    const size_t fp8_bytes = static_cast<size_t>(s.n) * s.k;
    const size_t scale_count = kernels::Fp8ScaleRows(s.n, 0) * kernels::Fp8ScaleCols(s.k);
    const int copies = CopiesFor(fp8_bytes);
    std::vector<uint8_t*> w8(copies);
    std::vector<float*> sc(copies);
    std::vector<uint16_t*> w16(copies);
    const std::vector<uint8_t> host8 = RandomFp8(fp8_bytes, s.n);
    const std::vector<float> scales(scale_count, 1.0f / 448);
    for (int c = 0; c < copies; ++c) {
      w8[c] = bench::Upload(host8);
      sc[c] = bench::Upload(scales);
      w16[c] = DeviceAlloc<uint16_t>(fp8_bytes * 2);
      BENCH_CUDA(cudaMemset(w16[c], 0x3c, fp8_bytes * 2));
    }
    float* a = bench::Upload(bench::Uniform(16 * s.k, 7));
    float* out = DeviceAlloc<float>(16 * s.n * sizeof(float));
    for (int64_t m : ms) {
      // Weight copy c's product of m rows (the kernel's defaults).
      auto small_m = [&](int c) {
        kernels::Fp8SmallMGemmParams p;
        p.m = m, p.n = s.n, p.k = s.k, p.a = a, p.lda = s.k;
        p.w.data = w8[c], p.w.ldw = s.k, p.w.scales = sc[c];
        p.w.scale_ld = kernels::Fp8ScaleCols(s.k);
        p.c = out, p.ldc = s.n;
        return p;
      };
      const double fp8_us = GraphMicros(copies, [&](int c, cudaStream_t st) {
        return kernels::Fp8SmallMGemm(small_m(c), st);
      });
      std::printf("%-15s n=%6ld k=%6ld m=%2ld  fp8 small-m %8.2f us %7.0f GB/s", s.name,
                  static_cast<long>(s.n), static_cast<long>(s.k), static_cast<long>(m), fp8_us,
                  (fp8_bytes + scale_count * 4) / fp8_us / 1e3);
      if (staged && m <= 2) {
        // Each 1-2 row form of the vector kernel (staged: the decode list).
        std::printf("   forms");
        for (const kernels::Fp8GemvForm form :
             {kernels::Fp8GemvForm::kPipelined1, kernels::Fp8GemvForm::kPipelined2}) {
          const double us = GraphMicros(copies, [&](int c, cudaStream_t st) {
            kernels::Fp8SmallMGemmParams p = small_m(c);
            p.gemv_form = form;
            return kernels::Fp8SmallMGemm(p, st);
          });
          std::printf(" %s%.2f us %.0f GB/s", form == kernels::Fp8GemvForm::kPipelined1 ? "" : "/ ",
                      us, (fp8_bytes + scale_count * 4) / us / 1e3);
        }
        // The default form at each k split (Fp8SmallMGemmParams::gemv_ksplit).
        std::printf("   ksplit 1/2/4/8");
        for (int ksplit = 1; ksplit <= 8; ksplit *= 2) {
          const double us = GraphMicros(copies, [&](int c, cudaStream_t st) {
            kernels::Fp8SmallMGemmParams p = small_m(c);
            p.gemv_ksplit = ksplit;
            return kernels::Fp8SmallMGemm(p, st);
          });
          std::printf(" %s%.2f", ksplit == 1 ? "" : "/ ", us);
        }
        std::printf(" us");
      }
      kernels::StagedGemvParams g;
      g.m = m, g.k = s.k, g.a = a, g.lda = s.k, g.fp8 = true, g.num_targets = 1;
      g.targets[0].n = s.n, g.targets[0].ldw = s.k, g.targets[0].w8 = w8[0];
      g.targets[0].scales = sc[0], g.targets[0].scale_ld = kernels::Fp8ScaleCols(s.k);
      g.targets[0].c = out, g.targets[0].ldc = s.n;
      if (staged && kernels::StagedGemvSupports(g)) {
        const double staged_us = GraphMicros(copies, [&](int c, cudaStream_t st) {
          kernels::StagedGemvParams q = g;
          q.targets[0].w8 = w8[c], q.targets[0].scales = sc[c];
          return kernels::StagedGemvBf16(q, st);
        });
        std::printf("   fp8 staged %8.2f us %7.0f GB/s", staged_us,
                    (fp8_bytes + scale_count * 4) / staged_us / 1e3);
      }
      kernels::SmallMGemmParams b;
      b.m = m, b.n = s.n, b.k = s.k, b.a = a, b.lda = s.k, b.w = w16[0], b.ldw = s.k;
      b.c = out, b.ldc = s.n;
      if (kernels::SmallMGemmSupports(b)) {
        const double bf16_us = GraphMicros(copies, [&](int c, cudaStream_t st) {
          kernels::SmallMGemmParams q = b;
          q.w = w16[c];
          return kernels::SmallMGemmBf16(q, st);
        });
        std::printf("   bf16 small-m %8.2f us %7.0f GB/s   fp8 speedup %.2fx", bf16_us,
                    fp8_bytes * 2 / bf16_us / 1e3, bf16_us / fp8_us);
      }
      std::printf("\n");
    }
    for (int c = 0; c < copies; ++c) {
      BENCH_CUDA(cudaFree(w8[c]));
      BENCH_CUDA(cudaFree(sc[c]));
      BENCH_CUDA(cudaFree(w16[c]));
    }
    BENCH_CUDA(cudaFree(a));
    BENCH_CUDA(cudaFree(out));
  }
}

void GroupedShapes() {
  const bench::MoeShape moe = bench::DeepSeekV3Moe();
  const int32_t E = moe.experts, K = moe.top_k;
  const GemmShape shapes[] = {{"v3 expert gu", 2 * moe.inter, moe.hidden},
                              {"v3 expert dn", moe.hidden, moe.inter}};
  for (const GemmShape& s : shapes) {
    const size_t bytes = static_cast<size_t>(s.n) * s.k;
    const size_t scale_count = kernels::Fp8ScaleRows(s.n, moe.inter) * kernels::Fp8ScaleCols(s.k);
    // One copy of the 256 experts is already several GiB (no L2 reuse across the graph).
    std::vector<const uint8_t*> w(E);
    std::vector<const float*> sc(E);
    const std::vector<uint8_t> host8 = RandomFp8(bytes, s.k);
    const std::vector<float> scales(scale_count, 1.0f / 448);
    for (int32_t e = 0; e < E; ++e) {
      w[e] = bench::Upload(host8);
      sc[e] = bench::Upload(scales);
    }
    const uint8_t* const* dw = bench::Upload(w);
    const float* const* ds = bench::Upload(sc);
    for (int32_t tokens : {1, 8, 64}) {
      const bench::Routing routing = bench::RandomRouting(tokens, E, K);
      const int32_t busy = routing.busy;
      const int32_t rows = tokens * K;
      int32_t* doff = bench::Upload(routing.offsets);
      float* a = bench::Upload(bench::Uniform(static_cast<size_t>(rows) * s.k, 3));
      float* c = DeviceAlloc<float>(static_cast<size_t>(rows) * s.n * sizeof(float));
      kernels::Fp8GroupedGemmParams p;
      p.num_groups = E;
      p.max_rows = rows;
      p.offsets = doff;
      p.n = s.n;
      p.k = s.k;
      p.a = a;
      p.weights = dw;
      p.scales = ds;
      p.scale_ld = kernels::Fp8ScaleCols(s.k);
      p.split_rows = s.n == 2 * moe.inter ? moe.inter : 0;
      p.c = c;
      // One replay touches busy experts' weights once; 4 launches a graph (L2 holds 50 MiB,
      // under one busy expert set at 8+ tokens, but a single token's 8 experts of 29 MB could
      // stay: the 1-token figure may be L2-assisted).
      const double us =
          GraphMicros(4, [&](int, cudaStream_t st) { return kernels::Fp8GroupedGemm(p, st); });
      const double touched = static_cast<double>(busy) * (bytes + scale_count * 4);
      std::printf(
          "%-15s n=%6ld k=%6ld tokens=%3d busy experts=%3d  fp8 grouped %8.2f us %7.0f "
          "GB/s\n",
          s.name, static_cast<long>(s.n), static_cast<long>(s.k), tokens, busy, us,
          touched / us / 1e3);
      BENCH_CUDA(cudaFree(doff));
      BENCH_CUDA(cudaFree(a));
      BENCH_CUDA(cudaFree(c));
    }
    for (int32_t e = 0; e < E; ++e) {
      BENCH_CUDA(cudaFree(const_cast<uint8_t*>(w[e])));
      BENCH_CUDA(cudaFree(const_cast<float*>(sc[e])));
    }
    BENCH_CUDA(cudaFree(const_cast<uint8_t**>(dw)));
    BENCH_CUDA(cudaFree(const_cast<float**>(ds)));
  }
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) {
  const bool decode_only = argc > 1 && std::strcmp(argv[1], "--decode") == 0;
  if (decode_only) {
    if (argc > 2 && std::strcmp(argv[2], "--no-pdl") == 0) {
      deepinfer::kernels::SetProgrammaticDependentLaunch(false);
    }
    const std::vector<deepinfer::bench::GemmShape> decode = {
        {"moon q_proj", 3072, 2048},  {"moon kv_a", 576, 2048},     {"moon o_proj", 2048, 2048},
        {"v3 q_a", 1536, 7168},       {"v3 q_b", 24576, 1536},      {"v3 o_proj", 7168, 16384},
        {"v3 kv_a", 576, 7168},       {"v3 dense gu", 36864, 7168}, {"v3 dense dn", 7168, 18432},
        {"v3 shared gu", 4096, 7168}, {"v3 shared dn", 7168, 2048}};
    deepinfer::DenseShapes(decode, {1, 2}, true);
    return 0;
  }
  deepinfer::DenseShapes(deepinfer::bench::DeepSeekV3Gemms(), {1, 2, 4, 8, 16}, false);
  deepinfer::GroupedShapes();
  return 0;
}
