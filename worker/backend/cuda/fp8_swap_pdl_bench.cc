// fp8_gemm_bench --swap-pdl: what programmatic dependent launch (Fp8WgmmaSwapGroupedGemmParams'
// `pdl`) saves kernels::Fp8WgmmaSwapGroupedGemm in a chain. The routed experts (uniform random
// top-k) plus the shared MLP's parts as more groups, as CudaBackend runs them from 3 tokens;
// gate_up ([2 inter, hidden]) and down ([hidden, inter]) per layer shape and token count. Each
// line: microseconds of
//   gemm        the GEMM alone (plain launches back to back)
//   copy        the predecessor alone: kernels::DelayedCopy (launch.cuh, PDL) writing the GEMM's
//               e4m3 rows and scales from a staging copy, a stand-in for a PDL quantise kernel
//   copy>gemm   the pair, GEMM with PDL ("pdl") and launched plainly ("plain"), and the
//               difference (what the overlap saves a pair)
//   quant>gemm  the same behind kernels::Fp8QuantizeRows (bf16 rows into the grouped layout), the
//               predecessor the backend runs (launched with PDL: it lets the GEMM launch once its
//               blocks passed their wait)
// Time: a CUDA graph of 10 pairs back to back, median of 7 replays, per pair. The GEMM executes
// griddepcontrol.launch_dependents in both modes, so the next pair's copy (a PDL kernel) may start
// during the GEMM's tail either way; the modes differ in the GEMM's own launch. The experts'
// weights are one allocation of (experts + parts) matrices, so each GEMM reads its busy experts'
// weights from HBM (more than L2 holds at these shapes).
#include "worker/backend/cuda/fp8_swap_pdl_bench.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "kernels/common/pdl_chain.h"
#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/gemm/fp8_quantize.h"
#include "kernels/gemm/fp8_wgmma_decode.h"
#include "kernels/testing/bench_timer.h"
#include "kernels/testing/bench_util.h"

