// MlaPrefillBf16, both implementations (cuBLAS and the fused flash kernel), and
// CudaBackend::MlaAttention's choice between it and MlaAttentionF32, against
// CpuBackend::MlaAttention (fp32): one 1024-token prompt, chunked prefill (sequences with earlier
// context, different lengths), block sizes 16, 32 and 64, 16, 20 and 128 heads, equal-shape
// sequences batched into one strided GEMM, forced small query chunks, a bf16 cache, 70 sequences
// (two fused launches), on fresh random data with the outputs and unowned cache blocks poisoned.
// The fused kernel has the same precision contract (bf16 q, keys and P; fp32 sums), so the same
// bounds; its P is rounded before normalisation (O = sum bf16(p) c / l), which moves the error
// by O(u) relative only.
//
// Tolerance: the kernel rounds q, the cached rows and P to bf16 (unit roundoff u = 2^-9), the
// reference does not. With unit-variance inputs and scale 0.0721 the scores have a standard
// deviation of about 1.7; rounding both operands of a 576-term dot product moves a score by about
// scale * sqrt(576 * 2/3) * u ~ 3e-3 (random-walk), which moves an output by that much times
// |c_j - o| (a few units at most), and the rounding of P and C adds about u relative. So outputs
// (magnitude <= ~3) are expected within ~1e-2 of the reference, more in the tail: a row that sees
// two keys with p ~ 1/2 moves by p(1-p) * ds * |c_0 - c_1|, up to ~0.25 * 0.015 * 8 = 0.03 for a
// 5-sigma score error. Measured on the H200 over 8 cases (23M outputs): max 0.022, root mean
// square <= 1.7e-3. So the bound is 4e-2 absolute + 2e-2 relative per element (20u), and 4e-3
// for the root mean square error: a systematic error (a wrong scale, a missed or extra key, a
// mask off by one on the short rows, where one key changes the output by O(1)) exceeds them.
#include "kernels/attention/mla_prefill.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
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
constexpr int32_t kLatent = 512, kRope = 64, kNope = 128;
constexpr float kScale = 0.0721f;

int MaxSharedMemoryPerBlockOptin() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    return 0;
  }
  return bytes;
}

struct Seq {
  int32_t past;    // positions already cached
  int32_t tokens;  // new tokens (queries)
};

// A batch of sequences in a shuffled paged cache, its queries, and the CPU reference output.
struct Problem {
  int32_t heads = 0, block_size = 0, max_blocks = 0, num_blocks = 0;
  std::vector<Seq> seqs;
  std::vector<int32_t> tables, token_seq, context_len;
  std::vector<MlaSequenceSpan> spans;
  std::vector<float> cache, q_latent, q;  // cache: fp32 values (bf16-representable if bf16)
  std::vector<float> want;
  int64_t tokens = 0;

