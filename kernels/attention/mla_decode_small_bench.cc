// Times MlaDecodeSmall's two forms (CUDA-core and tensor-core, MlaDecodeSmallForm) against
// MlaAttentionF32 (the tensor-core kernel with split-K and its combine: the path it replaces) on
// the DeepSeek decode cache (latent 512 + rope 64, bf16, block 16). Default: 1 request at
// 256 ... 4096 positions with 16 heads (Moonlight; where CudaTuning::mla_decode_small_max_context
// comes from) and at 256 ... 4096 with 128 heads (V3): the CUDA-core form's automatic shape, the
// tensor-core form's automatic cluster and clusters 4, 8 and 16; `full`: also every CUDA-core
// cluster shape at 1, 2, 4 and 8 requests of 1024 and 4096 positions; `shapes`: every shape of
// both forms at 1 x 1024 only. Per case and kernel: the mean per call of 10 calls captured in one
// CUDA graph and replayed 5 times (as the decode step runs them; MlaAttentionF32 as the backend
// calls it, allocating its workspace in the stream, and with a caller's workspace), the eager
// median of 20, and the largest difference between each form's output and MlaAttentionF32's.
// `chain`: one token's attention core as the decode step runs it at 1024 positions (norm + rope +
// cache write, W_uk, MlaDecodeSmall, W_uv; PDL as in the model): the first two as two launches or
// one (NormRopeCacheAbsorbQueryF32), with each form, 10 chains per graph.
// `fp8`: 1 request at 256 ... 4096 positions with 16 and 128 heads over an FP8 cache (e4m3 latent,
// one scale a token, bf16 rope key; written by WriteLatentCacheF32): the CUDA-core form reading
// the FP8 entries itself beside the same form over the bf16 copy of those entries, and the two
// paths that copy first (GatherFp8LatentCacheBf16 of the token's entries, then MlaDecodeSmall or
// MlaAttentionF32's key-split kernel on the copy: the gather's cost is in their times), with
// MlaAttentionF32 over the FP8 entries; and the largest difference between the FP8 form's output
// and the bf16 form's over the copy (0: the same bits).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/attention/mla_attention.h"
#include "kernels/attention/mla_decode_small.h"
#include "kernels/attention/mla_fp8_gather.h"
#include "kernels/gemm/small_m_gemm.h"
#include "kernels/rope/rope.h"
#include "kernels/testing/bench_timer.h"
#include "kernels/testing/bench_util.h"
#include "worker/backend/fp8_latent_entry.h"

