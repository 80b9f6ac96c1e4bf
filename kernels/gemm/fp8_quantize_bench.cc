// fp8_quantize_bench: kernels::Fp8QuantizeRows' modes at prefill sizes, Moonlight (hidden 2048,
// moe intermediate 1408, 64 experts top-6, 32768 tokens) and DeepSeek-V3 (hidden 7168, moe
// intermediate 2048, 256 experts top-8, 8192 tokens):
//  * permute: fp32 token rows [tokens, hidden] quantised into their top-k experts' rows (random
//    routing, k distinct experts a token, each expert's rows in token order, no padding);
//  * silu_mul: bf16 [gate | up] rows of every routed row [tokens * k, 2 * inter] quantised as
//    bf16(silu(g) * u), scales packed per expert;
//  * plain: the dense GEMMs' operand, [tokens, hidden] fp32 and bf16 rows, plain scale layout;
//  * silu-dense, silu-shared: bf16 [gate | up] rows of every token for the dense layers' MLP
//    (Moonlight's intermediate 11264, V3's 18432) and the shared experts together (2816, 2048),
//    quantised as silu_mul, plain scale layout (SwiGluMlpBf16's pass).
// And decode at Moonlight's shape, 128 tokens (`decode` lines): the swap-GEMM MoE path's two
// quantisations of a layer (CudaBackend::RunFp8SwapGroups), 64 routed groups and 2 shared parts
// of 128 rows each (1024 grouped rows):
//  * permute: the fp32 token rows rounded to bf16, each written to its 8 rows (round_bf16,
//    dest_rows; QuantizeScatterKernel<1>);
//  * silu_mul-f32: bf16(silu(g) * u) of the fp32 [gate | up] rows, 2 x 1408 wide
//    (QuantizeKernel<4>; CudaTuning::fp8_swap_gate_up_bf16 false);
//  * silu_mul-bf16: the same of bf16 [gate | up] rows (the swap GEMM's c_bf16; the default).
//   kGraphCalls calls recorded in one CUDA graph; time per call = median graph time /
//   kGraphCalls. The inputs stay in the L2 between calls, as in a decode step, where the kernel
//   before the quantisation has just written them.
// Time (prefill): median of 20 launches on the default stream (CUDA events around each,
// bench_util.h's MedianMs). GB/s = (bytes read + bytes written, scales and destination indices
// included) / time; the H200's HBM peak is 4.8 TB/s. One line per case; exit status 1 on a CUDA
// error.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/gemm/fp8_quantize.h"
#include "kernels/testing/bench_util.h"

