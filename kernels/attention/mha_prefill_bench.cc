// Times MLA prefill attention in its two forms on the Moonlight attention shape (16 heads, latent
// 512, rope 64, nope 128, v 128, bf16 weights and cache, block size 16), through CudaBackend as
// the model calls it:
//   absorbed  BatchedGemm q_nope . W_uk -> q_latent (fp32), MlaAttention (the fused flash kernel
//             or cuBLAS, CudaBackend's choice), BatchedGemm o_latent . W_uv -> o (fp32);
//   mha       MhaPrefillAttention: gather + kv_b expansion (cuBLAS, bf16 out) + flash attention
//             of width 192 / 128, o in bf16 (o_proj's operand).
// Prints per case the median of 20 timed runs (CUDA events on the backend's stream, after 3
// warm-ups), each form's FLOPs and rate (its own count: absorbed 2 * (576 + 512) per (query,
// key) pair and head plus the W_uk / W_uv products; mha 2 * (192 + 128) per pair and head plus
// the expansion of every key), and the largest difference between the two forms' outputs.
// Then one line per flash kernel (kernels::MhaFlashKernel through the kernel API: rows64,
// rows128, auto) with the non-absorbed form's time, the attention kernel's share (minus the
// gather + tuned expansion, timed alone) and its rate counting only the causal pairs' 2 * (192 +
// 128) FLOPs. Before those, the gather + expansion alone (MhaPrefillParams::expand_only through
// the kernel API): the gather alone, with cublasGemmEx or with the cuBLASLt tuner, at the default
// workspace budget or one large enough for one group, and whether each changes the output bits.
// `mha_prefill_bench expand` prints only those.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/attention/mha_prefill.h"
#include "kernels/testing/bench_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cuda/cublaslt_gemm_tuner.h"
#include "worker/backend/cuda/cuda_backend.h"