  Problem(int32_t h, int32_t bs, std::vector<Seq> s, bool bf16_cache, uint32_t seed)
      : heads(h), block_size(bs), seqs(std::move(s)) {
    for (const Seq& q : seqs) {
      const int32_t n = (q.past + q.tokens + bs - 1) / bs;
      max_blocks = std::max(max_blocks, n);
      num_blocks += n;
    }
    num_blocks += 3;  // blocks no sequence owns (poisoned on the device: must not be read)
    std::mt19937 gen(seed);
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), gen);
    tables.assign(seqs.size() * max_blocks, 0);
    const int64_t entry = kLatent + kRope;
    cache.assign(static_cast<size_t>(num_blocks) * bs * entry, 0.0f);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    int next = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int32_t len = seqs[i].past + seqs[i].tokens;
      for (int32_t b = 0; b * bs < len; ++b) tables[i * max_blocks + b] = perm[next++];
      for (int32_t p = 0; p < len; ++p) {
        const int64_t slot = tables[i * max_blocks + p / bs] * bs + p % bs;
        for (int64_t e = 0; e < entry; ++e) {
          const float v = normal(gen);
          cache[slot * entry + e] = bf16_cache ? RoundToBf16(v) : v;
        }
      }
      spans.push_back({static_cast<int32_t>(token_seq.size()), seqs[i].tokens, len});
      for (int32_t t = 0; t < seqs[i].tokens; ++t) {
        token_seq.push_back(static_cast<int32_t>(i));
        context_len.push_back(seqs[i].past + t + 1);
      }
    }
    tokens = static_cast<int64_t>(token_seq.size());
    q_latent = testing::RandomFloats(tokens * heads * kLatent, seed + 1);
    q = testing::RandomFloats(tokens * heads * (kNope + kRope), seed + 2);
    CpuBackend cpu(8);
    want.assign(tokens * heads * kLatent, 0.0f);
    MlaAttentionArgs a = Args(cache.data(), tables.data(), token_seq.data(), context_len.data(),
                              q_latent.data(), q.data(), want.data());
    cpu.MlaAttention(a);
  }

  MlaAttentionArgs Args(float* c, const int32_t* t, const int32_t* seq, const int32_t* len,
                        const float* ql, const float* qq, float* out) const {
    MlaAttentionArgs a;
    a.num_tokens = static_cast<int32_t>(tokens);
    a.num_heads = heads;
    a.q_latent = ql;
    a.q_rope = qq + kNope;
    a.q_rope_token_stride = heads * (kNope + kRope);
    a.q_rope_head_stride = kNope + kRope;
    a.cache = {c, block_size, kLatent, kRope};
    a.block_tables = t;
    a.max_blocks_per_seq = max_blocks;
    a.token_seq = seq;
    a.context_len = len;
    a.softmax_scale = kScale;
    a.out_latent = out;
    return a;
  }

  // Rows [t0, t1) of got vs want: per-element bound and root mean square error.
  void Expect(const std::vector<float>& got, int64_t t0, int64_t t1, double atol, double rtol,
              double rms_bound) const {
    const int64_t w = static_cast<int64_t>(heads) * kLatent;
    std::vector<float> g(got.begin() + t0 * w, got.begin() + t1 * w);
    std::vector<float> r(want.begin() + t0 * w, want.begin() + t1 * w);
    EXPECT_TRUE(AllClose(g, r, atol, rtol)) << "tokens " << t0 << ".." << t1;
    double sq = 0, worst = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const double d = static_cast<double>(g[i]) - r[i];
      sq += d * d;
      worst = std::max(worst, std::abs(d));
    }
    const double rms = std::sqrt(sq / std::max<size_t>(g.size(), 1));
    EXPECT_LE(rms, rms_bound) << "tokens " << t0 << ".." << t1;
    std::printf("[mla-prefill] tokens %lld..%lld: max abs error %.3g, rms %.3g\n",
                static_cast<long long>(t0), static_cast<long long>(t1), worst, rms);
  }
};

struct Case {
  std::string name;
  int32_t heads, block_size;
  std::vector<Seq> seqs;
  bool bf16_cache = false;
  int32_t chunk_rows = 0;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class MlaPrefillTest : public ::testing::TestWithParam<Case> {};

TEST_P(MlaPrefillTest, MatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << c.name << " seed " << seed);
  const Problem pr(c.heads, c.block_size, c.seqs, c.bf16_cache, seed);

  std::vector<uint16_t> cache_bits(pr.cache.size());
  for (size_t i = 0; i < cache_bits.size(); ++i) cache_bits[i] = FloatToBf16Bits(pr.cache[i]);
  DeviceArray<float> dcache_f(pr.cache);
  DeviceArray<uint16_t> dcache_b(cache_bits);
  DeviceArray<float> dql(pr.q_latent), dq(pr.q), dout(pr.want.size());
  DeviceArray<int32_t> dtables(pr.tables);
  // Blocks no sequence owns hold NaN: reading one would show in the output.
  std::vector<bool> owned(pr.num_blocks, false);
  for (size_t i = 0; i < pr.seqs.size(); ++i) {
    const int32_t len = pr.seqs[i].past + pr.seqs[i].tokens;
    for (int32_t b = 0; b * pr.block_size < len; ++b)
      owned[pr.tables[i * pr.max_blocks + b]] = true;
  }
  const int64_t block_elems = static_cast<int64_t>(pr.block_size) * (kLatent + kRope);
  for (int32_t b = 0; b < pr.num_blocks; ++b) {
    if (owned[b]) continue;
    cudaMemset(dcache_f.get() + b * block_elems, 0xFF, block_elems * sizeof(float));
    cudaMemset(dcache_b.get() + b * block_elems, 0xFF, block_elems * sizeof(uint16_t));
  }
  DEEPINFER_CUDA_OK(cudaDeviceSynchronize());

