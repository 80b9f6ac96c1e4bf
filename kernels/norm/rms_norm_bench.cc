// Times RmsNormF32 at DeepSeek-V4-Flash's row shapes: the hyper-connection mix's 16384-wide rows
// (hc_mult 4 x hidden 4096), the 4096-wide input norms, the 1024-wide q_a norm and the 512-wide
// per-head q norm (64 rows a token) and kv norm, at 8192 and 32768 prefill tokens and at 1, 64
// and 128 decode tokens. Per case: the eager median of 20 calls and the bytes a call must move
// (each row read once and written once, the weight once) per second, against the H200's
// 4.8 TB/s.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "kernels/norm/rms_norm.h"
#include "kernels/testing/bench_util.h"

namespace deepinfer {
namespace {

constexpr double kPeakGBs = 4800.0;  // H200 HBM3e

void Run(const char* what, int64_t tokens, int64_t rows_per_token, int64_t dim) {
  const int64_t rows = tokens * rows_per_token;
  float* x = bench::Upload(bench::Uniform(rows * dim, 1));
  float* w = bench::Upload(bench::Uniform(dim, 2));
  float* out = bench::DeviceAlloc<float>(rows * dim * sizeof(float));
  const double ms = bench::MedianMs(
      [&] { return kernels::RmsNormF32(rows, dim, x, dim, w, 1e-6f, out, dim, nullptr); });
  const double bytes = (2.0 * rows * dim + dim) * sizeof(float);
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  std::printf("rms_norm %-8s tokens %-6lld rows %-8lld dim %-6lld %9.2f us  %7.1f GB/s  %5.1f%%\n",
              what, static_cast<long long>(tokens), static_cast<long long>(rows),
              static_cast<long long>(dim), ms * 1e3, gbs, 100.0 * gbs / kPeakGBs);
  BENCH_CUDA(cudaFree(x));
  BENCH_CUDA(cudaFree(w));
  BENCH_CUDA(cudaFree(out));
}

}  // namespace
}  // namespace deepinfer

int main() {
  for (int64_t tokens : {1, 64, 128, 8192, 32768}) {
    deepinfer::Run("hc_mix", tokens, 1, 16384);
    deepinfer::Run("input", tokens, 1, 4096);
    deepinfer::Run("q_a", tokens, 1, 1024);
    deepinfer::Run("q_head", tokens, 64, 512);
    deepinfer::Run("kv", tokens, 1, 512);
  }
  return 0;
}