namespace deepinfer {
namespace {

using bench::DeviceAlloc;

struct Model {
  const char* name;
  int64_t tokens, hidden, inter;
  int32_t experts, top_k;
  int64_t dense_inter, shared_inter;  // the dense layers' MLP, the shared experts' together
};

// bf16 bits of n values in [-4, 4) (truncated from fp32).
std::vector<uint16_t> Bf16Bits(size_t n, uint64_t seed) {
  const std::vector<float> f = bench::Uniform(n, seed);
  std::vector<uint16_t> b(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    const float x = 4.0f * f[i];
    std::memcpy(&bits, &x, 4);
    b[i] = static_cast<uint16_t>(bits >> 16);
  }
  return b;
}

// Random routing: token t's choice j at dest[t * k + j], experts' rows contiguous in token order;
// offsets [experts + 1].
void Route(const Model& m, std::vector<int32_t>* dest, std::vector<int32_t>* offsets) {
  const int64_t choices = m.tokens * m.top_k;
  std::vector<int32_t> expert(choices), count(m.experts, 0);
  uint64_t x = 0x2545F4914F6CDD1Dull;
  for (int64_t t = 0; t < m.tokens; ++t) {
    for (int32_t j = 0; j < m.top_k; ++j) {
      int32_t e;
      bool taken;
      do {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        e = static_cast<int32_t>(x % static_cast<uint64_t>(m.experts));
        taken = std::find(&expert[t * m.top_k], &expert[t * m.top_k] + j, e) !=
                &expert[t * m.top_k] + j;
      } while (taken);
      expert[t * m.top_k + j] = e;
      ++count[e];
    }
  }
  offsets->assign(m.experts + 1, 0);
  for (int32_t e = 0; e < m.experts; ++e) (*offsets)[e + 1] = (*offsets)[e] + count[e];
  std::vector<int32_t> next(offsets->begin(), offsets->end() - 1);
  dest->resize(choices);
  for (int64_t c = 0; c < choices; ++c) (*dest)[c] = next[expert[c]]++;
}

void Report(const char* model, const char* mode, int64_t rows, int64_t k, double bytes, double ms) {
  std::printf("%-9s %-10s rows %7lld k %5lld  %9.1f us  %7.1f GB/s\n", model, mode,
              static_cast<long long>(rows), static_cast<long long>(k), ms * 1e3,
              bytes / (ms * 1e-3) / 1e9);
}

void RunModel(const Model& m) {
  const int64_t T = m.tokens, H = m.hidden, I = m.inter, K = m.top_k, rows = T * K;
  const int64_t h_blocks = (H + 127) / 128, i_blocks = (I + 127) / 128;
  std::vector<int32_t> dest, offsets;
  Route(m, &dest, &offsets);
  const int32_t* d_dest = bench::Upload(dest);
  const int32_t* d_offsets = bench::Upload(offsets);
  float* a32 = bench::Upload(bench::Uniform(T * H, 1));
  uint16_t* a16 = bench::Upload(Bf16Bits(T * H, 2));
  uint16_t* gate_up = bench::Upload(Bf16Bits(rows * 2 * I, 3));
  uint8_t* q = DeviceAlloc<uint8_t>(rows * std::max(H, I));
  float* scales = DeviceAlloc<float>(rows * std::max(h_blocks, i_blocks) * sizeof(float));

  kernels::Fp8QuantizeParams p;
  p.q = q;
  p.scales = scales;
  p.group_offsets = d_offsets;
  p.num_groups = m.experts;
  p.m = T, p.k = H, p.a = a32, p.lda = H, p.ldq = H, p.m_pad = T;
  p.dest_rows = d_dest, p.dests_per_row = m.top_k;
  double ms = bench::MedianMs([&] { return kernels::Fp8QuantizeRows(p, nullptr); });
  Report(m.name, "permute", T, H,
         T * H * 4.0 + rows * (H + h_blocks * 4.0) + rows * 4.0 + offsets.size() * 4.0, ms);

  p.m = rows, p.k = I, p.a = gate_up, p.a_bf16 = true, p.silu_mul = true;
  p.lda = 2 * I, p.ldq = I, p.m_pad = rows;
  p.dest_rows = nullptr, p.dests_per_row = 0;
  ms = bench::MedianMs([&] { return kernels::Fp8QuantizeRows(p, nullptr); });
  Report(m.name, "silu_mul", rows, I, rows * (2 * I * 2.0 + I + i_blocks * 4.0), ms);

  for (bool bf16 : {false, true}) {
    kernels::Fp8QuantizeParams d;
    d.m = T, d.k = H, d.a_bf16 = bf16;
    d.a = bf16 ? static_cast<const void*>(a16) : a32;
    d.lda = H, d.q = q, d.ldq = H, d.scales = scales, d.m_pad = T;
    ms = bench::MedianMs([&] { return kernels::Fp8QuantizeRows(d, nullptr); });
    Report(m.name, bf16 ? "plain-bf16" : "plain-fp32", T, H,
           T * H * (bf16 ? 2.0 : 4.0) + T * (H + h_blocks * 4.0), ms);
  }

  // The dense MLP's and the shared experts' SiLU-mul quantisation (SwiGluMlpBf16): bf16 [gate |
  // up] rows of every token, plain scale layout.
  const int64_t widest = std::max(m.dense_inter, m.shared_inter);
  uint16_t* dense_gu = bench::Upload(Bf16Bits(T * 2 * widest, 4));
  uint8_t* dense_q = DeviceAlloc<uint8_t>(T * widest);
  float* dense_scales = DeviceAlloc<float>(T * ((widest + 127) / 128) * sizeof(float));
  for (int64_t inter : {m.dense_inter, m.shared_inter}) {
    kernels::Fp8QuantizeParams d;
    d.m = T, d.k = inter, d.a = dense_gu, d.a_bf16 = true, d.silu_mul = true;
    d.lda = 2 * inter, d.q = dense_q, d.ldq = inter, d.scales = dense_scales, d.m_pad = T;
    ms = bench::MedianMs([&] { return kernels::Fp8QuantizeRows(d, nullptr); });
    Report(m.name, inter == m.dense_inter ? "silu-dense" : "silu-shared", T, inter,
           T * (2 * inter * 2.0 + inter + (inter + 127) / 128 * 4.0), ms);
  }
}

constexpr int kGraphCalls = 100;

// Microseconds per call of `launch` (on `stream`), kGraphCalls calls in one CUDA graph.
template <typename Fn>
double GraphMicrosPerCall(cudaStream_t stream, Fn&& launch) {
  cudaGraph_t graph;
  BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kGraphCalls; ++i) BENCH_CUDA(launch());
  BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const double ms = bench::MedianMs([&] { return cudaGraphLaunch(exec, nullptr); });
  BENCH_CUDA(cudaGraphExecDestroy(exec));
  BENCH_CUDA(cudaGraphDestroy(graph));
  return ms * 1e3 / kGraphCalls;
}

void RunDecode() {
  const Model m{"moonlight", 128, 2048, 1408, 64, 6, 11264, 2816};
  constexpr int32_t kShared = 2;
  const int64_t T = m.tokens, H = m.hidden, I = m.inter, K = m.top_k, D = K + kShared;
  const int64_t rows = T * D, h_blocks = (H + 127) / 128, i_blocks = (I + 127) / 128;
  std::vector<int32_t> routed, offsets;
  Route(m, &routed, &offsets);
  // Shared part s of token t at row T * K + s * T + t, after the routed groups.
  std::vector<int32_t> dest(T * D);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < D; ++j) {
      dest[t * D + j] = static_cast<int32_t>(j < K ? routed[t * K + j] : T * K + (j - K) * T + t);
    }
  }
  for (int32_t s = 1; s <= kShared; ++s) offsets.push_back(static_cast<int32_t>(T * K + s * T));
  const int32_t groups = m.experts + kShared;
  const int32_t* d_dest = bench::Upload(dest);
  const int32_t* d_offsets = bench::Upload(offsets);
  float* hidden = bench::Upload(bench::Uniform(T * H, 1));
  float* gate_up = bench::Upload(bench::Uniform(rows * 2 * I, 3));
  uint8_t* q = DeviceAlloc<uint8_t>(rows * std::max(H, I));
  float* scales = DeviceAlloc<float>(rows * std::max(h_blocks, i_blocks) * sizeof(float));
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  kernels::Fp8QuantizeParams p;
  p.q = q;
  p.scales = scales;
  p.group_offsets = d_offsets;
  p.num_groups = groups;
  p.m = T, p.k = H, p.a = hidden, p.round_bf16 = true, p.lda = H, p.ldq = H, p.m_pad = T;
  p.dest_rows = d_dest, p.dests_per_row = static_cast<int32_t>(D);
  double us = GraphMicrosPerCall(stream, [&] { return kernels::Fp8QuantizeRows(p, stream); });
  Report("decode", "permute", T, H,
         T * H * 4.0 + rows * (H + h_blocks * 4.0) + rows * 4.0 + offsets.size() * 4.0, us * 1e-3);

  p.m = rows, p.k = I, p.a = gate_up, p.round_bf16 = false, p.silu_mul = true;
  p.lda = 2 * I, p.ldq = I, p.m_pad = rows;
  p.dest_rows = nullptr, p.dests_per_row = 0;
  us = GraphMicrosPerCall(stream, [&] { return kernels::Fp8QuantizeRows(p, stream); });
  Report("decode", "silu_mul-f32", rows, I, rows * (2 * I * 4.0 + I + i_blocks * 4.0), us * 1e-3);

  // The fp32 rows' values as bf16 bits (any values do: the time does not depend on them).
  p.a = gate_up, p.a_bf16 = true;
  us = GraphMicrosPerCall(stream, [&] { return kernels::Fp8QuantizeRows(p, stream); });
  Report("decode", "silu_mul-bf16", rows, I, rows * (2 * I * 2.0 + I + i_blocks * 4.0), us * 1e-3);
  BENCH_CUDA(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace deepinfer

int main() {
  deepinfer::RunDecode();
  using deepinfer::Model;
  for (const Model& m : {Model{"moonlight", 32768, 2048, 1408, 64, 6, 11264, 2816},
                         Model{"v3", 8192, 7168, 2048, 256, 8, 18432, 2048}}) {
    deepinfer::RunModel(m);
  }
  return 0;
}
