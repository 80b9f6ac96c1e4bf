// Times MlaAttentionF32 with an fp32 cache (grouped heads on CUDA cores, split-K) and with a
// bf16 cache (tensor cores) on the Moonlight and DeepSeek-V3 attention shapes (latent 512, rope 64,
// block size 16): decode batches of 1 to 256 requests over 1024- to 8192-position contexts and a
// causal 8 x 1024-token prefill. Both caches hold the same (bf16-representable) values. Prints per
// case the median of 20 timed runs (CUDA events, after 3 warm-ups), the achieved bandwidth on the
// distinct cache bytes the batch reads at the cache's element size (and its share of 4.3 TB/s), the
// FMA rate, and the largest differences between the kernels' outputs. Decode cases also sweep
// forced split counts. DeepSeek-V3's 128 heads (1, 64 and 128 requests x 1024) compare the 64-head
// wgmma kernel (mma v10, "wg graph" in a CUDA graph) with the key-split kernel (mma v9); TFLOP/s
// = 2 x the TFMA/s column. The "fp8 cache" cases (8, 64, 128 requests x 1024, 16 heads, and 128
// x 1024 at 128 heads) time, each in a CUDA graph: the bf16 cache's default kernel, the same
// calls over an FP8 cache (that kernel reading the FP8 entries: key-split, or wgmma at 128
// heads), and the pair an FP8 call ran before it read them (GatherFp8LatentCacheBf16 of the
// tokens' rows, then the default kernel over the copy); and check that the direct call's output
// is bit for bit the copy pair's. `mla_attention_bench h16` runs only the 16-head comparison
// of the key-split kernel (mma v9) with its ring form (mma v11): RunH16 below.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/attention/mla_attention.h"
#include "kernels/attention/mla_fp8_gather.h"
#include "kernels/testing/bench_timer.h"
#include "kernels/testing/bench_util.h"
#include "worker/backend/fp8_latent_entry.h"

