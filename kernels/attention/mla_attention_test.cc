// WriteLatentCacheF32 + MlaAttentionF32 against the CpuBackend ops: three sequences of different
// lengths in shuffled cache blocks, queries that mix prefill (causal) and decode tokens, contexts
// longer than one key chunk, DeepSeek-V3's latent/rope sizes and a small fixture-like shape.
#include "kernels/attention/mla_attention.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::DeviceArray;

struct Shape {
  int32_t heads, latent, rope, nope;
};

class MlaAttentionKernelTest : public ::testing::TestWithParam<Shape> {};

TEST_P(MlaAttentionKernelTest, MatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Shape s = GetParam();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "heads " << s.heads << " latent " << s.latent << " rope "
                                    << s.rope << " seed " << seed);
  CpuBackend cpu(2);
  const int32_t block_size = 16, num_blocks = 64;
  const std::vector<int32_t> seq_len = {1, 21, 300};
  const int32_t max_blocks = (300 + block_size - 1) / block_size;
  std::mt19937 gen(seed);
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), gen);
  std::vector<int32_t> tables(seq_len.size() * max_blocks, 0);
  int next = 0;
  for (size_t q = 0; q < seq_len.size(); ++q) {
    for (int32_t b = 0; b * block_size < seq_len[q]; ++b) tables[q * max_blocks + b] = perm[next++];
  }
  // Every cached token of every sequence is written through WriteLatentCache.
  std::vector<int32_t> slots, token_seq, context_len;
  for (size_t q = 0; q < seq_len.size(); ++q) {
    for (int32_t p = 0; p < seq_len[q]; ++p) {
      slots.push_back(tables[q * max_blocks + p / block_size] * block_size + p % block_size);
      token_seq.push_back(static_cast<int32_t>(q));
      context_len.push_back(p + 1);
    }
  }
  const int64_t tokens = static_cast<int64_t>(slots.size());
  const int64_t entry = s.latent + s.rope;
  const int64_t ld_kv = entry + 3;  // [latent | rope] rows with padding, as from the kv_a GEMM
  auto kv = testing::RandomFloats(tokens * ld_kv, seed + 1);
  const int64_t qk = s.nope + s.rope, qdim = s.heads * qk;
  auto q_latent = testing::RandomFloats(tokens * s.heads * s.latent, seed + 2);
  auto q = testing::RandomFloats(tokens * qdim, seed + 3);
  const float scale = 0.0721f;

  std::vector<float> cache_cpu(num_blocks * block_size * entry, 0.0f);
  PagedLatentCacheView view{cache_cpu.data(), block_size, s.latent, s.rope};
  cpu.WriteLatentCache(tokens, kv.data(), ld_kv, kv.data() + s.latent, ld_kv, slots.data(), view);
  MlaAttentionArgs a;
  a.num_tokens = static_cast<int32_t>(tokens);
  a.num_heads = s.heads;
  a.q_latent = q_latent.data();
  a.q_rope = q.data() + s.nope;
  a.q_rope_token_stride = qdim;
  a.q_rope_head_stride = qk;
  a.cache = view;
  a.block_tables = tables.data();
  a.max_blocks_per_seq = max_blocks;
  a.token_seq = token_seq.data();
  a.context_len = context_len.data();
  a.softmax_scale = scale;
  std::vector<float> want(tokens * s.heads * s.latent);
  a.out_latent = want.data();
  cpu.MlaAttention(a);

  DeviceArray<float> dkv(kv), dql(q_latent), dq(q), dcache(cache_cpu.size()), dout(want.size());
  DeviceArray<int32_t> dslots(slots), dseq(token_seq), dlen(context_len), dtables(tables);
  dcache.Poison();  // never-written slots must not be read
  dout.Poison();
  kernels::PagedLatentCache cache{dcache.get(), block_size, s.latent, s.rope};
  DEEPINFER_CUDA_OK(kernels::WriteLatentCacheF32(tokens, dkv.get(), ld_kv, dkv.get() + s.latent,
                                                 ld_kv, dslots.get(), cache, nullptr));
  std::vector<float> got_cache;
  DEEPINFER_CUDA_OK(dcache.Download(&got_cache));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < entry; ++i) {
      const int64_t at = slots[t] * entry + i;
      ASSERT_EQ(got_cache[at], cache_cpu[at]) << "cache slot " << slots[t] << " element " << i;
    }
  }
  kernels::MlaAttentionParams p;
  p.num_tokens = static_cast<int32_t>(tokens);
  p.num_heads = s.heads;
  p.q_latent = dql.get();
  p.q_rope = dq.get() + s.nope;
  p.q_rope_token_stride = qdim;
  p.q_rope_head_stride = qk;
  p.cache = cache;
  p.block_tables = dtables.get();
  p.max_blocks_per_seq = max_blocks;
  p.token_seq = dseq.get();
  p.context_len = dlen.get();
  p.softmax_scale = scale;
  p.out_latent = dout.get();
  DEEPINFER_CUDA_OK(kernels::MlaAttentionF32(p, nullptr));
  std::vector<float> got;
  DEEPINFER_CUDA_OK(dout.Download(&got));
  // fp32 online softmax vs the reference's double accumulation.
  EXPECT_TRUE(AllClose(got, want, 2e-5, 1e-4));
}

INSTANTIATE_TEST_SUITE_P(Shapes, MlaAttentionKernelTest,
                         ::testing::Values(Shape{4, 512, 64, 128}, Shape{2, 32, 16, 16},
                                           Shape{3, 1024, 64, 8}));

TEST(MlaAttentionKernelLimitsTest, RejectsTooWideLatent) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  kernels::MlaAttentionParams p;
  p.num_tokens = 1;
  p.num_heads = 1;
  p.cache.latent_dim = kernels::kMaxMlaLatentDim + 1;
  EXPECT_EQ(kernels::MlaAttentionF32(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace deepinfer