  std::vector<kernels::MlaPrefillSequence> seqs;
  for (size_t i = 0; i < pr.spans.size(); ++i) {
    seqs.push_back({static_cast<int32_t>(i), pr.spans[i].first_token, pr.spans[i].num_tokens,
                    pr.spans[i].context_len});
  }
  kernels::MlaPrefillParams p;
  p.num_heads = pr.heads;
  p.q_latent = dql.get();
  p.q_rope = dq.get() + kNope;
  p.q_rope_token_stride = pr.heads * (kNope + kRope);
  p.q_rope_head_stride = kNope + kRope;
  p.cache = c.bf16_cache ? static_cast<const void*>(dcache_b.get()) : dcache_f.get();
  p.cache_dtype =
      c.bf16_cache ? kernels::MlaCacheDType::kBFloat16 : kernels::MlaCacheDType::kFloat32;
  p.block_size = pr.block_size;
  p.latent_dim = kLatent;
  p.rope_dim = kRope;
  p.block_tables = dtables.get();
  p.max_blocks_per_seq = pr.max_blocks;
  p.sequences = seqs.data();
  p.num_sequences = static_cast<int32_t>(seqs.size());
  p.softmax_scale = kScale;
  p.out_latent = dout.get();
  p.chunk_rows = c.chunk_rows;

  cublasHandle_t blas = nullptr;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  std::vector<float> got;
  {
    SCOPED_TRACE("cuBLAS, workspace allocated inside");
    p.kernel = kernels::MlaPrefillKernel::kCublas;
    dout.Poison();
    cublasStatus_t bst = CUBLAS_STATUS_SUCCESS;
    DEEPINFER_CUDA_OK(kernels::MlaPrefillBf16(p, blas, nullptr, &bst));
    EXPECT_EQ(bst, CUBLAS_STATUS_SUCCESS);
    DEEPINFER_CUDA_OK(dout.Download(&got));
    pr.Expect(got, 0, pr.tokens, kAtol, kRtol, kRmsBound);
  }
  {
    SCOPED_TRACE("cuBLAS, caller's workspace, poisoned");
    const size_t bytes = kernels::MlaPrefillWorkspaceBytes(p);
    ASSERT_GT(bytes, 0u);
    DeviceArray<uint8_t> ws(bytes);
    ws.Poison();
    p.workspace = ws.get();
    p.workspace_bytes = bytes;
    dout.Poison();
    DEEPINFER_CUDA_OK(kernels::MlaPrefillBf16(p, blas, nullptr));
    DEEPINFER_CUDA_OK(dout.Download(&got));
    pr.Expect(got, 0, pr.tokens, kAtol, kRtol, kRmsBound);
    p.workspace_bytes = bytes - 1;
    EXPECT_EQ(kernels::MlaPrefillBf16(p, blas, nullptr), cudaErrorInvalidValue);
    p.workspace = nullptr;
    p.workspace_bytes = 0;
  }
  {
    // The fused kernel reads the bf16 cache only: for the fp32-cache cases it gets the same
    // values rounded to bf16, which is what the cuBLAS path's gather does, so the bound is the
    // same.
    SCOPED_TRACE("fused");
    p.cache = dcache_b.get();
    p.cache_dtype = kernels::MlaCacheDType::kBFloat16;
    p.kernel = kernels::MlaPrefillKernel::kFused;
    if (!kernels::MlaPrefillFusedSupported(p)) {
      EXPECT_LT(MaxSharedMemoryPerBlockOptin(), 226 * 1024)
          << "the fused kernel should run on a device with this much shared memory";
      std::printf("[mla-prefill] fused kernel not supported on this device: not run\n");
    } else {
      EXPECT_EQ(kernels::MlaPrefillWorkspaceBytes(p), 0u);
      dout.Poison();
      DEEPINFER_CUDA_OK(kernels::MlaPrefillBf16(p, nullptr, nullptr));
      DEEPINFER_CUDA_OK(dout.Download(&got));
      pr.Expect(got, 0, pr.tokens, kAtol, kRtol, kRmsBound);
      // kAuto runs what MlaPrefillUsesFused reports (its rule by shape is in mla_prefill.h):
      // the fused kernel's bits and no workspace, or cuBLAS within the bounds.
      p.kernel = kernels::MlaPrefillKernel::kAuto;
      const bool want_fused = kernels::MlaPrefillUsesFused(p);
      EXPECT_EQ(kernels::MlaPrefillWorkspaceBytes(p) == 0, want_fused);
      dout.Poison();
      DEEPINFER_CUDA_OK(kernels::MlaPrefillBf16(p, blas, nullptr));
      std::vector<float> again;
      DEEPINFER_CUDA_OK(dout.Download(&again));
      if (want_fused) {
        EXPECT_EQ(again, got) << "kAuto should have run the fused kernel (deterministic)";
      } else {
        pr.Expect(again, 0, pr.tokens, kAtol, kRtol, kRmsBound);
      }
    }
  }
  cublasDestroy(blas);
}