namespace deepinfer {
namespace {

using bench::MedianMs;
using bench::Uniform;
using bench::Upload;

constexpr int32_t kLatent = 512, kRope = 64, kBlockSize = 16;
// The tensor-core kernel's variants (kernels::MlaAttentionParams::mma_variant, 0 aside).
// 10 (the 64-head wgmma kernel) runs only where heads are a multiple of 64 (on sm_90a): elsewhere
// its rows are skipped (they would time the default's kernel again). 11: the key-split kernel's
// ring form (one block per SM).
constexpr int kMmaVariants[] = {4, 9, 10, 11};

// Whether params given mma_variant 10 would run another kernel than the wgmma one.
bool WgmmaSkipped(const kernels::MlaAttentionParams& p) {
  return p.mma_variant == 10 &&
         std::string(kernels::MlaAttentionKernelName(p)) != "wgmma_bf16_64_heads";
}

struct Batch {
  const char* name;
  int32_t seqs, context, heads;
  bool prefill;  // every position of each sequence queries causally; else one decode token each
};

uint16_t Bf16Bits(float f) {  // nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float Bf16Value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

constexpr double kPeakBytesPerS = 4.3e12;  // H200 HBM, as tools/bench (docs/DEVICE.md)

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
    for (int32_t p = batch.prefill ? 0 : batch.context - 1; p < batch.context; ++p) {
      token_seq.push_back(s);
      context_len.push_back(p + 1);
      key_reads += p + 1;
    }
  }
  const int32_t tokens = static_cast<int32_t>(token_seq.size());
  // The same values in both caches (bf16-representable), so every kernel computes one result.
  std::vector<float> host_cache = Uniform(num_blocks * kBlockSize * entry, 1);
  std::vector<uint16_t> host_cache16(host_cache.size());
  for (size_t i = 0; i < host_cache.size(); ++i) {
    host_cache16[i] = Bf16Bits(host_cache[i]);
    host_cache[i] = Bf16Value(host_cache16[i]);
  }
  float* cache = Upload(host_cache);
  uint16_t* cache16 = Upload(host_cache16);
  float* q_latent = Upload(Uniform(static_cast<size_t>(tokens) * batch.heads * kLatent, 2));
  const int64_t qk = 128 + kRope;  // q rows [nope 128 | rope 64] per head, as from q_b
  float* q = Upload(Uniform(static_cast<size_t>(tokens) * batch.heads * qk, 3));
  int32_t* d_tables = Upload(tables);
  int32_t* d_seq = Upload(token_seq);
  int32_t* d_len = Upload(context_len);
  const size_t out_elems = static_cast<size_t>(tokens) * batch.heads * kLatent;
  float *out_new = nullptr, *out_bf16 = nullptr;
  BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&out_new), out_elems * sizeof(float)));
  BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&out_bf16), out_elems * sizeof(float)));

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

  const double fma = static_cast<double>(key_reads) * batch.heads * (entry + kLatent);
  auto report = [&](const char* kernel, int elem_bytes, int splits, double ms) {
    const double bytes = static_cast<double>(batch.seqs) * batch.context * entry * elem_bytes;
    const double bw = bytes / (ms * 1e-3);
    std::printf("%-26s %-13s splits %-3d %9.4f ms %7.1f GB/s (%4.1f%% of 4.3 TB/s) %6.2f TFMA/s\n",
                batch.name, kernel, splits, ms, bw / 1e9, 100.0 * bw / kPeakBytesPerS,
                fma / (ms * 1e-3) / 1e12);
  };
  void* ws = nullptr;
  const size_t ws_max = static_cast<size_t>(tokens) * batch.heads * kernels::kMaxMlaSplits *
                        (kLatent + 2) * sizeof(float);
  const bool sweep = !batch.prefill && ws_max < (size_t{4} << 30);
  size_t ws_f32 = 0, ws_bf16 = 0;
  BENCH_CUDA(kernels::MlaAttentionWorkspaceBytes(p, &ws_f32));
  kernels::MlaAttentionParams pb = p;
  pb.cache = {cache16, kBlockSize, kLatent, kRope, kernels::LatentCacheType::kBFloat16};
  pb.out_latent = out_bf16;
  BENCH_CUDA(kernels::MlaAttentionWorkspaceBytes(pb, &ws_bf16));
  BENCH_CUDA(cudaMalloc(&ws, std::max<size_t>(sweep ? ws_max : std::max(ws_f32, ws_bf16), 1)));
  // Caller-provided workspace, as the backend would hold one; the auto split count is inferred
  // back from its size (bytes = tokens * heads * splits * (latent + 2) * 4).
  auto splits_of = [&](size_t ws_bytes) {
    return ws_bytes == 0 ? 1
                         : static_cast<int>(ws_bytes / (static_cast<size_t>(tokens) * batch.heads *
                                                        (kLatent + 2) * sizeof(float)));
  };
  p.out_latent = out_new;
  p.workspace = pb.workspace = ws;
  p.workspace_bytes = pb.workspace_bytes = sweep ? ws_max : std::max(ws_f32, ws_bf16);
  const double new_ms = MedianMs([&] { return kernels::MlaAttentionF32(p, nullptr); });
  report("grouped f32", 4, splits_of(ws_f32), new_ms);
  const std::string bf16_name = std::string(kernels::MlaAttentionKernelName(pb));
  const double bf16_ms = MedianMs([&] { return kernels::MlaAttentionF32(pb, nullptr); });
  report(bf16_name.c_str(), 2, splits_of(ws_bf16), bf16_ms);
  // The tensor-core kernel's variants, each at its automatic split count.
  for (int variant : kMmaVariants) {
    kernels::MlaAttentionParams pv = pb;
    pv.mma_variant = variant;
    if (WgmmaSkipped(pv)) continue;
    size_t ws_v = 0;
    BENCH_CUDA(kernels::MlaAttentionWorkspaceBytes(pv, &ws_v));
    if (ws_v > pv.workspace_bytes) continue;
    const std::string name = "mma v" + std::to_string(variant);
    report(name.c_str(), 2, splits_of(ws_v),
           MedianMs([&] { return kernels::MlaAttentionF32(pv, nullptr); }));
  }

  // As the decode step runs it: kGraphCalls calls captured into one CUDA graph (no host launch
  // cost between them), the graph replayed kGraphReplays times; the mean per call. Each
  // tensor-core variant at its automatic split count.
  if (!batch.prefill) {
    constexpr int kGraphCalls = 10, kGraphReplays = 5;
    cudaStream_t stream;
    BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    // (variant, forced split count or 0): 4 (the chunked kernel) and 9 (the key-split kernel
    // with the cluster merge, the default) at their automatic split counts; 9 also at forced ones
    // (few tokens: fewer splits than the automatic 64).
    std::vector<std::pair<int, int>> runs;
    for (int variant : kMmaVariants) runs.emplace_back(variant, 0);
    for (int variant : {9, 10, 11}) {
      for (int splits :
           tokens < 16 ? std::vector<int>{4, 8, 16, 32} : std::vector<int>{1, 2, 3, 4}) {
        runs.emplace_back(variant, splits);
      }
    }
    for (const auto& [variant, splits] : runs) {
      kernels::MlaAttentionParams pv = pb;
      pv.mma_variant = variant;
      pv.num_splits = splits;
      if (WgmmaSkipped(pv)) continue;
      size_t ws_v = 0;
      BENCH_CUDA(kernels::MlaAttentionWorkspaceBytes(pv, &ws_v));
      if (ws_v > pv.workspace_bytes) continue;
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < kGraphCalls; ++i) BENCH_CUDA(kernels::MlaAttentionF32(pv, stream));
      BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
      BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      BENCH_CUDA(cudaGraphLaunch(exec, stream));  // warm-up
      cudaEvent_t e0, e1;
      BENCH_CUDA(cudaEventCreate(&e0));
      BENCH_CUDA(cudaEventCreate(&e1));
      BENCH_CUDA(cudaEventRecord(e0, stream));
      for (int r = 0; r < kGraphReplays; ++r) BENCH_CUDA(cudaGraphLaunch(exec, stream));
      BENCH_CUDA(cudaEventRecord(e1, stream));
      BENCH_CUDA(cudaEventSynchronize(e1));
      float total = 0;
      BENCH_CUDA(cudaEventElapsedTime(&total, e0, e1));
      // The cluster merge has no workspace: its split count is the one the same params take
      // with an output the merge does not write (not 16-byte aligned), through the workspace.
      const std::string kernel_name = kernels::MlaAttentionKernelName(pv);
      const bool cluster = kernel_name == "mma_bf16_key_split_cluster" ||
                           kernel_name == "mma_bf16_key_split_ring_cluster";
      int shown_splits = splits_of(ws_v);
      if (cluster) {
        kernels::MlaAttentionParams unmerged = pv;
        unmerged.out_latent = out_bf16 + 1;
        size_t ws_unmerged = 0;
        BENCH_CUDA(kernels::MlaAttentionWorkspaceBytes(unmerged, &ws_unmerged));
        shown_splits = splits_of(ws_unmerged);
      }
      const bool wgmma = std::string(kernels::MlaAttentionKernelName(pv)) == "wgmma_bf16_64_heads";
      const std::string name = "mma v" + std::to_string(variant) +
                               (cluster ? " cl graph"
                                : wgmma ? " wg graph"
                                        : " graph");
      report(name.c_str(), 2, shown_splits, total / (kGraphCalls * kGraphReplays));
      BENCH_CUDA(cudaEventDestroy(e0));
      BENCH_CUDA(cudaEventDestroy(e1));
      BENCH_CUDA(cudaGraphExecDestroy(exec));
      BENCH_CUDA(cudaGraphDestroy(graph));
    }
    BENCH_CUDA(cudaStreamDestroy(stream));
  }

  std::vector<float> a(out_elems), c(out_elems);
  BENCH_CUDA(cudaMemcpy(a.data(), out_new, out_elems * sizeof(float), cudaMemcpyDeviceToHost));
  BENCH_CUDA(cudaMemcpy(c.data(), out_bf16, out_elems * sizeof(float), cudaMemcpyDeviceToHost));
  double worst_bf16 = 0;
  for (size_t i = 0; i < out_elems; ++i) {
    const double e = std::fabs(static_cast<double>(a[i]) - c[i]);
    if (!(e <= worst_bf16)) worst_bf16 = e;  // NaN sticks
  }
  std::printf("%-26s %s (bf16 cache) vs grouped f32 (fp32 cache): %.2fx, max |diff| = %.3g\n",
              batch.name, bf16_name.c_str(), new_ms / bf16_ms, worst_bf16);
  if (sweep) {
    for (int splits : {1, 2, 4, 8, 16, 32, 64}) {
      p.num_splits = splits;
      report("grouped f32", 4, splits,
             MedianMs([&] { return kernels::MlaAttentionF32(p, nullptr); }));
      for (int variant : kMmaVariants) {
        kernels::MlaAttentionParams pv = pb;
        pv.num_splits = splits;
        pv.mma_variant = variant;
        if (WgmmaSkipped(pv)) continue;
        const std::string name = "mma v" + std::to_string(variant);
        report(name.c_str(), 2, splits,
               MedianMs([&] { return kernels::MlaAttentionF32(pv, nullptr); }));
      }
    }
  }
  std::fflush(stdout);
  for (void* ptr :
       {static_cast<void*>(cache), static_cast<void*>(cache16), static_cast<void*>(q_latent),
        static_cast<void*>(q), static_cast<void*>(d_tables), static_cast<void*>(d_seq),
        static_cast<void*>(d_len), static_cast<void*>(out_new), static_cast<void*>(out_bf16), ws}) {
    BENCH_CUDA(cudaFree(ptr));
  }
}

