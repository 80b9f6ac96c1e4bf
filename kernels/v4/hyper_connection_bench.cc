// Times the hyper-connection kernels at DeepSeek-V4-Flash's site shape (4 streams of 4096,
// 20 Sinkhorn iterations) at 1, 64 and 128 decode tokens and 2048, 8192 and 32768 prefill tokens
// (the mix's partials kernel by row count, hc_mix_partials.cuh: HcMixChainsBody at 1,
// HcMixPairsBody at 64 and 128, a GEMM from 2048): HcMixFromStreamsF32 writing the collapsed rows
// (the attention site; from 2048 tokens once per GEMM, "mix_from_streams" the default
// HcMixGemm::kAuto, "mix/fp32" HcMixGemm::kFp32, the register-tiled fp32 GEMM), the same writing
// their RmsNorm instead (the ffn site), and HcExpandF32. Per case: the eager median of 20 calls,
// the bytes a call must move (streams and block output read once, outputs written once, fn once)
// per second against the H200's 4.8 TB/s, and for the mix the dot products' fp32 GFLOP/s.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "kernels/testing/bench_util.h"
#include "kernels/v4/hyper_connection.h"

namespace deepinfer {
namespace {

constexpr double kPeakGBs = 4800.0;  // H200 HBM3e
constexpr int64_t kHc = 4, kHidden = 4096, kMix = (2 + kHc) * kHc;

void Report(const char* what, int64_t tokens, double ms, double bytes, double flops) {
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  std::printf("hc %-16s tokens %-6lld %10.2f us  %7.1f GB/s  %5.1f%%  %8.1f GFLOP/s\n", what,
              static_cast<long long>(tokens), ms * 1e3, gbs, 100.0 * gbs / kPeakGBs,
              flops / (ms * 1e-3) / 1e9);
}

void Run(int64_t tokens) {
  const int64_t S = kHc * kHidden;
  float* streams = bench::Upload(bench::Uniform(tokens * S, 1));
  std::vector<float> fn_host = bench::Uniform(kMix * S, 2);
  for (float& f : fn_host) f *= 0.02f;
  float* fn = bench::Upload(fn_host);
  float* base = bench::Upload(bench::Uniform(kMix, 3));
  float* scale = bench::Upload(bench::Uniform(3, 4));
  float* weight = bench::Upload(bench::Uniform(kHidden, 5));
  float* block_out = bench::Upload(bench::Uniform(tokens * kHidden, 6));
  float* post = bench::DeviceAlloc<float>(tokens * kHc * sizeof(float));
  float* comb = bench::DeviceAlloc<float>(tokens * kHc * kHc * sizeof(float));
  float* collapsed = bench::DeviceAlloc<float>(tokens * kHidden * sizeof(float));
  float* normed = bench::DeviceAlloc<float>(tokens * kHidden * sizeof(float));
  float* streams_out = bench::DeviceAlloc<float>(tokens * S * sizeof(float));
  float* workspace = bench::DeviceAlloc<float>(
      kernels::HcMixFromStreamsWorkspaceFloats(tokens, kHc, kHidden) * sizeof(float));
  HcMixArgs a;
  a.rows = tokens, a.hc = kHc, a.hidden = kHidden;
  a.base = base, a.scale = scale, a.sinkhorn_iters = 20, a.eps = 1e-6f;
  a.streams = streams, a.post = post, a.comb = comb, a.collapsed = collapsed;
  a.fn = fn, a.norm_eps = 1e-6f;
  const double flops = 2.0 * tokens * kMix * S;
  const double mix_bytes =
      (tokens * S + kMix * S + tokens * (kHc + kHc * kHc + kHidden)) * sizeof(float);
  Report("mix_from_streams", tokens,
         bench::MedianMs([&] { return kernels::HcMixFromStreamsF32(a, workspace, nullptr); }),
         mix_bytes, flops);
  if (tokens >= 2048) {
    Report("mix/fp32", tokens, bench::MedianMs([&] {
             return kernels::HcMixFromStreamsF32(a, workspace, nullptr, kernels::HcMixGemm::kFp32);
           }),
           mix_bytes, flops);
  }
  HcMixArgs n = a;
  n.collapsed = nullptr;
  n.out_norm_weight = weight, n.out_norm_eps = 1e-6f, n.normed = normed;
  Report("mix+norm", tokens,
         bench::MedianMs([&] { return kernels::HcMixFromStreamsF32(n, workspace, nullptr); }),
         mix_bytes + kHidden * sizeof(float), flops);
  HcExpandArgs e;
  e.rows = tokens, e.hc = kHc, e.hidden = kHidden;
  e.block_out = block_out, e.post = post, e.comb = comb, e.streams_in = streams;
  e.streams_out = streams_out;
  Report("expand", tokens, bench::MedianMs([&] { return kernels::HcExpandF32(e, nullptr); }),
         (2.0 * tokens * S + tokens * (kHidden + kHc + kHc * kHc)) * sizeof(float), 0.0);
  for (float* p : {streams, fn, base, scale, weight, block_out, post, comb, collapsed, normed,
                   streams_out, workspace}) {
    BENCH_CUDA(cudaFree(p));
  }
}

}  // namespace
}  // namespace deepinfer

int main() {
  for (int64_t tokens : {1, 64, 128, 2048, 8192, 32768}) deepinfer::Run(tokens);
  return 0;
}
