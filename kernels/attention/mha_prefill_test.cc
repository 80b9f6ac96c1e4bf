// MhaPrefillBf16 (non-absorbed MLA prefill) through CudaBackend::MhaPrefillAttention and the
// kernel API, against CpuBackend::MhaPrefillAttention (fp32 attention over K / V from the CPU's
// Gemm): one 1024-token prompt, cached prefixes + new chunks of lengths that are not multiples
// of the 64-token tile, 1-token chunks, block sizes 16 and 64, 4, 16 and 20 heads, fp32 and bf16
// caches, fp32 and bf16 output, 70 sequences (two groups of at most 64), on fresh random data
// with the output and the unowned cache blocks poisoned (NaN); every case through the backend
// (kAuto's flash kernel, fp32 and bf16 output) and through the kernel API with each flash kernel
// (kernels::MhaFlashKernel: 64-row and 128-row) and with a workspace group per sequence, plus
// chunks that end inside a 128-row tile behind prefixes that are not multiples of a key tile;
// the expansion paths (cublasGemmEx, the backend's cuBLASLt tuner or a caller's GEMM hook, one or
// several workspace groups).
//
// Tolerance: the kernel rounds q, the expanded K_nope / V and P to bf16 (u = 2^-9), the reference
// does not. Latents ~ N(0, 1), kv_b ~ N(0, 1/512): K_nope, V ~ N(0, 1); q ~ N(0, 1), scale
// 0.0721 (1/sqrt(192)): scores ~ N(0, 1). Rounding both operands of a 192-term dot product moves
// a score by about scale * sqrt(192 * 2/3) * u ~ 1.6e-3, an output by that times |v_j - o| (a few
// units), and rounding P and V adds ~u relative: the per-element error is expected ~1e-2 at
// worst, the root mean square well under 1e-3. The bounds of mla_prefill_test (4e-2 + 2e-2
// relative, rms 4e-3) are kept: a wrong scale, a missed or extra key, a mask off by one (O(1) on
// the short rows) or a wrong head's K / V exceed them.
#include "kernels/attention/mha_prefill.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/cuda/cuda_backend.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::DeviceArray;

constexpr double kAtol = 4e-2, kRtol = 2e-2, kRmsBound = 4e-3;
constexpr int32_t kLatent = 512, kRope = 64, kNope = 128, kV = 128, kQk = kNope + kRope;
constexpr float kScale = 0.0721f;

struct Seq {
  int32_t past;    // positions already cached
  int32_t tokens;  // new tokens (queries)
};

// A batch of sequences in a shuffled paged cache, queries, kv_b, and the CPU reference output.
struct Problem {
  int32_t heads = 0, block_size = 0, max_blocks = 0, num_blocks = 0;
  std::vector<Seq> seqs;
  std::vector<int32_t> tables;
  std::vector<bool> owned;
  std::vector<MlaSequenceSpan> spans;
  std::vector<float> cache, q;  // cache: fp32 values (bf16-representable if bf16)
  std::vector<uint16_t> kv_b;   // bf16 bits [heads * (nope + v), latent]
  std::vector<float> want;
  int64_t tokens = 0;