// Decode over an FP8 cache against the bf16 cache: one token per sequence seeing its whole
// context, the entries written from the same fp32 values by WriteLatentCacheF32 into both
// caches (the FP8 one quantised per token), the tables interleaved as in Run.
void RunFp8(const Batch& batch) {
  const int64_t entry = kLatent + kRope;
  const Fp8LatentEntryLayout layout = Fp8LatentLayout(kLatent, kRope);
  const int32_t blocks_per_seq = (batch.context + kBlockSize - 1) / kBlockSize;
  const int64_t num_blocks = static_cast<int64_t>(batch.seqs) * blocks_per_seq;
  const int64_t slots = num_blocks * kBlockSize;
  std::vector<int32_t> tables(num_blocks), slot(slots), token_seq, context_len;
  for (int32_t s = 0; s < batch.seqs; ++s) {
    for (int32_t b = 0; b < blocks_per_seq; ++b)
      tables[s * blocks_per_seq + b] = b * batch.seqs + s;
    token_seq.push_back(s);
    context_len.push_back(batch.context);
  }
  for (int64_t i = 0; i < slots; ++i) slot[i] = static_cast<int32_t>(i);
  const int32_t tokens = batch.seqs;
  float* kv = Upload(Uniform(static_cast<size_t>(slots) * entry, 1));
  int32_t* d_slot = Upload(slot);
  uint16_t* cache16 = bench::DeviceAlloc<uint16_t>(static_cast<size_t>(slots) * entry * 2);
  uint8_t* cache8 = bench::DeviceAlloc<uint8_t>(static_cast<size_t>(slots) * layout.bytes);
  const kernels::PagedLatentCache c16{cache16, kBlockSize, kLatent, kRope,
                                      kernels::LatentCacheType::kBFloat16};
  const kernels::PagedLatentCache c8{cache8,
                                     kBlockSize,
                                     kLatent,
                                     kRope,
                                     kernels::LatentCacheType::kFp8E4M3,
                                     static_cast<int32_t>(layout.rope_offset),
                                     static_cast<int32_t>(layout.scale_offset),
                                     static_cast<int32_t>(layout.bytes)};
  BENCH_CUDA(
      kernels::WriteLatentCacheF32(slots, kv, entry, kv + kLatent, entry, d_slot, c16, nullptr));
  BENCH_CUDA(
      kernels::WriteLatentCacheF32(slots, kv, entry, kv + kLatent, entry, d_slot, c8, nullptr));
  float* q_latent = Upload(Uniform(static_cast<size_t>(tokens) * batch.heads * kLatent, 2));
  float* q_rope = Upload(Uniform(static_cast<size_t>(tokens) * batch.heads * kRope, 3));
  int32_t* d_tables = Upload(tables);
  int32_t* d_seq = Upload(token_seq);
  int32_t* d_len = Upload(context_len);
  const size_t out_elems = static_cast<size_t>(tokens) * batch.heads * kLatent;
  float* out8 = bench::DeviceAlloc<float>(out_elems * sizeof(float));
  float* out_copy = bench::DeviceAlloc<float>(out_elems * sizeof(float));
  // The copy as the backend's decode step makes it (token rows: token t's row at blocks
  // t * width ...).
  uint16_t* copy = bench::DeviceAlloc<uint16_t>(kernels::Fp8GatherDstBytes(num_blocks, c8));
  int32_t* copy_tables = bench::DeviceAlloc<int32_t>(num_blocks * sizeof(int32_t));
  int32_t* copy_seq = bench::DeviceAlloc<int32_t>(tokens * sizeof(int32_t));

  kernels::MlaAttentionParams p;
  p.num_tokens = tokens;
  p.num_heads = batch.heads;
  p.q_latent = q_latent;
  p.q_rope = q_rope;
  p.q_rope_token_stride = int64_t{batch.heads} * kRope;
  p.q_rope_head_stride = kRope;
  p.block_tables = d_tables;
  p.max_blocks_per_seq = blocks_per_seq;
  p.token_seq = d_seq;
  p.context_len = d_len;
  p.softmax_scale = 1.0f / std::sqrt(192.0f);
  kernels::MlaAttentionParams p16 = p, p8 = p, pc = p;
  p16.cache = c16;
  p16.out_latent = out_copy;
  p8.cache = c8;
  p8.out_latent = out8;
  pc.cache = c16;
  pc.cache.cache = copy;
  pc.block_tables = copy_tables;
  pc.token_seq = copy_seq;
  pc.out_latent = out_copy;
  kernels::Fp8GatherParams g;
  g.src = c8;
  g.block_tables = d_tables;
  g.max_blocks_per_seq = blocks_per_seq;
  g.token_seq = d_seq;
  g.context_len = d_len;
  g.token_seq_out = copy_seq;
  g.num_rows = tokens;
  g.dst = copy;
  g.dst_blocks = num_blocks;
  g.dst_tables = copy_tables;
  g.table_width = blocks_per_seq;
  size_t ws_bytes = 0, ws8 = 0;
  BENCH_CUDA(kernels::MlaAttentionWorkspaceBytes(p16, &ws_bytes));
  BENCH_CUDA(kernels::MlaAttentionWorkspaceBytes(p8, &ws8));
  ws_bytes = std::max(ws_bytes, ws8);
  void* ws = bench::DeviceAlloc<uint8_t>(std::max<size_t>(ws_bytes, 1));
  for (kernels::MlaAttentionParams* q : {&p16, &p8, &pc}) {
    q->workspace = ws;
    q->workspace_bytes = ws_bytes;
  }
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double bytes16 = static_cast<double>(tokens) * batch.context * entry * 2;
  const double bytes8 = static_cast<double>(tokens) * batch.context * layout.bytes;
  auto line = [&](const char* what, const std::string& kernel, double bytes, double ms) {
    std::printf("%-26s fp8 cache: %-18s %-28s %9.4f ms %7.1f GB/s of entries\n", batch.name, what,
                kernel.c_str(), ms, bytes / (ms * 1e-3) / 1e9);
  };
  const double ms16 = bench::GraphMeanMs(
      [&](cudaStream_t) { return kernels::MlaAttentionF32(p16, stream); }, stream);
  line("bf16 cache", kernels::MlaAttentionKernelName(p16), bytes16, ms16);
  const double ms8 = bench::GraphMeanMs(
      [&](cudaStream_t) { return kernels::MlaAttentionF32(p8, stream); }, stream);
  line("fp8 direct", kernels::MlaAttentionKernelName(p8), bytes8, ms8);
  const double ms_gather = bench::GraphMeanMs(
      [&](cudaStream_t) { return kernels::GatherFp8LatentCacheBf16(g, stream); }, stream);
  line("gather only", "GatherFp8LatentCacheBf16", bytes8 + bytes16, ms_gather);
  const double ms_pair = bench::GraphMeanMs(
      [&](cudaStream_t) {
        const cudaError_t e = kernels::GatherFp8LatentCacheBf16(g, stream);
        return e != cudaSuccess ? e : kernels::MlaAttentionF32(pc, stream);
      },
      stream);
  line("gather + bf16", std::string("gather + ") + kernels::MlaAttentionKernelName(pc), bytes8,
       ms_pair);
  BENCH_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> a(out_elems), b(out_elems);
  BENCH_CUDA(cudaMemcpy(a.data(), out8, out_elems * sizeof(float), cudaMemcpyDeviceToHost));
  BENCH_CUDA(cudaMemcpy(b.data(), out_copy, out_elems * sizeof(float), cudaMemcpyDeviceToHost));
  size_t differ = 0;
  for (size_t i = 0; i < out_elems; ++i) differ += std::memcmp(&a[i], &b[i], 4) != 0;
  std::printf(
      "%-26s fp8 cache: direct %.2fx the gather + bf16 pair, %.2fx the bf16 cache; "
      "outputs differing from the pair's: %zu of %zu%s\n",
      batch.name, ms_pair / ms8, ms16 / ms8, differ, out_elems,
      kernels::MlaAttentionReadsFp8Directly(p8) ? " (same kernel: expect 0)"
                                                : " (other kernels: not bit-equal)");
  std::fflush(stdout);
  BENCH_CUDA(cudaStreamDestroy(stream));
  for (void* ptr :
       {static_cast<void*>(kv), static_cast<void*>(d_slot), static_cast<void*>(cache16),
        static_cast<void*>(cache8), static_cast<void*>(q_latent), static_cast<void*>(q_rope),
        static_cast<void*>(d_tables), static_cast<void*>(d_seq), static_cast<void*>(d_len),
        static_cast<void*>(out8), static_cast<void*>(out_copy), static_cast<void*>(copy),
        static_cast<void*>(copy_tables), static_cast<void*>(copy_seq), ws}) {
    BENCH_CUDA(cudaFree(ptr));
  }
}

