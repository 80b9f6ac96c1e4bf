// Tests for KvBlockPool: allocation accounting, exhaustion, double free, layer views.
#include "worker/kv_cache/kv_block_pool.h"

#include <set>

#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

// layers, blocks, block size, latent, rope (fp32 unless `dtype`).
KvBlockPoolOptions Latent(int32_t layers, int32_t blocks, int32_t block_size, int32_t latent,
                          int32_t rope, WeightDType dtype = WeightDType::kFloat32) {
  return {PagedLatentSpec(layers, latent, rope, dtype), blocks, block_size};
}

TEST(KvBlockPoolTest, AllocateFreeAndExhaust) {
  CpuBackend be(1);
  auto pool_or = KvBlockPool::Create(&be, Latent(2, 4, 16, 8, 4));
  ASSERT_TRUE(pool_or.ok()) << pool_or.status();
  KvBlockPool& pool = **pool_or;
  EXPECT_EQ(pool.BlocksFor(0), 0);
  EXPECT_EQ(pool.BlocksFor(16), 1);
  EXPECT_EQ(pool.BlocksFor(17), 2);
  auto a = pool.Allocate(3);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(std::set<int32_t>(a->begin(), a->end()).size(), 3u);
  EXPECT_EQ(pool.num_free_blocks(), 1);
  auto b = pool.Allocate(2);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.num_free_blocks(), 1);  // failed allocation takes nothing
  ASSERT_TRUE(pool.Free({(*a)[0]}).ok());
  EXPECT_EQ(pool.Free({(*a)[0]}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.Free({99}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.num_free_blocks(), 2);
  auto c = pool.Allocate(2);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(pool.num_free_blocks(), 0);
}

TEST(KvBlockPoolTest, LayerViewsAreDistinctAndSized) {
  CpuBackend be(1);
  auto pool = KvBlockPool::Create(&be, Latent(3, 2, 4, 6, 2));
  ASSERT_TRUE(pool.ok());
  auto v0 = (*pool)->LayerView(0), v2 = (*pool)->LayerView(2);
  EXPECT_NE(v0.cache, v2.cache);
  EXPECT_EQ(v0.entry_dim(), 8);
  EXPECT_EQ(v0.block_size, 4);
  // Whole layer is writable (2 blocks * 4 slots * 8 floats).
  EXPECT_EQ(v0.dtype, WeightDType::kFloat32);
  EXPECT_EQ(v0.entry_bytes(), 8u * 4);
  for (int i = 0; i < 2 * 4 * 8; ++i) static_cast<float*>(v2.cache)[i] = 1.0f;
  EXPECT_FALSE(KvBlockPool::Create(&be, Latent(0, 2, 4, 6, 2)).ok());
  EXPECT_FALSE(KvBlockPool::Create(&be, Latent(3, 0, 4, 6, 2)).ok());
}

TEST(KvBlockPoolTest, ResolveKvCacheDType) {
  EXPECT_EQ(*ResolveKvCacheDType("auto", WeightDType::kBFloat16), WeightDType::kBFloat16);
  EXPECT_EQ(*ResolveKvCacheDType("", WeightDType::kFloat32), WeightDType::kFloat32);
  EXPECT_EQ(*ResolveKvCacheDType("float32", WeightDType::kBFloat16), WeightDType::kFloat32);
  EXPECT_EQ(*ResolveKvCacheDType("bf16", WeightDType::kFloat32), WeightDType::kBFloat16);
  const auto bad = ResolveKvCacheDType("fp8", WeightDType::kFloat32);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'fp8'"), std::string::npos);
}

TEST(KvBlockPoolTest, Bf16EntriesTakeTwoBytesPerValue) {
  CpuBackend be(1);
  const KvBlockPoolOptions o = Latent(3, 2, 4, 6, 2, WeightDType::kBFloat16);
  EXPECT_EQ(o.spec.groups[0].EntryBytes(), 8 * 2);
  auto pool = KvBlockPool::Create(&be, o);
  ASSERT_TRUE(pool.ok());
  const PagedLatentCacheView v = (*pool)->LayerView(1);
  EXPECT_EQ(v.dtype, WeightDType::kBFloat16);
  EXPECT_EQ(v.entry_bytes(), 8u * 2);
  for (int i = 0; i < 2 * 4 * 8; ++i) static_cast<uint16_t*>(v.cache)[i] = 0x3f80;  // 1.0
}

// Per-sequence state: a slot is bound to a sequence's first block on first use, kept while the
// block is held, released when it is freed; slots run out with a clear error.
TEST(KvBlockPoolTest, SequenceSlotsFollowTheFirstBlock) {
  CpuBackend backend(1);
  KvCacheGroupSpec g;
  g.kind = KvCacheKind::kSlidingWindow;
  g.layers = {0, 1};
  g.head_dim = 4;
  g.window = 2;
  KvBlockPoolOptions o{KvCacheSpec{{g}}, 8, 4};
  o.max_sequences = 2;
  auto pool = KvBlockPool::Create(&backend, o);
  ASSERT_TRUE(pool.ok()) << pool.status();
  KvBlockPool& p = **pool;
  EXPECT_EQ(p.num_state_slots(), 2);
  auto a = p.Allocate(2), b = p.Allocate(1), c = p.Allocate(1);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  bool fresh = false;
  auto sa = p.SequenceSlot((*a)[0], &fresh);
  ASSERT_TRUE(sa.ok()) << sa.status();
  EXPECT_TRUE(fresh);
  EXPECT_EQ(*p.SequenceSlot((*a)[0], &fresh), *sa);
  EXPECT_FALSE(fresh);
  auto sb = p.SequenceSlot((*b)[0]);
  ASSERT_TRUE(sb.ok());
  EXPECT_NE(*sa, *sb);
  EXPECT_NE(p.SequenceState(1, *sa), p.SequenceState(1, *sb));
  EXPECT_EQ(p.SequenceState(0, *sb) - p.SequenceState(0, *sa), (*sb - *sa) * 2 * 4);
  EXPECT_EQ(p.SequenceSlot((*c)[0]).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(p.Free(*a).ok());
  auto sc = p.SequenceSlot((*c)[0], &fresh);
  ASSERT_TRUE(sc.ok()) << sc.status();
  EXPECT_TRUE(fresh);
  EXPECT_EQ(*sc, *sa);  // the freed sequence's slot
  EXPECT_EQ(p.SequenceSlot((*a)[0]).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deepinfer