  Problem(int32_t h, int32_t bs, std::vector<Seq> s, bool bf16_cache, uint32_t seed)
      : heads(h), block_size(bs), seqs(std::move(s)) {
    for (const Seq& x : seqs) {
      const int32_t n = (x.past + x.tokens + bs - 1) / bs;
      max_blocks = std::max(max_blocks, n);
      num_blocks += n;
    }
    num_blocks += 3;  // blocks no sequence owns (poisoned on the device: must not be read)
    std::mt19937 gen(seed);
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), gen);
    tables.assign(seqs.size() * max_blocks, 0);
    owned.assign(num_blocks, false);
    const int64_t entry = kLatent + kRope;
    cache.assign(static_cast<size_t>(num_blocks) * bs * entry, 0.0f);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    int next = 0, first = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int32_t len = seqs[i].past + seqs[i].tokens;
      for (int32_t b = 0; b * bs < len; ++b) {
        tables[i * max_blocks + b] = perm[next++];
        owned[tables[i * max_blocks + b]] = true;
      }
      for (int32_t p = 0; p < len; ++p) {
        const int64_t slot = tables[i * max_blocks + p / bs] * bs + p % bs;
        for (int64_t e = 0; e < entry; ++e) {
          const float v = normal(gen);
          cache[slot * entry + e] = bf16_cache ? RoundToBf16(v) : v;
        }
      }
      spans.push_back({first, seqs[i].tokens, len});
      first += seqs[i].tokens;
    }
    tokens = first;
    q = testing::RandomFloats(tokens * heads * kQk, seed + 1);
    const std::vector<float> w =
        testing::RandomFloats(static_cast<size_t>(heads) * (kNope + kV) * kLatent, seed + 2,
                              1.0f / std::sqrt(static_cast<float>(kLatent)));
    kv_b.resize(w.size());
    for (size_t i = 0; i < w.size(); ++i) kv_b[i] = FloatToBf16Bits(w[i]);
    CpuBackend cpu(8, WeightDType::kBFloat16);
    want.assign(tokens * heads * kV, 0.0f);
    MhaPrefillArgs a = Args(cache.data(), WeightDType::kFloat32, tables.data(), q.data(),
                            kv_b.data(), spans.data());
    a.out = want.data();
    EXPECT_TRUE(cpu.MhaPrefillAttention(a));
    EXPECT_TRUE(cpu.status().ok()) << cpu.status();
  }

  MhaPrefillArgs Args(void* c, WeightDType cache_dtype, const int32_t* t, const float* qq,
                      const uint16_t* w, const MlaSequenceSpan* sp) const {
    MhaPrefillArgs a;
    a.num_tokens = static_cast<int32_t>(tokens);
    a.num_heads = heads;
    a.nope_dim = kNope;
    a.v_dim = kV;
    a.q = qq;
    a.q_token_stride = static_cast<int64_t>(heads) * kQk;
    a.q_head_stride = kQk;
    a.cache = {c, block_size, kLatent, kRope, cache_dtype};
    a.block_tables = t;
    a.max_blocks_per_seq = max_blocks;
    a.kv_b = WeightView(w, WeightDType::kBFloat16);
    a.sequences = sp;
    a.num_sequences = static_cast<int32_t>(seqs.size());
    a.softmax_scale = kScale;
    return a;
  }

  // The kernel API's params for the same problem (fp32 out; sequences in *seqs, which must
  // outlive them; no workspace yet).
  kernels::MhaPrefillParams KernelParams(const void* c, bool cache_bf16, const int32_t* t,
                                         const float* qq, const uint16_t* w, float* out,
                                         std::vector<kernels::MhaPrefillSequence>* seqs) const {
    seqs->clear();
    for (size_t i = 0; i < spans.size(); ++i) {
      seqs->push_back({static_cast<int32_t>(i), spans[i].first_token, spans[i].num_tokens,
                       spans[i].context_len});
    }
    kernels::MhaPrefillParams p;
    p.num_heads = heads;
    p.nope_dim = kNope;
    p.v_dim = kV;
    p.q = qq;
    p.q_token_stride = static_cast<int64_t>(heads) * kQk;
    p.q_head_stride = kQk;
    p.cache = c;
    p.cache_bf16 = cache_bf16;
    p.block_size = block_size;
    p.latent_dim = kLatent;
    p.rope_dim = kRope;
    p.block_tables = t;
    p.max_blocks_per_seq = max_blocks;
    p.kv_b = w;
    p.sequences = seqs->data();
    p.num_sequences = static_cast<int32_t>(seqs->size());
    p.softmax_scale = kScale;
    p.out = out;
    p.out_token_stride = static_cast<int64_t>(heads) * kV;
    return p;
  }

  void Expect(const std::vector<float>& got, double atol, double rtol, double rms_bound) const {
    EXPECT_TRUE(AllClose(got, want, atol, rtol));
    double sq = 0, worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double d = static_cast<double>(got[i]) - want[i];
      sq += d * d;
      worst = std::max(worst, std::abs(d));
    }
    const double rms = std::sqrt(sq / std::max<size_t>(got.size(), 1));
    EXPECT_LE(rms, rms_bound);
    std::printf("[mha-prefill] %lld tokens: max abs error %.3g, rms %.3g\n",
                static_cast<long long>(tokens), worst, rms);
  }
};