std::vector<Case> Cases() {
  std::vector<Case> c;
  c.push_back({"one_prompt_1024_heads16_block16", 16, 16, {{0, 1024}}});
  // Chunked prefill: earlier context, different lengths (one batch each).
  c.push_back({"chunked_3_seqs_heads16_block64", 16, 64, {{0, 200}, {300, 77}, {37, 130}}});
  c.push_back({"chunked_3_seqs_heads16_block16", 16, 16, {{5, 64}, {1000, 96}, {0, 150}}});
  c.push_back({"chunked_heads128_block64", 128, 64, {{0, 100}, {250, 70}}});
  // Equal shapes next to each other: one strided-batched GEMM per chunk.
  c.push_back({"batched_4_equal_heads16", 16, 16, {{40, 90}, {40, 90}, {40, 90}, {40, 90}}});
  c.push_back({"batched_2_equal_heads128_block16", 128, 16, {{0, 64}, {0, 64}, {10, 33}}});
  // Small chunks of queries (33 tokens, 16 heads): many chunks per sequence, ragged last one.
  c.push_back({"small_chunks", 16, 64, {{0, 300}, {300, 300}, {300, 300}}, false, 16 * 33});
  c.push_back({"bf16_cache", 16, 16, {{0, 200}, {123, 77}}, true});
  // Long prompt at 128 heads (half a token per 64-row tile); heads that do not divide 64 (tiles
  // cut tokens anywhere); more sequences than one fused launch takes (64).
  c.push_back({"past100_new300_heads128_block16", 128, 16, {{100, 300}}, true});
  c.push_back({"heads20_block32", 20, 32, {{0, 131}, {65, 64}}, true});
  std::vector<Seq> many;
  for (int i = 0; i < 70; ++i) many.push_back({(i * 37) % 150, 1 + (i * 13) % 40});
  c.push_back({"70_seqs_heads16_block16", 16, 16, many, true});
  return c;
}

INSTANTIATE_TEST_SUITE_P(Cases, MlaPrefillTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

TEST(MlaPrefillLimitsTest, RejectsBadSequences) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  kernels::MlaPrefillSequence s{0, 0, 10, 5};  // more new tokens than context
  kernels::MlaPrefillParams p;
  p.num_heads = 1;
  p.latent_dim = kLatent;
  p.rope_dim = kRope;
  p.block_size = 16;
  p.max_blocks_per_seq = 4;
  p.sequences = &s;
  p.num_sequences = 1;
  EXPECT_EQ(kernels::MlaPrefillBf16(p, nullptr, nullptr), cudaErrorInvalidValue);
  s = {0, 0, 10, 65};  // context beyond the block table
  EXPECT_EQ(kernels::MlaPrefillBf16(p, nullptr, nullptr), cudaErrorInvalidValue);
  s = {0, 0, 10, 20};
  p.latent_dim = 30;  // not a multiple of 8
  EXPECT_EQ(kernels::MlaPrefillBf16(p, nullptr, nullptr), cudaErrorInvalidValue);
  // The fused kernel asked for shapes it does not take: an fp32 cache, latent 256.
  p.latent_dim = kLatent;
  p.kernel = kernels::MlaPrefillKernel::kFused;
  p.cache_dtype = kernels::MlaCacheDType::kFloat32;
  EXPECT_FALSE(kernels::MlaPrefillFusedSupported(p));
  EXPECT_EQ(kernels::MlaPrefillBf16(p, nullptr, nullptr), cudaErrorInvalidValue);
  p.cache_dtype = kernels::MlaCacheDType::kBFloat16;
  p.latent_dim = 256;
  EXPECT_FALSE(kernels::MlaPrefillFusedSupported(p));
  EXPECT_EQ(kernels::MlaPrefillBf16(p, nullptr, nullptr), cudaErrorInvalidValue);
}