namespace deepinfer {
namespace {

using bench::Uniform;

constexpr int32_t kHeads = 16, kLatent = 512, kRope = 64, kNope = 128, kV = 128;
constexpr int32_t kQk = kNope + kRope, kBlockSize = 16;

struct Case {
  const char* name;
  int32_t seqs, past, new_tokens;
};

// Median milliseconds of fn() (ops on the backend's stream) over 20 runs after 3 warm-ups.
template <typename Fn>
double MedianMs(CudaBackend& be, Fn&& fn) {
  cudaStream_t stream = static_cast<cudaStream_t>(be.native_stream());
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  std::vector<float> ms(20);
  for (float& m : ms) {
    BENCH_CUDA(cudaEventRecord(a, stream));
    fn();
    BENCH_CUDA(cudaEventRecord(b, stream));
    BENCH_CUDA(cudaEventSynchronize(b));
    BENCH_CUDA(cudaEventElapsedTime(&m, a, b));
  }
  std::sort(ms.begin(), ms.end());
  BENCH_CUDA(cudaEventDestroy(a));
  BENCH_CUDA(cudaEventDestroy(b));
  return ms[ms.size() / 2];
}

void Run(CudaBackend& be, const Case& c, bool all_flash, void* lt_workspace) {
  const int32_t context = c.past + c.new_tokens;
  const int32_t blocks_per_seq = (context + kBlockSize - 1) / kBlockSize;
  const int64_t num_blocks = static_cast<int64_t>(c.seqs) * blocks_per_seq;
  const int64_t T = static_cast<int64_t>(c.seqs) * c.new_tokens, entry = kLatent + kRope;
  // Sequence s owns blocks s, s + seqs, ...: interleaved, as a pool hands them out.
  std::vector<int32_t> tables(num_blocks);
  for (int32_t s = 0; s < c.seqs; ++s) {
    for (int32_t b = 0; b < blocks_per_seq; ++b) tables[s * blocks_per_seq + b] = b * c.seqs + s;
  }
  std::vector<float> cache_f = Uniform(num_blocks * kBlockSize * entry, 1);
  std::vector<uint16_t> cache(cache_f.size());
  for (size_t i = 0; i < cache.size(); ++i) cache[i] = FloatToBf16Bits(cache_f[i]);
  std::vector<float> q = Uniform(T * kHeads * kQk, 2);
  // kv_b ~ U(-1, 1) / sqrt(latent), rounded to bf16 first so that W_uk^T holds the same values.
  std::vector<float> kv_b = Uniform(static_cast<size_t>(kHeads) * (kNope + kV) * kLatent, 3);
  for (float& w : kv_b) w = RoundToBf16(w * 0.0442f);
  std::vector<float> uk_t(static_cast<size_t>(kHeads) * kLatent * kNope);
  for (int64_t h = 0; h < kHeads; ++h)
    for (int64_t d = 0; d < kNope; ++d)
      for (int64_t ci = 0; ci < kLatent; ++ci)
        uk_t[(h * kLatent + ci) * kNope + d] = kv_b[(h * (kNope + kV) + d) * kLatent + ci];

  auto dcache = be.Allocate(cache.size() * sizeof(uint16_t));
  be.CopyToDevice(cache.data(), cache.size() * sizeof(uint16_t), dcache->data());
  auto dtables = be.Allocate(tables.size() * sizeof(int32_t));
  be.CopyToDevice(tables.data(), tables.size() * sizeof(int32_t), dtables->data());
  auto dq = be.Allocate(q.size() * sizeof(float));
  be.CopyToDevice(q.data(), q.size() * sizeof(float), dq->data());
  auto dkv_b = be.UploadWeight(kv_b.data(), static_cast<int64_t>(kv_b.size()));
  auto duk_t = be.UploadWeight(uk_t.data(), static_cast<int64_t>(uk_t.size()));
  std::vector<int32_t> token_seq, context_len;
  std::vector<MlaSequenceSpan> spans;
  for (int32_t s = 0; s < c.seqs; ++s) {
    spans.push_back({static_cast<int32_t>(token_seq.size()), c.new_tokens, context});
    for (int32_t t = 0; t < c.new_tokens; ++t) {
      token_seq.push_back(s);
      context_len.push_back(c.past + t + 1);
    }
  }
  auto dseq = be.Allocate(T * sizeof(int32_t)), dlen = be.Allocate(T * sizeof(int32_t));
  be.CopyToDevice(token_seq.data(), T * sizeof(int32_t), dseq->data());
  be.CopyToDevice(context_len.data(), T * sizeof(int32_t), dlen->data());
  const PagedLatentCacheView view{dcache->data(), kBlockSize, kLatent, kRope,
                                  WeightDType::kBFloat16};
  const float scale = 1.0f / std::sqrt(static_cast<float>(kQk));
  const WeightView kv_b_view(dkv_b->data(), WeightDType::kBFloat16);
  const WeightView uk_view(duk_t->data(), WeightDType::kBFloat16);

  auto q_latent = be.Allocate(T * kHeads * kLatent * sizeof(float));
  auto o_latent = be.Allocate(T * kHeads * kLatent * sizeof(float));
  auto o_abs = be.Allocate(T * kHeads * kV * sizeof(float));
  auto o_mha = be.Allocate(T * kHeads * kV * sizeof(uint16_t));
  auto absorbed = [&] {
    be.BatchedGemm(kHeads, T, kLatent, kNope, dq->as<float>(), kHeads * kQk, kQk, uk_view, kNope,
                   kLatent * kNope, q_latent->as<float>(), kHeads * kLatent, kLatent);
    MlaAttentionArgs a;
    a.num_tokens = static_cast<int32_t>(T);
    a.num_heads = kHeads;
    a.q_latent = q_latent->as<float>();
    a.q_rope = dq->as<float>() + kNope;
    a.q_rope_token_stride = kHeads * kQk;
    a.q_rope_head_stride = kQk;
    a.cache = view;
    a.block_tables = dtables->as<int32_t>();
    a.max_blocks_per_seq = blocks_per_seq;
    a.token_seq = dseq->as<int32_t>();
    a.context_len = dlen->as<int32_t>();
    a.softmax_scale = scale;
    a.out_latent = o_latent->as<float>();
    a.sequences = spans.data();
    a.num_sequences = static_cast<int32_t>(spans.size());
    be.MlaAttention(a);
    be.BatchedGemm(kHeads, T, kV, kLatent, o_latent->as<float>(), kHeads * kLatent, kLatent,
                   kv_b_view.Offset(kNope * kLatent), kLatent, (kNope + kV) * kLatent,
                   o_abs->as<float>(), kHeads * kV, kV);
  };
  bool mha_ran = true;
  auto mha = [&] {
    MhaPrefillArgs a;
    a.num_tokens = static_cast<int32_t>(T);
    a.num_heads = kHeads;
    a.nope_dim = kNope;
    a.v_dim = kV;
    a.q = dq->as<float>();
    a.q_token_stride = kHeads * kQk;
    a.q_head_stride = kQk;
    a.cache = view;
    a.block_tables = dtables->as<int32_t>();
    a.max_blocks_per_seq = blocks_per_seq;
    a.kv_b = kv_b_view;
    a.sequences = spans.data();
    a.num_sequences = static_cast<int32_t>(spans.size());
    a.softmax_scale = scale;
    a.out_bf16 = o_mha->as<uint16_t>();
    mha_ran = be.MhaPrefillAttention(a) && mha_ran;
  };
  const double abs_ms = MedianMs(be, absorbed);
  const double mha_ms = MedianMs(be, mha);
  if (!be.status().ok() || !mha_ran) {
    std::fprintf(stderr, "%s: %s (mha ran: %d)\n", c.name, be.status().ToString().c_str(), mha_ran);
    std::exit(1);
  }
  std::vector<float> oa(T * kHeads * kV);
  std::vector<uint16_t> om(T * kHeads * kV);
  be.CopyToHost(o_abs->data(), oa.size() * sizeof(float), oa.data());
  be.CopyToHost(o_mha->data(), om.size() * sizeof(uint16_t), om.data());
  double worst = 0, sq = 0, mag = 0;
  for (size_t i = 0; i < oa.size(); ++i) {
    const double d = std::abs(static_cast<double>(Bf16BitsToFloat(om[i])) - oa[i]);
    worst = std::max(worst, d);
    sq += d * d;
    mag = std::max(mag, std::abs(static_cast<double>(oa[i])));
  }
  // (query, key) pairs of the causal mask, per head.
  const double pairs =
      static_cast<double>(c.seqs) * c.new_tokens * (c.past + (c.new_tokens + 1) / 2.0);
  const double keys = static_cast<double>(c.seqs) * context;
  const double abs_flops =
      pairs * kHeads * 2.0 * (2 * kLatent + kRope) + 2.0 * T * kHeads * kLatent * (kNope + kV);
  const double mha_flops =
      pairs * kHeads * 2.0 * (kQk + kV) + 2.0 * keys * kLatent * kHeads * (kNope + kV);
  std::printf(
      "%-22s absorbed %8.3f ms (%6.1f TFLOP/s of %.3g) | mha %8.3f ms (%6.1f TFLOP/s of %.3g) | "
      "speedup %.2fx | max |diff| %.3g (max |o| %.3g), rms %.3g\n",
      c.name, abs_ms, abs_flops / abs_ms / 1e9, abs_flops, mha_ms, mha_flops / mha_ms / 1e9,
      mha_flops, abs_ms / mha_ms, worst, mag, std::sqrt(sq / oa.size()));

  // Gather + expansion alone, through the kernel API with the backend's stream.
  std::vector<kernels::MhaPrefillSequence> kseqs;
  for (int32_t s = 0; s < c.seqs; ++s) {
    kseqs.push_back({s, spans[s].first_token, spans[s].num_tokens, spans[s].context_len});
  }
  kernels::MhaPrefillParams p;
  p.num_heads = kHeads;
  p.nope_dim = kNope;
  p.v_dim = kV;
  p.q = dq->as<float>();
  p.q_token_stride = kHeads * kQk;
  p.q_head_stride = kQk;
  p.cache = dcache->data();
  p.block_size = kBlockSize;
  p.latent_dim = kLatent;
  p.rope_dim = kRope;
  p.block_tables = dtables->as<int32_t>();
  p.max_blocks_per_seq = blocks_per_seq;
  p.kv_b = static_cast<const uint16_t*>(dkv_b->data());
  p.sequences = kseqs.data();
  p.num_sequences = c.seqs;
  p.softmax_scale = scale;
  p.out_bf16 = o_mha->as<uint16_t>();
  p.out_token_stride = kHeads * kV;
  p.expand_only = true;
  p.workspace_bytes = kernels::MhaPrefillWorkspaceBytes(p);
  p.workspace = bench::DeviceAlloc<uint8_t>(p.workspace_bytes);
  cublasHandle_t blas = nullptr;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasCreate failed\n");
    std::exit(1);
  }
  cudaStream_t stream = static_cast<cudaStream_t>(be.native_stream());
  const double attn_flops = pairs * kHeads * 2.0 * (kQk + kV);
  const double expand_flops = 2.0 * keys * kLatent * kHeads * (kNope + kV);
  // The gather + expansion (kernel API, expand_only): alone (an expansion hook that launches
  // nothing), with cublasGemmEx or with a CublasLtGemmTuner as the backend uses it; the
  // workspace budget (default 256 MiB: 32 x 1024 in two groups; 320 MiB: one group).
  auto tuner_or = CublasLtGemmTuner::Create(lt_workspace, CudaBackend::kCublasWorkspaceBytes);
  if (!tuner_or.ok()) {
    std::fprintf(stderr, "%s\n", tuner_or.status().ToString().c_str());
    std::exit(1);
  }
  CublasLtGemmTuner& tuner = **tuner_or;
  const kernels::MhaExpandGemmFn skip = [](const kernels::MhaExpandGemm&, cudaStream_t) {
    return cudaSuccess;
  };
  const kernels::MhaExpandGemmFn tuned = [&](const kernels::MhaExpandGemm& g, cudaStream_t st) {
    LtGemm lg;
    lg.m = g.keys, lg.n = g.kv_width, lg.k = g.latent_dim, lg.a = g.entries;
    lg.lda = g.entries_stride, lg.w = g.kv_b, lg.ldw = g.latent_dim, lg.c = g.kv;
    lg.ldc = g.kv_width, lg.c_bf16 = true;
    auto ran = tuner.Run(lg, st, nullptr);
    if (!ran.ok()) {
      std::fprintf(stderr, "%s\n", ran.status().ToString().c_str());
      std::exit(1);
    }
    return *ran ? cudaSuccess : cudaErrorNotSupported;
  };
  constexpr size_t kOneGroupBudget = size_t{320} << 20;
  p.workspace_budget = kOneGroupBudget;
  const size_t one_group_bytes = kernels::MhaPrefillWorkspaceBytes(p);
  p.workspace_budget = 0;
  if (one_group_bytes > p.workspace_bytes) {
    p.workspace_bytes = one_group_bytes;
    p.workspace = bench::DeviceAlloc<uint8_t>(p.workspace_bytes);
  }
  auto expand = [&](const kernels::MhaExpandGemmFn& fn, size_t budget) {
    p.expand_gemm = fn;
    p.workspace_budget = budget;
    const double ms = MedianMs(be, [&] { BENCH_CUDA(kernels::MhaPrefillBf16(p, blas, stream)); });
    p.expand_gemm = nullptr;
    p.workspace_budget = 0;
    return ms;
  };
  const double gather_ms = expand(skip, 0);
  const double gemmex_ms = expand(nullptr, 0);
  const double tuned_ms = expand(tuned, 0);
  const double group_tuned_ms = expand(tuned, kOneGroupBudget);
  const double gather_mb = 2.0 * keys * entry * 2 / 1e6;
  std::printf(
      "%-22s   gather alone %8.3f ms (%6.0f GB/s of %.1f MB) | + cublasGemmEx %8.3f ms | + "
      "cuBLASLt tuned %8.3f ms (%6.1f TFLOP/s) | tuned, 320 MiB budget %8.3f ms\n",
      c.name, gather_ms, gather_mb / gather_ms, gather_mb, gemmex_ms, tuned_ms,
      expand_flops / tuned_ms / 1e9, group_tuned_ms);
  // Whole op through the kernel API: the tuned GEMM may sum in another order than cublasGemmEx.
  p.expand_only = false;
  auto out_bits = [&](const kernels::MhaExpandGemmFn& fn, size_t budget) {
    p.expand_gemm = fn;
    p.workspace_budget = budget;
    BENCH_CUDA(kernels::MhaPrefillBf16(p, blas, stream));
    BENCH_CUDA(cudaStreamSynchronize(stream));
    std::vector<uint16_t> bits(om.size());
    be.CopyToHost(o_mha->data(), bits.size() * sizeof(uint16_t), bits.data());
    return bits;
  };
  const std::vector<uint16_t> gemmex_bits = out_bits(nullptr, 0);
  const std::vector<uint16_t> tuned_bits = out_bits(tuned, 0);
  const std::vector<uint16_t> group_bits = out_bits(tuned, kOneGroupBudget);
  p.expand_gemm = nullptr;
  p.workspace_budget = 0;
  auto max_diff = [&](const std::vector<uint16_t>& x) {
    double d = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      d = std::max(d, std::abs(static_cast<double>(Bf16BitsToFloat(x[i])) -
                               Bf16BitsToFloat(gemmex_bits[i])));
    }
    return d;
  };
  std::printf(
      "%-22s     output vs cublasGemmEx: tuned GEMM %s (max |diff| %.3g); one group %s (max "
      "|diff| %.3g)\n",
      c.name, tuned_bits == gemmex_bits ? "bit-identical" : "differs", max_diff(tuned_bits),
      group_bits == tuned_bits ? "bit-identical to tuned" : "differs from tuned",
      max_diff(group_bits));
  if (!all_flash) {
    cublasDestroy(blas);
    std::fflush(stdout);
    return;
  }
  // Each flash kernel through the kernel API with the backend's expansion (the tuner).
  struct Flash {
    const char* name;
    kernels::MhaFlashKernel kernel;
  };
  p.expand_gemm = tuned;
  for (const Flash& f : {Flash{"rows64", kernels::MhaFlashKernel::kRows64},
                         Flash{"rows128", kernels::MhaFlashKernel::kRows128},
                         Flash{"auto", kernels::MhaFlashKernel::kAuto}}) {
    p.flash = f.kernel;
    const double ms = MedianMs(be, [&] { BENCH_CUDA(kernels::MhaPrefillBf16(p, blas, stream)); });
    be.CopyToHost(o_mha->data(), om.size() * sizeof(uint16_t), om.data());
    double fworst = 0;
    for (size_t i = 0; i < oa.size(); ++i) {
      fworst = std::max(fworst, std::abs(static_cast<double>(Bf16BitsToFloat(om[i])) - oa[i]));
    }
    const double attn_ms = ms - tuned_ms;  // the gather + tuned expansion, timed alone above
    std::printf(
        "%-22s   flash %-8s mha %8.3f ms | attention %8.3f ms (%6.1f TFLOP/s of %.3g, %4.1f%% of "
        "mha) | max |diff| vs absorbed %.3g\n",
        c.name, f.name, ms, attn_ms, attn_flops / attn_ms / 1e9, attn_flops, 100.0 * attn_ms / ms,
        fworst);
  }
  p.flash = kernels::MhaFlashKernel::kAuto;
  p.expand_gemm = nullptr;
  cublasDestroy(blas);
  std::fflush(stdout);
}

}  // namespace
}  // namespace deepinfer

// `mha_prefill_bench expand`: only the gather + expansion lines (no per-flash-kernel lines).
int main(int argc, char** argv) {
  using deepinfer::Case;
  const bool all_flash = !(argc > 1 && std::strcmp(argv[1], "expand") == 0);
  auto be = deepinfer::CudaBackend::Create(0, deepinfer::WeightDType::kBFloat16);
  if (!be.ok()) {
    std::fprintf(stderr, "%s\n", be.status().ToString().c_str());
    return 1;
  }
  void* lt_workspace =
      deepinfer::bench::DeviceAlloc<uint8_t>(deepinfer::CudaBackend::kCublasWorkspaceBytes);
  for (const Case& c :
       {Case{"32 x 1024", 32, 0, 1024}, Case{"8 x 1024", 8, 0, 1024}, Case{"1 x 4096", 1, 0, 4096},
        Case{"4 x (1024 + 1024 new)", 4, 1024, 1024}, Case{"32 x 128", 32, 0, 128},
        Case{"32 x 64", 32, 0, 64}, Case{"8 x (960 + 64 new)", 8, 960, 64}}) {
    deepinfer::Run(**be, c, all_flash, lt_workspace);
  }
  return 0;
}