namespace deepinfer {
namespace {

using bench::DeviceAlloc;

constexpr int kPairs = 10;
constexpr int kReplays = 7;

double PairMicros(const std::function<void(cudaStream_t)>& pair) {
  return bench::GraphMicrosPerLaunch(
      kPairs, [&](int, cudaStream_t s) { pair(s); }, kReplays);
}

size_t RoundUp(size_t x) { return (x + 255) / 256 * 256; }

void RunOne(const SwapPdlShape& shape, bool gate_up, const std::vector<int32_t>& token_counts,
            int copy_blocks) {
  const bench::MoeShape& ms = shape.moe;
  const int32_t E = ms.experts, K = ms.top_k, S = shape.shared_parts, G = E + S;
  const int64_t n = gate_up ? 2 * ms.inter : ms.hidden, k = gate_up ? ms.hidden : ms.inter;
  const int64_t split = gate_up ? ms.inter : 0, blocks = kernels::Fp8ScaleCols(k);
  const size_t bytes = static_cast<size_t>(n) * k;
  // Every weight byte e4m3 1.0, every weight block scale 1/448: the values do not change the time.
  uint8_t* weights = DeviceAlloc<uint8_t>(bytes * G);
  BENCH_CUDA(cudaMemset(weights, 0x38, bytes * G));
  const float* scales = bench::Upload(
      std::vector<float>(kernels::Fp8ScaleRows(n, split) * kernels::Fp8ScaleLd(k), 1.0f / 448));
  std::vector<const uint8_t*> host_w(G);
  for (int32_t g = 0; g < G; ++g) host_w[g] = weights + bytes * g;
  const float* const* scale_table = bench::Upload(std::vector<const float*>(G, scales));
  void* maps = DeviceAlloc<void>(kernels::Fp8WgmmaSwapWeightMapsBytes(G));
  BENCH_CUDA(kernels::Fp8WgmmaSwapBuildWeightMaps(G, host_w.data(), n, k, k, maps, nullptr));

  for (const int32_t T : token_counts) {
    bench::Routing routing = bench::RandomRouting(T, E, K);
    std::vector<int32_t> offsets = routing.offsets;
    for (int32_t s = 0; s < S; ++s) offsets.push_back(offsets.back() + T);
    const int32_t rows = offsets.back();
    // The GEMM's inputs (offsets, e4m3 rows, their scales) in one region the predecessor writes.
    const size_t off_at = 0, a_at = RoundUp(offsets.size() * sizeof(int32_t));
    const size_t sa_at = a_at + RoundUp(static_cast<size_t>(rows) * k);
    const size_t region = sa_at + RoundUp(static_cast<size_t>(rows) * blocks * sizeof(float));
    std::vector<uint8_t> host(region, 0x38);
    std::copy(reinterpret_cast<const uint8_t*>(offsets.data()),
              reinterpret_cast<const uint8_t*>(offsets.data() + offsets.size()),
              host.begin() + off_at);
    for (int64_t i = 0; i < int64_t{rows} * blocks; ++i) {
      const float one = 1.0f;
      std::copy(reinterpret_cast<const uint8_t*>(&one), reinterpret_cast<const uint8_t*>(&one + 1),
                host.begin() + sa_at + i * sizeof(float));
    }
    uint8_t* inputs = bench::Upload(host);
    uint8_t* staging = bench::Upload(host);
    uint16_t* rows_bf16 = DeviceAlloc<uint16_t>(static_cast<size_t>(rows) * k * 2);
    BENCH_CUDA(cudaMemset(rows_bf16, 0x3c, static_cast<size_t>(rows) * k * 2));
    float* c = DeviceAlloc<float>(static_cast<size_t>(rows) * n * sizeof(float));
    const int32_t* doff = reinterpret_cast<const int32_t*>(inputs + off_at);

    kernels::Fp8WgmmaSwapGroupedGemmParams p;
    p.num_groups = G, p.max_rows = rows, p.offsets = doff, p.n = n, p.k = k;
    p.a = inputs + a_at, p.lda = k, p.a_scales = reinterpret_cast<const float*>(inputs + sa_at);
    p.weight_maps = maps, p.scales = scale_table, p.scale_ld = kernels::Fp8ScaleLd(k);
    p.split_rows = split, p.c = c, p.ldc = n;
    // CudaBackend's hint: the routed experts' mean rows, at most the token count.
    p.rows_per_group_hint = std::min(T, std::max(1, (T * K + E - 1) / E));
    if (!kernels::Fp8WgmmaSwapGroupedGemmSupports(p)) {
      std::fprintf(stderr, "Fp8WgmmaSwapGroupedGemm does not take %s n=%ld k=%ld\n", ms.name,
                   static_cast<long>(n), static_cast<long>(k));
      std::exit(1);
    }
    kernels::Fp8WgmmaSwapGroupedGemmParams plain = p;
    plain.pdl = false;
    kernels::Fp8QuantizeParams qp;
    qp.m = rows, qp.k = k, qp.a = rows_bf16, qp.a_bf16 = true, qp.lda = k;
    qp.q = inputs + a_at, qp.ldq = k, qp.scales = reinterpret_cast<float*>(inputs + sa_at);
    qp.m_pad = rows, qp.group_offsets = doff, qp.num_groups = G;

    auto copy = [&](cudaStream_t s) {
      BENCH_CUDA(kernels::DelayedCopy(staging + a_at, inputs + a_at,
                                      static_cast<int64_t>(region - a_at), /*delay_ns=*/0,
                                      copy_blocks, s));
    };
    auto quant = [&](cudaStream_t s) { BENCH_CUDA(kernels::Fp8QuantizeRows(qp, s)); };
    auto gemm = [&](const kernels::Fp8WgmmaSwapGroupedGemmParams& q, cudaStream_t s) {
      BENCH_CUDA(kernels::Fp8WgmmaSwapGroupedGemm(q, s));
    };
    const double gemm_us = PairMicros([&](cudaStream_t s) { gemm(plain, s); });
    const double copy_us = PairMicros(copy);
    const double copy_pdl = PairMicros([&](cudaStream_t s) {
      copy(s);
      gemm(p, s);
    });
    const double copy_plain = PairMicros([&](cudaStream_t s) {
      copy(s);
      gemm(plain, s);
    });
    const double quant_us = PairMicros(quant);
    const double quant_pdl = PairMicros([&](cudaStream_t s) {
      quant(s);
      gemm(p, s);
    });
    const double quant_plain = PairMicros([&](cudaStream_t s) {
      quant(s);
      gemm(plain, s);
    });
    std::printf(
        "%-10s %-8s n=%5ld k=%5ld groups=%3d tokens=%3d rows=%4d busy=%3d N=%2d | gemm %7.2f | "
        "copy %6.2f | copy>gemm pdl %7.2f plain %7.2f saved %5.2f | quant %6.2f | quant>gemm "
        "pdl %7.2f plain %7.2f saved %5.2f  (us)\n",
        ms.name, gate_up ? "gate_up" : "down", static_cast<long>(n), static_cast<long>(k), G, T,
        rows, routing.busy + S, kernels::Fp8WgmmaSwapChunkRows(p.rows_per_group_hint), gemm_us,
        copy_us, copy_pdl, copy_plain, copy_plain - copy_pdl, quant_us, quant_pdl, quant_plain,
        quant_plain - quant_pdl);
    std::fflush(stdout);
    for (void* ptr : std::vector<void*>{inputs, staging, rows_bf16, c}) BENCH_CUDA(cudaFree(ptr));
  }
  BENCH_CUDA(cudaFree(weights));
  BENCH_CUDA(cudaFree(const_cast<float*>(scales)));
  BENCH_CUDA(cudaFree(const_cast<const float**>(scale_table)));
  BENCH_CUDA(cudaFree(maps));
}

}  // namespace

void RunSwapPdlBench(const std::vector<SwapPdlShape>& shapes, const std::vector<int32_t>& tokens) {
  if (!kernels::Fp8WgmmaSwapDeviceSupports()) {
    std::printf("fp8 wgmma-swap: not run (needs compute capability 9.0)\n");
    return;
  }
  int dev = 0, sms = 0;
  BENCH_CUDA(cudaGetDevice(&dev));
  BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  for (const SwapPdlShape& shape : shapes) {
    for (const bool gate_up : {true, false}) RunOne(shape, gate_up, tokens, 2 * sms);
  }
}

}  // namespace deepinfer