// The 16-head (Moonlight) decode comparison (`mla_attention_bench h16`): the key-split kernel
// (mma v9, double-buffered, 2 blocks per SM) against its ring form (mma v11, 4 key tiles, 1
// block per SM) at 8, 32, 64 and 128 requests x 1024 context, bf16 cache, block size 16, one
// token per request. Each line: the variant, the kernel MlaAttentionKernelName names, its split
// count (automatic, then forced 1/2/4/8), the mean time per call of 10 calls captured in a CUDA
// graph (replayed 5 times), and GB/s of cache entries read (requests x 1024 x 1152 bytes); then
// per batch v9 / v11 at their automatic splits and the largest |difference| of their outputs
// (the same math at different split counts, so P is rounded to bf16 against different running
// maxima: each output is within 2^-9 x max |latent| of the bf16-Q result, the latents are in
// [-1, 1), so expect at most ~4e-3; a wrong key or weight shows as ~0.1 or more).
void RunH16() {
  constexpr int32_t kHeads = 16, kContext = 1024;
  const int64_t entry = kLatent + kRope;
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int32_t seqs : {8, 32, 64, 128}) {
    const int32_t blocks_per_seq = kContext / kBlockSize;
    const int64_t num_blocks = int64_t{seqs} * blocks_per_seq, slots = num_blocks * kBlockSize;
    std::vector<int32_t> tables(num_blocks), slot(slots), token_seq, context_len;
    for (int32_t s = 0; s < seqs; ++s) {  // interleaved blocks, as in Run
      for (int32_t b = 0; b < blocks_per_seq; ++b) tables[s * blocks_per_seq + b] = b * seqs + s;
      token_seq.push_back(s);
      context_len.push_back(kContext);
    }
    for (int64_t i = 0; i < slots; ++i) slot[i] = static_cast<int32_t>(i);
    float* kv = Upload(Uniform(static_cast<size_t>(slots) * entry, 1));
    int32_t* d_slot = Upload(slot);
    uint16_t* cache16 = bench::DeviceAlloc<uint16_t>(static_cast<size_t>(slots) * entry * 2);
    const kernels::PagedLatentCache c16{cache16, kBlockSize, kLatent, kRope,
                                        kernels::LatentCacheType::kBFloat16};
    BENCH_CUDA(
        kernels::WriteLatentCacheF32(slots, kv, entry, kv + kLatent, entry, d_slot, c16, nullptr));
    const size_t out_elems = static_cast<size_t>(seqs) * kHeads * kLatent;
    kernels::MlaAttentionParams p;
    p.num_tokens = seqs;
    p.num_heads = kHeads;
    p.q_latent = Upload(Uniform(out_elems, 2));
    p.q_rope = Upload(Uniform(static_cast<size_t>(seqs) * kHeads * kRope, 3));
    p.q_rope_token_stride = int64_t{kHeads} * kRope;
    p.q_rope_head_stride = kRope;
    p.cache = c16;
    p.block_tables = Upload(tables);
    p.max_blocks_per_seq = blocks_per_seq;
    p.token_seq = Upload(token_seq);
    p.context_len = Upload(context_len);
    p.softmax_scale = 1.0f / std::sqrt(192.0f);
    float* out9 = bench::DeviceAlloc<float>(out_elems * sizeof(float));
    float* out11 = bench::DeviceAlloc<float>(out_elems * sizeof(float));
    // Room for kMaxMlaSplits splits (bytes = tokens x heads x splits x (latent + 2) x 4).
    const size_t split_bytes = static_cast<size_t>(seqs) * kHeads * (kLatent + 2) * sizeof(float);
    const size_t ws_bytes = split_bytes * kernels::kMaxMlaSplits;
    void* ws = bench::DeviceAlloc<uint8_t>(ws_bytes);
    p.workspace = ws;
    p.workspace_bytes = ws_bytes;
    const double bytes = double{1} * seqs * kContext * entry * 2;
    double auto_ms[2] = {0, 0};
    for (int i = 0; i < 2; ++i) {
      const int variant = i == 0 ? 9 : 11;
      for (int splits : {0, 1, 2, 4, 8}) {
        kernels::MlaAttentionParams pv = p;
        pv.mma_variant = variant;
        pv.num_splits = splits;
        pv.out_latent = variant == 9 ? out9 : out11;
        // The split count: through the workspace the params take with an output the cluster
        // merge does not write (not 16-byte aligned).
        kernels::MlaAttentionParams unmerged = pv;
        unmerged.out_latent = pv.out_latent + 1;
        size_t ws_v = 0, ws_unmerged = 0;
        BENCH_CUDA(kernels::MlaAttentionWorkspaceBytes(pv, &ws_v));
        BENCH_CUDA(kernels::MlaAttentionWorkspaceBytes(unmerged, &ws_unmerged));
        if (ws_v > ws_bytes) continue;
        const int shown = ws_unmerged == 0 ? 1 : static_cast<int>(ws_unmerged / split_bytes);
        const double ms = bench::GraphMeanMs(
            [&](cudaStream_t) { return kernels::MlaAttentionF32(pv, stream); }, stream);
        if (splits == 0) auto_ms[i] = ms;
        std::printf(
            "h16 %3d x ctx%d  mma v%-2d %-32s splits %-2d%s %8.2f us %7.1f GB/s (%4.1f%% of 4.3 "
            "TB/s)\n",
            seqs, kContext, variant, kernels::MlaAttentionKernelName(pv), shown,
            splits == 0 ? " auto " : " forced", ms * 1e3, bytes / (ms * 1e-3) / 1e9,
            100.0 * bytes / (ms * 1e-3) / kPeakBytesPerS);
      }
      // The automatic split count's output last in out9 / out11.
      kernels::MlaAttentionParams pv = p;
      pv.mma_variant = variant;
      pv.out_latent = variant == 9 ? out9 : out11;
      BENCH_CUDA(kernels::MlaAttentionF32(pv, stream));
    }
    BENCH_CUDA(cudaStreamSynchronize(stream));
    std::vector<float> a(out_elems), b(out_elems);
    BENCH_CUDA(cudaMemcpy(a.data(), out9, out_elems * sizeof(float), cudaMemcpyDeviceToHost));
    BENCH_CUDA(cudaMemcpy(b.data(), out11, out_elems * sizeof(float), cudaMemcpyDeviceToHost));
    double worst = 0;
    for (size_t i = 0; i < out_elems; ++i) {
      const double e = std::fabs(static_cast<double>(a[i]) - b[i]);
      if (!(e <= worst)) worst = e;  // NaN sticks
    }
    std::printf("h16 %3d x ctx%d  v9 / v11 (automatic splits): %.2fx; max |v9 - v11| = %.3g\n",
                seqs, kContext, auto_ms[0] / auto_ms[1], worst);
    std::fflush(stdout);
    for (const void* ptr :
         {static_cast<const void*>(kv), static_cast<const void*>(d_slot),
          static_cast<const void*>(cache16), static_cast<const void*>(p.q_latent),
          static_cast<const void*>(p.q_rope), static_cast<const void*>(p.block_tables),
          static_cast<const void*>(p.token_seq), static_cast<const void*>(p.context_len),
          static_cast<const void*>(out9), static_cast<const void*>(out11),
          static_cast<const void*>(ws)}) {
      BENCH_CUDA(cudaFree(const_cast<void*>(ptr)));
    }
  }
  BENCH_CUDA(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace deepinfer

// mla_attention_bench [NAME]: only the cases whose name contains NAME (e.g. for ncu);
// mla_attention_bench h16: only RunH16 (mma v9 against v11 at 16 heads).
int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs; latent %d rope %d block %d; fp32 and bf16 caches\n", prop.name,
              prop.multiProcessorCount, deepinfer::kLatent, deepinfer::kRope,
              deepinfer::kBlockSize);
  if (only == "h16") {
    deepinfer::RunH16();
    return 0;
  }
  for (const deepinfer::Batch& b : {
           deepinfer::Batch{"decode 1 x ctx1024 h16", 1, 1024, 16, false},
           deepinfer::Batch{"decode 1 x ctx8192 h16", 1, 8192, 16, false},
           deepinfer::Batch{"decode 64 x ctx1024 h16", 64, 1024, 16, false},
           deepinfer::Batch{"decode 128 x ctx1024 h16", 128, 1024, 16, false},
           deepinfer::Batch{"decode 256 x ctx1024 h16", 256, 1024, 16, false},
           deepinfer::Batch{"decode 128 x ctx4096 h16", 128, 4096, 16, false},
           deepinfer::Batch{"decode 1 x ctx1024 h128", 1, 1024, 128, false},
           deepinfer::Batch{"decode 4 x ctx1024 h128", 4, 1024, 128, false},
           deepinfer::Batch{"decode 16 x ctx1024 h128", 16, 1024, 128, false},
           deepinfer::Batch{"decode 32 x ctx1024 h128", 32, 1024, 128, false},
           deepinfer::Batch{"decode 64 x ctx1024 h128", 64, 1024, 128, false},
           deepinfer::Batch{"decode 128 x ctx1024 h128", 128, 1024, 128, false},
           deepinfer::Batch{"prefill 8 x 1024 h16", 8, 1024, 16, true},
       }) {
    if (std::string(b.name).find(only) == std::string::npos) continue;
    deepinfer::Run(b);
  }
  // "fp8" selects these alone.
  for (const deepinfer::Batch& b : {
           deepinfer::Batch{"fp8 decode 8 x ctx1024 h16", 8, 1024, 16, false},
           deepinfer::Batch{"fp8 decode 64 x ctx1024 h16", 64, 1024, 16, false},
           deepinfer::Batch{"fp8 decode 128 x ctx1024 h16", 128, 1024, 16, false},
           deepinfer::Batch{"fp8 decode 128 x ctx1024 h128", 128, 1024, 128, false},
       }) {
    if (std::string(b.name).find(only) == std::string::npos) continue;
    deepinfer::RunFp8(b);
  }
  return 0;
}