namespace deepinfer {
namespace {

using bench::MedianMs;
using bench::Uniform;
using bench::Upload;

constexpr int32_t kLatent = 512, kRope = 64, kBlockSize = 16, kHeads = 16;
constexpr kernels::MlaDecodeSmallForm kCudaCore = kernels::MlaDecodeSmallForm::kCudaCore;
constexpr kernels::MlaDecodeSmallForm kTensorCore = kernels::MlaDecodeSmallForm::kTensorCore;

uint16_t Bf16Bits(float f) {  // nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

using bench::GraphMeanMs;

void Run(int32_t seqs, int32_t context, int32_t heads, bool every_shape, cudaStream_t stream) {
  const int64_t entry = kLatent + kRope;
  const int32_t blocks_per_seq = (context + kBlockSize - 1) / kBlockSize;
  const int64_t num_blocks = static_cast<int64_t>(seqs) * blocks_per_seq;
  std::vector<int32_t> tables(num_blocks);  // interleaved, as a pool hands blocks out
  for (int32_t s = 0; s < seqs; ++s) {
    for (int32_t b = 0; b < blocks_per_seq; ++b) tables[s * blocks_per_seq + b] = b * seqs + s;
  }
  std::vector<int32_t> token_seq(seqs), context_len(seqs, context);
  for (int32_t s = 0; s < seqs; ++s) token_seq[s] = s;
  const std::vector<float> values = Uniform(num_blocks * kBlockSize * entry, 1);
  std::vector<uint16_t> cache16(values.size());
  for (size_t i = 0; i < values.size(); ++i) cache16[i] = Bf16Bits(values[i]);
  const int64_t qk = 128 + kRope;
  const size_t out_elems = static_cast<size_t>(seqs) * heads * kLatent;
  kernels::MlaAttentionParams p;
  p.num_tokens = seqs;
  p.num_heads = heads;
  p.q_latent = Upload(Uniform(out_elems, 2));
  p.q_rope = Upload(Uniform(static_cast<size_t>(seqs) * heads * qk, 3)) + 128;
  p.q_rope_token_stride = heads * qk;
  p.q_rope_head_stride = qk;
  p.cache = {Upload(cache16), kBlockSize, kLatent, kRope, kernels::LatentCacheType::kBFloat16};
  p.block_tables = Upload(tables);
  p.max_blocks_per_seq = blocks_per_seq;
  p.token_seq = Upload(token_seq);
  p.context_len = Upload(context_len);
  p.softmax_scale = 1.0f / std::sqrt(192.0f);
  float* out_old = bench::DeviceAlloc<float>(out_elems * sizeof(float));
  float* out_new = bench::DeviceAlloc<float>(out_elems * sizeof(float));

  const double bytes = static_cast<double>(seqs) * context * entry * 2;
  char name[64];
  std::snprintf(name, sizeof(name), "decode %d x ctx%d h%d", seqs, context, heads);
  auto report = [&](const char* kernel, double graph_ms, double eager_ms) {
    std::printf("%-24s %-34s graph %8.2f us  eager %8.2f us  %6.1f GB/s in graph\n", name, kernel,
                graph_ms * 1e3, eager_ms * 1e3, bytes / (graph_ms * 1e-3) / 1e9);
  };

  kernels::MlaAttentionParams old_p = p;
  old_p.out_latent = out_old;
  report("MlaAttentionF32 (own workspace)",
         GraphMeanMs([&](cudaStream_t s) { return kernels::MlaAttentionF32(old_p, s); }, stream),
         MedianMs([&] { return kernels::MlaAttentionF32(old_p, nullptr); }));
  kernels::MlaAttentionParams ws_p = old_p;
  BENCH_CUDA(kernels::MlaAttentionWorkspaceBytes(ws_p, &ws_p.workspace_bytes));
  ws_p.workspace = bench::DeviceAlloc<char>(ws_p.workspace_bytes);
  report("MlaAttentionF32 (caller workspace)",
         GraphMeanMs([&](cudaStream_t s) { return kernels::MlaAttentionF32(ws_p, s); }, stream),
         MedianMs([&] { return kernels::MlaAttentionF32(ws_p, nullptr); }));

  kernels::MlaAttentionParams new_p = p;
  new_p.out_latent = out_new;
  if (!kernels::MlaDecodeSmallSupported(new_p)) {
    std::printf("%-24s MlaDecodeSmall: not supported on this device\n", name);
    return;
  }
  // CUDA-core shapes, then tensor-core clusters (the automatic choice first in each).
  struct Arm {
    kernels::MlaDecodeSmallForm form;
    int cluster, heads_per_block;
  };
  std::vector<Arm> arms;
  for (int cluster : {0, 2, 4, 8, 16}) {
    for (int hpb : {0, 1, 2, 4}) {
      if (every_shape || (cluster == 0 && hpb == 0)) arms.push_back({kCudaCore, cluster, hpb});
    }
  }
  for (int cluster : {0, 1, 2, 4, 8, 16}) {
    if (every_shape || cluster == 0 || cluster >= 4) arms.push_back({kTensorCore, cluster, 0});
  }
  int skip_form = -1, skip_from = 0;  // a form's larger clusters after one does not schedule
  for (const Arm& arm : arms) {
    const int cluster = arm.cluster;
    if (static_cast<int>(arm.form) == skip_form && cluster >= skip_from) continue;
    const kernels::MlaDecodeSmallOptions o{cluster, arm.heads_per_block, arm.form};
    const bool tc = kernels::MlaDecodeSmallFormFor(new_p, o) == kTensorCore;
    const cudaError_t probe = kernels::MlaDecodeSmall(new_p, o, stream);
    BENCH_CUDA(cudaStreamSynchronize(stream));
    if (probe == cudaErrorNotSupported) {
      std::printf("%-24s MlaDecodeSmall %s cluster %d: not schedulable\n", name,
                  tc ? "tensor-core" : "CUDA-core", cluster);
      skip_form = static_cast<int>(arm.form);
      skip_from = cluster;
      continue;
    }
    BENCH_CUDA(probe);
    int shape_cluster = 0, shape_heads = 0;
    BENCH_CUDA(kernels::MlaDecodeSmallShape(new_p, o, &shape_cluster, &shape_heads));
    const std::string kernel = std::string(tc ? "MlaDecodeSmall tc" : "MlaDecodeSmall") +
                               " cluster " + std::to_string(shape_cluster) + " heads " +
                               std::to_string(shape_heads) +
                               (cluster == 0 && arm.heads_per_block == 0 ? " (auto)" : "");
    report(
        kernel.c_str(),
        GraphMeanMs([&](cudaStream_t s) { return kernels::MlaDecodeSmall(new_p, o, s); }, stream),
        MedianMs([&] { return kernels::MlaDecodeSmall(new_p, o, nullptr); }));
  }
  // Each form's automatic shape against MlaAttentionF32.
  BENCH_CUDA(kernels::MlaAttentionF32(old_p, nullptr));
  std::vector<float> a(out_elems), b(out_elems);
  BENCH_CUDA(cudaMemcpy(a.data(), out_old, out_elems * sizeof(float), cudaMemcpyDeviceToHost));
  for (const kernels::MlaDecodeSmallForm form : {kCudaCore, kTensorCore}) {
    const kernels::MlaDecodeSmallOptions o{0, 0, form};
    BENCH_CUDA(kernels::MlaDecodeSmall(new_p, o, nullptr));
    BENCH_CUDA(cudaMemcpy(b.data(), out_new, out_elems * sizeof(float), cudaMemcpyDeviceToHost));
    double worst = 0;
    for (size_t i = 0; i < out_elems; ++i) {
      const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
      if (!(d <= worst)) worst = d;  // NaN sticks
    }
    std::printf("%-24s max |MlaDecodeSmall %s - MlaAttentionF32| = %.3g\n", name,
                kernels::MlaDecodeSmallFormFor(new_p, o) == kTensorCore ? "tc" : "cuda-core",
                worst);
  }
  std::fflush(stdout);
}

// The attention core of one decode token at `context` positions, each arm a graph of 10 chains.
void RunChain(int32_t context, cudaStream_t stream) {
  const int64_t entry = kLatent + kRope, nope = 128, qk = nope + kRope, vd = 128;
  const int32_t blocks = (context + kBlockSize - 1) / kBlockSize;
  std::vector<int32_t> tables(blocks);
  for (int32_t b = 0; b < blocks; ++b) tables[b] = b;
  const std::vector<float> values = Uniform(static_cast<size_t>(blocks) * kBlockSize * entry, 1);
  std::vector<uint16_t> cache16(values.size());
  for (size_t i = 0; i < values.size(); ++i) cache16[i] = Bf16Bits(values[i]);
  auto bf16 = [](const std::vector<float>& v) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = Bf16Bits(v[i] * 0.05f);
    return b;
  };
  float* q = Upload(Uniform(kHeads * qk, 3));
  float* kv = Upload(Uniform(entry, 4));
  float* q_latent = bench::DeviceAlloc<float>(kHeads * kLatent * sizeof(float));
  float* o_latent = bench::DeviceAlloc<float>(kHeads * kLatent * sizeof(float));
  float* o = bench::DeviceAlloc<float>(kHeads * vd * sizeof(float));
  const uint16_t* wuk = Upload(bf16(Uniform(kHeads * kLatent * nope, 5)));
  const uint16_t* wuv = Upload(bf16(Uniform(kHeads * vd * kLatent, 6)));
  std::vector<float> inv(kRope / 2);
  for (int j = 0; j < kRope / 2; ++j) inv[j] = std::pow(10000.0f, -2.0f * j / kRope);
  const std::vector<int32_t> pos = {context - 1}, slot = {context - 1};

  kernels::NormRopeCacheParams nr;
  nr.tokens = 1, nr.kv = kv, nr.ld_kv = entry, nr.norm_weight = Upload(Uniform(kLatent, 7));
  nr.latent_dim = kLatent, nr.rope_dim = kRope;
  nr.q = q + nope, nr.q_heads = kHeads, nr.q_token_stride = kHeads * qk, nr.q_head_stride = qk;
  nr.positions = Upload(pos), nr.inv_freq = Upload(inv), nr.interleaved = true;
  nr.slots = Upload(slot), nr.cache = Upload(cache16), nr.cache_bf16 = true;
  kernels::AbsorbQueryParams aq;
  aq.heads = kHeads, aq.nope_dim = nope, aq.latent_dim = kLatent, aq.q_nope = q;
  aq.q_token_stride = kHeads * qk, aq.q_head_stride = qk, aq.w = wuk, aq.out = q_latent;
  kernels::SmallMGemmParams uk;
  uk.m = 1, uk.n = kLatent, uk.k = nope, uk.a = q, uk.lda = kHeads * qk, uk.w = wuk;
  uk.ldw = nope, uk.c = q_latent, uk.ldc = kHeads * kLatent, uk.batch = kHeads;
  uk.stride_a = qk, uk.stride_w = kLatent * nope, uk.stride_c = kLatent;
  kernels::MlaAttentionParams p;
  p.num_tokens = 1, p.num_heads = kHeads, p.q_latent = q_latent, p.q_rope = q + nope;
  p.q_rope_token_stride = kHeads * qk, p.q_rope_head_stride = qk;
  p.cache = {nr.cache, kBlockSize, kLatent, kRope, kernels::LatentCacheType::kBFloat16};
  p.block_tables = Upload(tables), p.max_blocks_per_seq = blocks;
  p.token_seq = Upload(std::vector<int32_t>{0}),
  p.context_len = Upload(std::vector<int32_t>{context});
  p.softmax_scale = 1.0f / std::sqrt(192.0f), p.out_latent = o_latent;
  kernels::SmallMGemmParams uv;
  uv.m = 1, uv.n = vd, uv.k = kLatent, uv.a = o_latent, uv.lda = kHeads * kLatent, uv.w = wuv;
  uv.ldw = kLatent, uv.c = o, uv.ldc = kHeads * vd, uv.batch = kHeads, uv.stride_a = kLatent;
  uv.stride_w = vd * kLatent, uv.stride_c = vd;
  if (!kernels::MlaDecodeSmallSupported(p)) {
    std::printf("chain: MlaDecodeSmall not supported on this device\n");
    return;
  }
  // The arms alternate twice (A B A B): same-process drift shows as their spread.
  for (int round = 0; round < 2; ++round) {
    for (const bool fused : {false, true}) {
      for (const kernels::MlaDecodeSmallForm form : {kCudaCore, kTensorCore}) {
        const kernels::MlaDecodeSmallOptions mo{0, 0, form};
        const double ms = GraphMeanMs(
            [&](cudaStream_t s) {
              cudaError_t e = fused ? kernels::NormRopeCacheAbsorbQueryF32(nr, aq, s)
                                    : kernels::NormRopeWriteLatentCacheF32(nr, s);
              if (e == cudaSuccess && !fused) e = kernels::SmallMGemmBf16(uk, s);
              if (e == cudaSuccess) e = kernels::MlaDecodeSmall(p, mo, s);
              if (e == cudaSuccess) e = kernels::SmallMGemmBf16(uv, s);
              return e;
            },
            stream);
        std::printf("chain ctx%d  norm-rope-cache + W_uk %-12s attention %-9s %8.2f us\n", context,
                    fused ? "one launch" : "two launches", form == kTensorCore ? "tc" : "cuda-core",
                    ms * 1e3);
      }
    }
  }
  std::fflush(stdout);
}

// 1 request at `context` positions over an FP8 cache (the `fp8` mode in the top comment).
void RunFp8(int32_t context, int32_t heads, cudaStream_t stream) {
  const int64_t entry = kLatent + kRope, qk = 128 + kRope;
  const int32_t blocks = (context + kBlockSize - 1) / kBlockSize;
  std::vector<int32_t> tables(blocks), slots(context);
  for (int32_t b = 0; b < blocks; ++b) tables[b] = b;
  for (int32_t p = 0; p < context; ++p) slots[p] = p;
  const size_t out_elems = static_cast<size_t>(heads) * kLatent;
  kernels::PagedLatentCache fp8;
  constexpr Fp8LatentEntryLayout kLayout = Fp8LatentLayout(kLatent, kRope);
  fp8.cache = bench::DeviceAlloc<uint8_t>(static_cast<size_t>(blocks) * kBlockSize * kLayout.bytes);
  fp8.block_size = kBlockSize;
  fp8.latent_dim = kLatent;
  fp8.rope_dim = kRope;
  fp8.type = kernels::LatentCacheType::kFp8E4M3;
  fp8.fp8_rope_offset = static_cast<int32_t>(kLayout.rope_offset);
  fp8.fp8_scale_offset = static_cast<int32_t>(kLayout.scale_offset);
  fp8.fp8_entry_bytes = static_cast<int32_t>(kLayout.bytes);
  const float* values = Upload(Uniform(static_cast<size_t>(context) * entry, 1));
  BENCH_CUDA(kernels::WriteLatentCacheF32(context, values, entry, values + kLatent, entry,
                                          Upload(slots), fp8, stream));
  kernels::MlaAttentionParams p;
  p.num_tokens = 1;
  p.num_heads = heads;
  p.q_latent = Upload(Uniform(out_elems, 2));
  p.q_rope = Upload(Uniform(static_cast<size_t>(heads) * qk, 3)) + 128;
  p.q_rope_token_stride = heads * qk;
  p.q_rope_head_stride = qk;
  p.cache = fp8;
  p.block_tables = Upload(tables);
  p.max_blocks_per_seq = blocks;
  p.token_seq = Upload(std::vector<int32_t>{0});
  p.context_len = Upload(std::vector<int32_t>{context});
  p.softmax_scale = 1.0f / std::sqrt(192.0f);
  float* out_fp8 = bench::DeviceAlloc<float>(out_elems * sizeof(float));
  float* out_bf16 = bench::DeviceAlloc<float>(out_elems * sizeof(float));
  p.out_latent = out_fp8;

  // The token's entries as a bf16 paged cache (token rows), as the backend copies them.
  kernels::Fp8GatherParams g;
  g.src = fp8;
  g.block_tables = p.block_tables;
  g.max_blocks_per_seq = blocks;
  g.token_seq = p.token_seq;
  g.context_len = p.context_len;
  g.token_seq_out = bench::DeviceAlloc<int32_t>(sizeof(int32_t));
  g.num_rows = 1;
  g.dst = bench::DeviceAlloc<uint16_t>(kernels::Fp8GatherDstBytes(blocks, fp8));
  g.dst_blocks = blocks;
  g.dst_tables = bench::DeviceAlloc<int32_t>(blocks * sizeof(int32_t));
  g.table_width = blocks;
  BENCH_CUDA(kernels::GatherFp8LatentCacheBf16(g, stream));
  BENCH_CUDA(cudaStreamSynchronize(stream));
  kernels::MlaAttentionParams copy = p;
  copy.cache = {g.dst, kBlockSize, kLatent, kRope, kernels::LatentCacheType::kBFloat16};
  copy.block_tables = g.dst_tables;
  copy.token_seq = g.token_seq_out;
  copy.out_latent = out_bf16;

  char name[64];
  std::snprintf(name, sizeof(name), "fp8 1 x ctx%d h%d", context, heads);
  auto report = [&](const char* kernel, double graph_ms, double eager_ms) {
    std::printf("%-22s %-40s graph %8.2f us  eager %8.2f us\n", name, kernel, graph_ms * 1e3,
                eager_ms * 1e3);
  };
  if (!kernels::MlaDecodeSmallSupported(p) || !kernels::MlaDecodeSmallSupported(copy)) {
    std::printf("%-22s MlaDecodeSmall: not supported on this device\n", name);
    return;
  }
  const kernels::MlaDecodeSmallOptions o;  // the CUDA-core form, automatic shape (the backend's)
  int cluster = 0, hpb = 0, cluster16 = 0, hpb16 = 0;
  BENCH_CUDA(kernels::MlaDecodeSmallShape(p, o, &cluster, &hpb));
  BENCH_CUDA(kernels::MlaDecodeSmallShape(copy, o, &cluster16, &hpb16));
  const std::string fp8_name =
      "MlaDecodeSmall fp8 cluster " + std::to_string(cluster) + " heads " + std::to_string(hpb);
  const std::string bf16_name = "MlaDecodeSmall bf16 cluster " + std::to_string(cluster16) +
                                " heads " + std::to_string(hpb16);
  auto gather_then = [&](cudaStream_t s, bool small) {
    cudaError_t e = kernels::GatherFp8LatentCacheBf16(g, s);
    if (e == cudaSuccess)
      e = small ? kernels::MlaDecodeSmall(copy, o, s) : kernels::MlaAttentionF32(copy, s);
    return e;
  };
  kernels::MlaAttentionParams key_split = copy;
  BENCH_CUDA(kernels::MlaAttentionWorkspaceBytes(key_split, &key_split.workspace_bytes));
  key_split.workspace = bench::DeviceAlloc<char>(std::max<size_t>(key_split.workspace_bytes, 1));
  report(fp8_name.c_str(),
         GraphMeanMs([&](cudaStream_t s) { return kernels::MlaDecodeSmall(p, o, s); }, stream),
         MedianMs([&] { return kernels::MlaDecodeSmall(p, o, nullptr); }));
  report((bf16_name + " (on the copy)").c_str(),
         GraphMeanMs([&](cudaStream_t s) { return kernels::MlaDecodeSmall(copy, o, s); }, stream),
         MedianMs([&] { return kernels::MlaDecodeSmall(copy, o, nullptr); }));
  report("gather + MlaDecodeSmall bf16",
         GraphMeanMs([&](cudaStream_t s) { return gather_then(s, true); }, stream),
         MedianMs([&] { return gather_then(nullptr, true); }));
  report("gather + MlaAttentionF32 (key-split)",
         GraphMeanMs(
             [&](cudaStream_t s) {
               cudaError_t e = kernels::GatherFp8LatentCacheBf16(g, s);
               return e == cudaSuccess ? kernels::MlaAttentionF32(key_split, s) : e;
             },
             stream),
         MedianMs([&] {
           cudaError_t e = kernels::GatherFp8LatentCacheBf16(g, nullptr);
           return e == cudaSuccess ? kernels::MlaAttentionF32(key_split, nullptr) : e;
         }));
  report("MlaAttentionF32 on the fp8 entries",
         GraphMeanMs([&](cudaStream_t s) { return kernels::MlaAttentionF32(p, s); }, stream),
         MedianMs([&] { return kernels::MlaAttentionF32(p, nullptr); }));
  // The FP8 form against the bf16 form over the copy.
  BENCH_CUDA(kernels::MlaDecodeSmall(p, o, nullptr));
  BENCH_CUDA(kernels::MlaDecodeSmall(copy, o, nullptr));
  std::vector<float> a(out_elems), b(out_elems);
  BENCH_CUDA(cudaMemcpy(a.data(), out_fp8, out_elems * sizeof(float), cudaMemcpyDeviceToHost));
  BENCH_CUDA(cudaMemcpy(b.data(), out_bf16, out_elems * sizeof(float), cudaMemcpyDeviceToHost));
  double worst = 0;
  for (size_t i = 0; i < out_elems; ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (!(d <= worst)) worst = d;  // NaN sticks
  }
  std::printf("%-22s max |MlaDecodeSmall fp8 - bf16 on the copy| = %.3g\n", name, worst);
  std::fflush(stdout);
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) {
  const bool full = argc > 1 && std::strcmp(argv[1], "full") == 0;
  const bool chain = argc > 1 && std::strcmp(argv[1], "chain") == 0;
  const bool shapes = argc > 1 && std::strcmp(argv[1], "shapes") == 0;
  const bool fp8 = argc > 1 && std::strcmp(argv[1], "fp8") == 0;
  if (argc > 2 || (argc == 2 && !full && !chain && !shapes && !fp8)) {
    std::fprintf(stderr, "usage: mla_decode_small_bench [full | chain | shapes | fp8]\n");
    return 2;
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs; latent 512 + rope 64, bf16 cache, block 16\n", prop.name,
              prop.multiProcessorCount);
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (chain) {
    deepinfer::RunChain(1024, stream);
    return 0;
  }
  if (shapes) {
    deepinfer::Run(1, 1024, 16, /*every_shape=*/true, stream);
    return 0;
  }
  if (fp8) {
    for (int32_t heads : {16, 128}) {
      for (int32_t context : {256, 512, 1024, 1280, 1536, 2048, 3072, 4096}) {
        deepinfer::RunFp8(context, heads, stream);
      }
    }
    return 0;
  }
  for (int32_t context : {256, 512, 1024, 1536, 2048, 2560, 3072, 3584, 4096}) {
    deepinfer::Run(1, context, 16, /*every_shape=*/false, stream);
  }
  for (int32_t context : {256, 512, 1024, 2048, 4096}) {
    deepinfer::Run(1, context, 128, /*every_shape=*/false, stream);
  }
  if (full) {
    for (int32_t context : {1024, 4096}) {
      for (int32_t seqs : {1, 2, 4, 8})
        deepinfer::Run(seqs, context, 16, /*every_shape=*/true, stream);
    }
  }
  return 0;
}
