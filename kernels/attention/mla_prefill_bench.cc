// Times the prefill paths of MLA attention on the Moonlight and DeepSeek-V3 attention shapes
// (latent 512, rope 64, block size 16): MlaAttentionF32 (grouped heads on CUDA cores, split-K,
// fp32 cache) and MlaPrefillBf16: cuBLAS on the
// fp32 cache ("tc-bf16"), cuBLAS on the same values in a bf16 cache ("cublas-c16") and the fused
// flash kernel on that bf16 cache ("fused"). Prints per case the median of 20 timed runs (CUDA
// events, after 3 warm-ups), bandwidth on the distinct fp32 cache bytes, the FMA rate and the
// largest difference between the kernels' outputs. A sweep of one sequence's new tokens (with and
// without earlier context) gives the crossover between the two prefill paths (CudaBackend's rule).
// The decode shapes and the bf16 cache: mla_attention_bench.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/attention/mla_attention.h"
#include "kernels/attention/mla_prefill.h"
#include "kernels/testing/bench_util.h"
#include "worker/backend/bf16.h"

namespace deepinfer {
namespace {

using bench::MedianMs;
using bench::Uniform;
using bench::Upload;

constexpr int32_t kLatent = 512, kRope = 64, kBlockSize = 16;

struct Batch {
  const char* name;
  int32_t seqs, context, heads;
  int32_t new_tokens;  // the last new_tokens positions of each sequence query causally (1: decode)
};

cublasHandle_t Blas() {
  static cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasCreate failed\n");
      std::exit(1);
    }
    return h;
  }();
  return handle;
}