struct Case {
  std::string name;
  int32_t heads, block_size;
  std::vector<Seq> seqs;
  bool bf16_cache = true;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> Cases() {
  std::vector<Case> c;
  c.push_back({"prompt1024_heads16_block16", 16, 16, {{0, 1024}}});
  // Cached prefixes and chunks that are not multiples of 64; a 1-token chunk; a chunk of 65.
  c.push_back(
      {"chunked_heads16_block16", 16, 16, {{100, 37}, {0, 1}, {5, 200}, {63, 65}, {300, 1}}});
  c.push_back({"fp32_cache_heads4_block64", 4, 64, {{0, 130}, {300, 70}}, false});
  c.push_back({"heads20_block64", 20, 64, {{0, 131}, {65, 64}}});
  // Chunks that end mid 128-row tile behind cached prefixes not a multiple of the key tiles.
  c.push_back({"prefix_heads16_block16", 16, 16, {{200, 300}, {0, 1000}, {77, 129}, {33, 127}}});
  std::vector<Seq> many;
  for (int i = 0; i < 70; ++i) many.push_back({(i * 37) % 150, 1 + (i * 13) % 40});
  c.push_back({"70_seqs_heads16_block16", 16, 16, many});
  return c;
}

class MhaPrefillTest : public ::testing::TestWithParam<Case> {};

TEST_P(MhaPrefillTest, MatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << c.name << " seed " << seed);
  const Problem pr(c.heads, c.block_size, c.seqs, c.bf16_cache, seed);

  std::vector<uint16_t> cache_bits(pr.cache.size());
  for (size_t i = 0; i < cache_bits.size(); ++i) cache_bits[i] = FloatToBf16Bits(pr.cache[i]);
  DeviceArray<float> dcache_f(pr.cache);
  DeviceArray<uint16_t> dcache_b(cache_bits);
  DeviceArray<float> dq(pr.q), dout(pr.want.size());
  DeviceArray<uint16_t> dkv_b(pr.kv_b), dout16(pr.want.size());
  DeviceArray<int32_t> dtables(pr.tables);
  // Blocks no sequence owns hold NaN: reading one would show in the output.
  const int64_t block_elems = static_cast<int64_t>(pr.block_size) * (kLatent + kRope);
  for (int32_t b = 0; b < pr.num_blocks; ++b) {
    if (pr.owned[b]) continue;
    cudaMemset(dcache_f.get() + b * block_elems, 0xFF, block_elems * sizeof(float));
    cudaMemset(dcache_b.get() + b * block_elems, 0xFF, block_elems * sizeof(uint16_t));
  }
  DEEPINFER_CUDA_OK(cudaDeviceSynchronize());

  auto gpu_or = CudaBackend::Create(0, WeightDType::kBFloat16);
  ASSERT_TRUE(gpu_or.ok()) << gpu_or.status();
  CudaBackend& gpu = **gpu_or;
  void* cache = c.bf16_cache ? static_cast<void*>(dcache_b.get()) : dcache_f.get();
  const WeightDType cache_dtype = c.bf16_cache ? WeightDType::kBFloat16 : WeightDType::kFloat32;
  MhaPrefillArgs a =
      pr.Args(cache, cache_dtype, dtables.get(), dq.get(), dkv_b.get(), pr.spans.data());
  std::vector<float> got;
  {
    SCOPED_TRACE("backend, fp32 out");
    dout.Poison();
    a.out = dout.get();
    a.out_bf16 = nullptr;
    ASSERT_TRUE(gpu.MhaPrefillAttention(a));
    DEEPINFER_CUDA_OK(dout.Download(&got));
    ASSERT_TRUE(gpu.status().ok()) << gpu.status();
    pr.Expect(got, kAtol, kRtol, kRmsBound);
  }
  {
    // One more bf16 rounding of each output (u relative).
    SCOPED_TRACE("backend, bf16 out");
    dout16.Poison();
    a.out = nullptr;
    a.out_bf16 = dout16.get();
    ASSERT_TRUE(gpu.MhaPrefillAttention(a));
    std::vector<uint16_t> bits;
    DEEPINFER_CUDA_OK(dout16.Download(&bits));
    ASSERT_TRUE(gpu.status().ok()) << gpu.status();
    got.resize(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) got[i] = Bf16BitsToFloat(bits[i]);
    pr.Expect(got, kAtol, kRtol + 4e-3, kRmsBound);
  }
  // Each flash kernel through the kernel API (the backend's kAuto picks one by the sequences'
  // lengths), and kAuto with a workspace budget so small that each sequence is a group of its own.
  std::vector<kernels::MhaPrefillSequence> seqs;
  kernels::MhaPrefillParams p =
      pr.KernelParams(cache, c.bf16_cache, dtables.get(), dq.get(), dkv_b.get(), dout.get(), &seqs);
  cublasHandle_t blas = nullptr;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  using kernels::MhaFlashKernel;
  const std::pair<MhaFlashKernel, size_t> runs[] = {
      {MhaFlashKernel::kRows64, 0}, {MhaFlashKernel::kRows128, 0}, {MhaFlashKernel::kAuto, 1}};
  for (const auto& [flash, budget] : runs) {
    SCOPED_TRACE(::testing::Message() << "kernel API, flash kernel " << static_cast<int>(flash)
                                      << ", budget " << budget);
    p.flash = flash;
    p.workspace_budget = budget;
    DeviceArray<uint8_t> ws(kernels::MhaPrefillWorkspaceBytes(p));
    p.workspace = ws.get();
    p.workspace_bytes = ws.size();
    dout.Poison();
    DEEPINFER_CUDA_OK(kernels::MhaPrefillBf16(p, blas, nullptr));
    DEEPINFER_CUDA_OK(dout.Download(&got));
    pr.Expect(got, kAtol, kRtol, kRmsBound);
  }
  cublasDestroy(blas);
}