// CudaBackend::MlaAttention with host spans: sequences for which UsesTensorCoreAttention holds
// take the tensor-core path (bf16 bound), the others the fp32 kernel (fp32 bound, as in
// mla_attention_test) in runs between them; fp32 weights keep every token on the fp32 kernel.
TEST(CudaBackendMlaAttentionTest, PicksThePathPerSequence) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  // decode | prefill | too few tokens | decode | too little work | tokens after a long past |
  // decode
  // The cache in fp32, and in bf16 (the default with bf16 weights): the backend must hand the
  // tensor-core path and the decode kernel the cache's element type.
  for (bool bf16_cache : {false, true}) {
    SCOPED_TRACE(bf16_cache ? "bf16 cache" : "fp32 cache");
    const Problem pr(16, 16,
                     {{500, 1},
                      {0, 160},
                      {2000, CudaBackend::kMlaPrefillMinTokens - 1},
                      {7, 1},
                      {0, 100},
                      {2048, CudaBackend::kMlaPrefillMinTokens},
                      {3, 1}},
                     bf16_cache, seed);
    std::vector<uint16_t> cache_bits(pr.cache.size());
    for (size_t i = 0; i < cache_bits.size(); ++i) cache_bits[i] = FloatToBf16Bits(pr.cache[i]);
    for (WeightDType dtype : {WeightDType::kBFloat16, WeightDType::kFloat32}) {
      SCOPED_TRACE(WeightDTypeName(dtype));
      auto gpu_or = CudaBackend::Create(0, dtype);
      ASSERT_TRUE(gpu_or.ok()) << gpu_or.status();
      CudaBackend& gpu = **gpu_or;
      DeviceArray<float> dcache(pr.cache), dql(pr.q_latent), dq(pr.q), dout(pr.want.size());
      DeviceArray<int32_t> dtables(pr.tables), dseq(pr.token_seq), dlen(pr.context_len);
      DeviceArray<uint16_t> dcache_b(cache_bits);
      MlaAttentionArgs a = pr.Args(dcache.get(), dtables.get(), dseq.get(), dlen.get(), dql.get(),
                                   dq.get(), dout.get());
      if (bf16_cache) {
        a.cache.cache = dcache_b.get();
        a.cache.dtype = WeightDType::kBFloat16;
      }
      a.sequences = pr.spans.data();
      a.num_sequences = static_cast<int32_t>(pr.spans.size());
      dout.Poison();
      DEEPINFER_CUDA_OK(cudaDeviceSynchronize());  // the backend's stream does not wait for memsets
      gpu.MlaAttention(a);
      gpu.Synchronize();
      ASSERT_TRUE(gpu.status().ok()) << gpu.status();
      std::vector<float> got;
      DEEPINFER_CUDA_OK(dout.Download(&got));
      int64_t on_tensor_cores = 0;
      for (const MlaSequenceSpan& s : pr.spans) {
        const bool tensor_cores = gpu.UsesTensorCoreAttention(s);
        on_tensor_cores += tensor_cores;
        EXPECT_EQ(tensor_cores,
                  dtype == WeightDType::kBFloat16 &&
                      (s.first_token == 1 || s.num_tokens == CudaBackend::kMlaPrefillMinTokens));
        SCOPED_TRACE(::testing::Message() << "span at " << s.first_token << ", " << s.num_tokens
                                          << " tokens, tensor cores " << tensor_cores);
        if (tensor_cores) {
          pr.Expect(got, s.first_token, s.first_token + s.num_tokens, kAtol, kRtol, kRmsBound);
        } else if (bf16_cache) {
          // The bf16-cache decode kernel rounds q and P to bf16 as the tensor-core path does
          // (mla_attention_test): the same bounds.
          pr.Expect(got, s.first_token, s.first_token + s.num_tokens, kAtol, kRtol, kRmsBound);
        } else {
          pr.Expect(got, s.first_token, s.first_token + s.num_tokens, 2e-5, 1e-4, 1e-5);
        }
      }
      EXPECT_EQ(on_tensor_cores, dtype == WeightDType::kBFloat16 ? 2 : 0);
      // Spans that do not tile the tokens are an error naming the op.
      std::vector<MlaSequenceSpan> bad = pr.spans;
      bad[1].first_token += 1;
      a.sequences = bad.data();
      gpu.MlaAttention(a);
      EXPECT_NE(gpu.status().message().find("CudaBackend::MlaAttention: sequence 1"),
                absl::string_view::npos)
          << gpu.status();
    }
  }
}

}  // namespace
}  // namespace deepinfer