void Run(const Batch& batch) {
  const int64_t entry = kLatent + kRope;
  const int32_t blocks_per_seq = (batch.context + kBlockSize - 1) / kBlockSize;
  const int64_t num_blocks = static_cast<int64_t>(batch.seqs) * blocks_per_seq;
  // Sequence s owns blocks s, s + seqs, s + 2 seqs, ...: interleaved, as a pool hands them out.
  std::vector<int32_t> tables(num_blocks);
  for (int32_t s = 0; s < batch.seqs; ++s) {
    for (int32_t b = 0; b < blocks_per_seq; ++b)
      tables[s * blocks_per_seq + b] = b * batch.seqs + s;
  }
  std::vector<int32_t> token_seq, context_len;
  int64_t key_reads = 0;
  for (int32_t s = 0; s < batch.seqs; ++s) {
    for (int32_t p = batch.context - batch.new_tokens; p < batch.context; ++p) {
      token_seq.push_back(s);
      context_len.push_back(p + 1);
      key_reads += p + 1;
    }
  }
  const int32_t tokens = static_cast<int32_t>(token_seq.size());
  const std::vector<float> cache_values = Uniform(num_blocks * kBlockSize * entry, 1);
  float* cache = Upload(cache_values);
  std::vector<uint16_t> cache_bits(cache_values.size());
  for (size_t i = 0; i < cache_bits.size(); ++i) cache_bits[i] = FloatToBf16Bits(cache_values[i]);
  uint16_t* cache_bf16 = Upload(cache_bits);
  float* q_latent = Upload(Uniform(static_cast<size_t>(tokens) * batch.heads * kLatent, 2));
  const int64_t qk = 128 + kRope;  // q rows [nope 128 | rope 64] per head, as from q_b
  float* q = Upload(Uniform(static_cast<size_t>(tokens) * batch.heads * qk, 3));
  int32_t* d_tables = Upload(tables);
  int32_t* d_seq = Upload(token_seq);
  int32_t* d_len = Upload(context_len);
  const size_t out_elems = static_cast<size_t>(tokens) * batch.heads * kLatent;
  float *out_new = nullptr, *out_old = nullptr;
  BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&out_new), out_elems * sizeof(float)));
  BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&out_old), out_elems * sizeof(float)));

  kernels::MlaAttentionParams p;
  p.num_tokens = tokens;
  p.num_heads = batch.heads;
  p.q_latent = q_latent;
  p.q_rope = q + 128;
  p.q_rope_token_stride = batch.heads * qk;
  p.q_rope_head_stride = qk;
  p.cache = {cache, kBlockSize, kLatent, kRope};
  p.block_tables = d_tables;
  p.max_blocks_per_seq = blocks_per_seq;
  p.token_seq = d_seq;
  p.context_len = d_len;
  p.softmax_scale = 1.0f / std::sqrt(192.0f);

  const double cache_bytes = static_cast<double>(batch.seqs) * batch.context * entry * 4;
  const double fma = static_cast<double>(key_reads) * batch.heads * (entry + kLatent);
  auto report = [&](const char* kernel, int splits, double ms) {
    std::printf("%-28s %-9s splits %-4d %9.3f ms %8.1f GB/s %7.2f TFMA/s\n", batch.name, kernel,
                splits, ms, cache_bytes / (ms * 1e-3) / 1e9, fma / (ms * 1e-3) / 1e12);
  };
  const bool prefill = batch.new_tokens > 1;
  p.out_latent = out_new;
  size_t ws_bytes = 0;
  BENCH_CUDA(kernels::MlaAttentionWorkspaceBytes(p, &ws_bytes));
  // Caller-provided workspace, as the backend would hold one; the auto split count is inferred
  // back from its size (bytes = tokens * heads * splits * (latent + 2) * 4).
  const int auto_splits =
      ws_bytes == 0 ? 1
                    : static_cast<int>(ws_bytes / (static_cast<size_t>(tokens) * batch.heads *
                                                   (kLatent + 2) * sizeof(float)));
  void* ws = nullptr;
  const size_t ws_max = static_cast<size_t>(tokens) * batch.heads * kernels::kMaxMlaSplits *
                        (kLatent + 2) * sizeof(float);
  const bool sweep = !prefill && ws_max < (size_t{4} << 30);
  BENCH_CUDA(cudaMalloc(&ws, std::max<size_t>(sweep ? ws_max : ws_bytes, 1)));
  p.workspace = ws;
  p.workspace_bytes = sweep ? ws_max : ws_bytes;
  const double new_ms = MedianMs([&] { return kernels::MlaAttentionF32(p, nullptr); });
  report("grouped", auto_splits, new_ms);

  auto max_diff = [&](const float* x, const float* y) {
    std::vector<float> a(out_elems), b(out_elems);
    BENCH_CUDA(cudaMemcpy(a.data(), x, out_elems * sizeof(float), cudaMemcpyDeviceToHost));
    BENCH_CUDA(cudaMemcpy(b.data(), y, out_elems * sizeof(float), cudaMemcpyDeviceToHost));
    double worst = 0;
    for (size_t i = 0; i < out_elems; ++i) {
      const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
      if (!(d <= worst)) worst = d;  // NaN sticks
    }
    return worst;
  };
  if (prefill) {
    std::vector<kernels::MlaPrefillSequence> seqs;
    for (int32_t s = 0; s < batch.seqs; ++s) {
      seqs.push_back({s, s * batch.new_tokens, batch.new_tokens, batch.context});
    }
    kernels::MlaPrefillParams f;
    f.num_heads = batch.heads;
    f.q_latent = q_latent;
    f.q_rope = q + 128;
    f.q_rope_token_stride = batch.heads * qk;
    f.q_rope_head_stride = qk;
    f.cache = cache;
    f.block_size = kBlockSize;
    f.latent_dim = kLatent;
    f.rope_dim = kRope;
    f.block_tables = d_tables;
    f.max_blocks_per_seq = blocks_per_seq;
    f.sequences = seqs.data();
    f.num_sequences = batch.seqs;
    f.softmax_scale = p.softmax_scale;
    f.out_latent = out_old;
    f.kernel = kernels::MlaPrefillKernel::kCublas;
    // cuBLAS on the fp32 cache (the earlier numbers), then both paths on the same values in a
    // bf16 cache (the model's cache with bf16 weights).
    f.workspace_bytes = kernels::MlaPrefillWorkspaceBytes(f);
    BENCH_CUDA(cudaMalloc(&f.workspace, std::max<size_t>(f.workspace_bytes, 1)));
    const double tc_ms = MedianMs([&] { return kernels::MlaPrefillBf16(f, Blas(), nullptr); });
    report("tc-bf16", 0, tc_ms);
    std::printf("%-28s tc-bf16 vs grouped fp32: %.2fx, max |diff| = %.3g, workspace %.1f MiB\n",
                batch.name, new_ms / tc_ms, max_diff(out_new, out_old),
                f.workspace_bytes / 1048576.0);
    f.cache = cache_bf16;
    f.cache_dtype = kernels::MlaCacheDType::kBFloat16;
    const double cublas_ms = MedianMs([&] { return kernels::MlaPrefillBf16(f, Blas(), nullptr); });
    report("cublas-c16", 0, cublas_ms);
    f.kernel = kernels::MlaPrefillKernel::kFused;
    f.out_latent = out_new;
    if (!kernels::MlaPrefillFusedSupported(f)) {
      std::printf("%-28s fused kernel not supported here\n", batch.name);
    } else {
      const double fused_ms = MedianMs([&] { return kernels::MlaPrefillBf16(f, Blas(), nullptr); });
      report("fused", 0, fused_ms);
      std::printf("%-28s fused vs cublas (bf16 cache): %.2fx, %.1f TFLOP/s, max |diff| = %.3g\n",
                  batch.name, cublas_ms / fused_ms, 2 * fma / (fused_ms * 1e-3) / 1e12,
                  max_diff(out_new, out_old));
    }
    f.kernel = kernels::MlaPrefillKernel::kAuto;
    std::printf("%-28s kAuto runs %s\n", batch.name,
                kernels::MlaPrefillUsesFused(f) ? "the fused kernel" : "cuBLAS");
    BENCH_CUDA(cudaFree(f.workspace));
  }
  if (sweep) {
    for (int splits : {1, 2, 4, 8, 16, 32, 64}) {
      p.num_splits = splits;
      report("grouped", splits, MedianMs([&] { return kernels::MlaAttentionF32(p, nullptr); }));
    }
  }
  std::fflush(stdout);
  for (void* ptr : {static_cast<void*>(cache), static_cast<void*>(q_latent), static_cast<void*>(q),
                    static_cast<void*>(d_tables), static_cast<void*>(d_seq),
                    static_cast<void*>(d_len), static_cast<void*>(out_new),
                    static_cast<void*>(out_old), ws, static_cast<void*>(cache_bf16)}) {
    BENCH_CUDA(cudaFree(ptr));
  }
}

}  // namespace
}  // namespace deepinfer

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs; latent %d rope %d block %d fp32\n", prop.name,
              prop.multiProcessorCount, deepinfer::kLatent, deepinfer::kRope,
              deepinfer::kBlockSize);
  using deepinfer::Batch;
  for (const Batch& b : {
           Batch{"prefill 8 x 1024 h16", 8, 1024, 16, 1024},
           Batch{"prefill 1 x 1024 h128", 1, 1024, 128, 1024},
           Batch{"prefill 1 x 4096 h16", 1, 4096, 16, 4096},
           Batch{"prefill 32 x 1024 h16", 32, 1024, 16, 1024},
           Batch{"prefill 8 x 1024 h128", 8, 1024, 128, 1024},
       }) {
    deepinfer::Run(b);
  }
  // Crossover: one sequence, n new tokens, no earlier context or 2048 positions of it.
  static char names[64][48];
  int k = 0;
  for (int32_t past : {0, 2048}) {
    for (int32_t n : {16, 32, 64, 128, 256, 512}) {
      std::snprintf(names[k], sizeof(names[k]), "sweep past %d new %d h16", past, n);
      deepinfer::Run(Batch{names[k], 1, past + n, 16, n});
      ++k;
    }
  }
  return 0;
}