INSTANTIATE_TEST_SUITE_P(Cases, MhaPrefillTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// The kernel API refuses what it does not take; the backend declines (false) where it has no
// path and reports spans that do not tile the tokens.
TEST(MhaPrefillLimitsTest, RejectsBadParamsAndSpans) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Problem pr(2, 16, {{3, 20}, {0, 9}}, true, 7);
  std::vector<uint16_t> cache_bits(pr.cache.size());
  for (size_t i = 0; i < cache_bits.size(); ++i) cache_bits[i] = FloatToBf16Bits(pr.cache[i]);
  DeviceArray<uint16_t> dcache(cache_bits), dkv_b(pr.kv_b);
  DeviceArray<float> dq(pr.q), dout(pr.want.size());
  DeviceArray<int32_t> dtables(pr.tables);

  std::vector<kernels::MhaPrefillSequence> seqs;
  kernels::MhaPrefillParams p = pr.KernelParams(dcache.get(), /*cache_bf16=*/true, dtables.get(),
                                                dq.get(), dkv_b.get(), dout.get(), &seqs);
  cublasHandle_t blas = nullptr;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  const size_t bytes = kernels::MhaPrefillWorkspaceBytes(p);
  ASSERT_GT(bytes, 0u);
  DeviceArray<uint8_t> ws(bytes);
  ws.Poison();  // the kernels overwrite what they read
  p.workspace = ws.get();
  p.workspace_bytes = bytes;
  if (kernels::MhaPrefillSupported(p)) {
    dout.Poison();
    DEEPINFER_CUDA_OK(kernels::MhaPrefillBf16(p, blas, nullptr));
    std::vector<float> got;
    DEEPINFER_CUDA_OK(dout.Download(&got));
    pr.Expect(got, kAtol, kRtol, kRmsBound);
    p.workspace_bytes = bytes - 1;
    EXPECT_EQ(kernels::MhaPrefillBf16(p, blas, nullptr), cudaErrorInvalidValue);
    p.workspace_bytes = bytes;
    // The 128-row kernel through the kernel API too.
    p.flash = kernels::MhaFlashKernel::kRows128;
    dout.Poison();
    DEEPINFER_CUDA_OK(kernels::MhaPrefillBf16(p, blas, nullptr));
    DEEPINFER_CUDA_OK(dout.Download(&got));
    pr.Expect(got, kAtol, kRtol, kRmsBound);
    // expand_only (benchmarks) runs no attention: the output stays poisoned.
    p.expand_only = true;
    dout.Poison();
    DEEPINFER_CUDA_OK(kernels::MhaPrefillBf16(p, blas, nullptr));
    DEEPINFER_CUDA_OK(dout.Download(&got));
    EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float x) { return std::isnan(x); }));
    p.expand_only = false;
    p.flash = kernels::MhaFlashKernel::kAuto;

    // The expansion hook: declining (cudaErrorNotSupported) leaves the GEMM to cublasGemmEx;
    // one that runs the GEMM from the descriptor alone (here with cublasGemmEx, row-major kv =
    // entries . kv_b^T) replaces it, once per group; its errors fail the op.
    int calls = 0;
    p.expand_gemm = [&calls](const kernels::MhaExpandGemm&, cudaStream_t) {
      ++calls;
      return cudaErrorNotSupported;
    };
    dout.Poison();
    DEEPINFER_CUDA_OK(kernels::MhaPrefillBf16(p, blas, nullptr));
    DEEPINFER_CUDA_OK(dout.Download(&got));
    pr.Expect(got, kAtol, kRtol, kRmsBound);
    EXPECT_EQ(calls, 1);
    int64_t keys = 0;
    for (const kernels::MhaPrefillSequence& s : seqs) keys += s.context_len;
    calls = 0;
    int64_t expanded = 0;  // keys over all calls (a group's each)
    p.expand_gemm = [&](const kernels::MhaExpandGemm& g, cudaStream_t stream) {
      ++calls;
      expanded += g.keys;
      EXPECT_EQ(g.kv_width, static_cast<int64_t>(pr.heads) * (kNope + kV));
      EXPECT_EQ(g.latent_dim, kLatent);
      EXPECT_EQ(g.entries_stride, kLatent + kRope);
      EXPECT_EQ(g.kv_b, p.kv_b);
      const float one = 1.0f, zero = 0.0f;
      if (cublasSetStream(blas, stream) != CUBLAS_STATUS_SUCCESS ||
          cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(g.kv_width),
                       static_cast<int>(g.keys), static_cast<int>(g.latent_dim), &one, g.kv_b,
                       CUDA_R_16BF, static_cast<int>(g.latent_dim), g.entries, CUDA_R_16BF,
                       static_cast<int>(g.entries_stride), &zero, g.kv, CUDA_R_16BF,
                       static_cast<int>(g.kv_width), CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
        return cudaErrorUnknown;
      }
      return cudaSuccess;
    };
    ws.Poison();  // the hook must write every expanded key
    dout.Poison();
    DEEPINFER_CUDA_OK(kernels::MhaPrefillBf16(p, blas, nullptr));
    DEEPINFER_CUDA_OK(dout.Download(&got));
    pr.Expect(got, kAtol, kRtol, kRmsBound);
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(expanded, keys);
    // A budget below one sequence's keys: a group per sequence, a smaller workspace.
    p.workspace_budget = 1;
    const size_t small = kernels::MhaPrefillWorkspaceBytes(p);
    EXPECT_GT(small, 0u);
    EXPECT_LT(small, bytes);
    calls = 0;
    expanded = 0;
    dout.Poison();
    DEEPINFER_CUDA_OK(kernels::MhaPrefillBf16(p, blas, nullptr));
    DEEPINFER_CUDA_OK(dout.Download(&got));
    pr.Expect(got, kAtol, kRtol, kRmsBound);
    EXPECT_EQ(calls, 2);
    EXPECT_EQ(expanded, keys);
    p.workspace_budget = 0;
    p.expand_gemm = [](const kernels::MhaExpandGemm&, cudaStream_t) {
      return cudaErrorInvalidDevice;
    };
    EXPECT_EQ(kernels::MhaPrefillBf16(p, blas, nullptr), cudaErrorInvalidDevice);
    DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
    p.expand_gemm = nullptr;
  }
  kernels::MhaPrefillParams bad = p;
  bad.v_dim = 64;  // the kernel is written for 128
  EXPECT_FALSE(kernels::MhaPrefillSupported(bad));
  EXPECT_EQ(kernels::MhaPrefillBf16(bad, blas, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.out_bf16 = reinterpret_cast<uint16_t*>(dout.get());  // both outputs
  EXPECT_EQ(kernels::MhaPrefillBf16(bad, blas, nullptr), cudaErrorInvalidValue);
  std::vector<kernels::MhaPrefillSequence> long_seqs = seqs;
  long_seqs[1].num_tokens = long_seqs[1].context_len + 1;  // more new tokens than context
  bad = p;
  bad.sequences = long_seqs.data();
  EXPECT_EQ(kernels::MhaPrefillBf16(bad, blas, nullptr), cudaErrorInvalidValue);
  cublasDestroy(blas);

  auto gpu_or = CudaBackend::Create(0, WeightDType::kBFloat16);
  ASSERT_TRUE(gpu_or.ok()) << gpu_or.status();
  CudaBackend& gpu = **gpu_or;
  MhaPrefillArgs a = pr.Args(dcache.get(), WeightDType::kBFloat16, dtables.get(), dq.get(),
                             dkv_b.get(), pr.spans.data());
  a.out = dout.get();
  MhaPrefillArgs fp32_w = a;
  fp32_w.kv_b = WeightView(reinterpret_cast<const float*>(dkv_b.get()));
  EXPECT_FALSE(gpu.MhaPrefillAttention(fp32_w));  // no fp32-weight path: the caller goes absorbed
  std::vector<MlaSequenceSpan> gap = pr.spans;
  gap[1].first_token += 1;
  a.sequences = gap.data();
  EXPECT_TRUE(gpu.MhaPrefillAttention(a));
  EXPECT_NE(gpu.status().message().find("CudaBackend::MhaPrefillAttention: sequence 1"),
            absl::string_view::npos)
      << gpu.status();
}

}  // namespace
}  // namespace deepinfer
