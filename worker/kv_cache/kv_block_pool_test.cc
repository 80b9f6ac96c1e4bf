// Tests for KvBlockPool: allocation accounting, exhaustion, double free, layer views.
#include "worker/kv_cache/kv_block_pool.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

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
  EXPECT_EQ(*ResolveKvCacheDType("fp8", WeightDType::kBFloat16), WeightDType::kFp8E4M3);
  EXPECT_EQ(*ResolveKvCacheDType("float8_e4m3", WeightDType::kFloat32), WeightDType::kFp8E4M3);
  const auto bad = ResolveKvCacheDType("int4", WeightDType::kFloat32);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'int4'"), std::string::npos);
}

TEST(KvBlockPoolTest, Fp8EntriesCountTheirRealBytes) {
  CpuBackend be(1);
  // Latent 6 e4m3 bytes, rope 2 bf16 at offset 8, the scale at 12: 16 bytes an entry.
  const KvBlockPoolOptions o = Latent(3, 2, 4, 6, 2, WeightDType::kFp8E4M3);
  EXPECT_EQ(o.spec.groups[0].EntryBytes(), 16);
  auto pool = KvBlockPool::Create(&be, o);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const PagedLatentCacheView v = (*pool)->LayerView(2);
  EXPECT_EQ(v.dtype, WeightDType::kFp8E4M3);
  EXPECT_EQ(v.entry_bytes(), 16u);
  // Blocks read out carry the real bytes: 2 blocks x 3 layers x 4 tokens x 16 bytes.
  auto blocks = (*pool)->Allocate(2);
  ASSERT_TRUE(blocks.ok());
  auto bytes = (*pool)->ReadBlocks(*blocks);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->size(), 2u * 3 * 4 * 16);
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
  // A sequence whose key block stays allocated (cached for other sequences) gives its slot back
  // explicitly; the block then binds a fresh one.
  p.ReleaseSequenceSlot((*b)[0]);
  p.ReleaseSequenceSlot((*b)[0]);  // nothing bound: no-op
  auto d = p.Allocate(1);
  ASSERT_TRUE(d.ok());
  auto sd = p.SequenceSlot((*d)[0], &fresh);
  ASSERT_TRUE(sd.ok()) << sd.status();
  EXPECT_EQ(*sd, *sb);
  EXPECT_EQ(p.SequenceSlot((*b)[0]).status().code(), absl::StatusCode::kResourceExhausted);
}

// ReadBlocks / WriteBlocks move every paged stream of the blocks (a CSA layer's compressed and
// indexer streams, an HCA layer's stream, nothing of a sliding layer) into other blocks: each
// float is tagged with its layer, stream and element, and must land at the same element of
// the other blocks.
TEST(KvBlockPoolTest, BlocksReadOutAndWrittenIntoOthers) {
  CpuBackend backend(1);
  KvCacheGroupSpec sliding, hca, csa;
  sliding.kind = KvCacheKind::kSlidingWindow;
  sliding.layers = {0};
  sliding.head_dim = 4;
  sliding.window = 2;
  hca = sliding;
  hca.kind = KvCacheKind::kCompressed;
  hca.layers = {1};
  hca.ratio = 8;  // P = 4 * 4 / 8 = 2 floats per block
  csa = hca;
  csa.kind = KvCacheKind::kCompressedSparse;
  csa.layers = {2};
  csa.ratio = 2;  // 8 compressed + 4 indexer floats per block
  csa.index_dim = 2;
  const int32_t kBlocks = 6, kBs = 4;
  auto pool = KvBlockPool::Create(&backend, {KvCacheSpec{{sliding, hca, csa}}, kBlocks, kBs});
  ASSERT_TRUE(pool.ok()) << pool.status();
  KvBlockPool& p = **pool;
  // Layer 1: one region of 2 floats a block; layer 2: 8, then 4 (after all blocks' 8).
  struct Region {
    int32_t layer;
    int64_t base, per_block;
  };
  const std::vector<Region> regions = {{1, 0, 2}, {2, 0, 8}, {2, 8 * kBlocks, 4}};
  auto tag = [](const Region& r, int64_t element) {
    return static_cast<float>(1000 * r.layer + 100 * (r.base > 0) + element);
  };
  auto a = p.Allocate(2), b = p.Allocate(2);
  ASSERT_TRUE(a.ok() && b.ok());
  for (const Region& r : regions) {
    float* data = static_cast<float*>(p.LayerData(r.layer)) + r.base;
    for (size_t i = 0; i < a->size(); ++i) {
      for (int64_t e = 0; e < r.per_block; ++e) {
        data[(*a)[i] * r.per_block + e] = tag(r, static_cast<int64_t>(i) * r.per_block + e);
      }
    }
  }
  auto bytes = p.ReadBlocks(*a);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->size(), 2u * (2 + 8 + 4) * sizeof(float));
  ASSERT_TRUE(p.WriteBlocks(*b, *bytes).ok());
  for (const Region& r : regions) {
    const float* data = static_cast<const float*>(p.LayerData(r.layer)) + r.base;
    for (size_t i = 0; i < b->size(); ++i) {
      for (int64_t e = 0; e < r.per_block; ++e) {
        EXPECT_EQ(data[(*b)[i] * r.per_block + e],
                  tag(r, static_cast<int64_t>(i) * r.per_block + e))
            << "layer " << r.layer << " block " << i << " element " << e;
      }
    }
  }
  // Errors: a free block, bytes for another number of blocks.
  EXPECT_EQ(p.ReadBlocks({5}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.WriteBlocks({(*b)[0]}, *bytes).code(), absl::StatusCode::kInvalidArgument);
  // One block through ReadBlock / WriteBlock (the prefix cache's tiers): the same bytes as
  // ReadBlocks of that block, written back at the same elements of another.
  for (const Region& r : regions) {
    float* data = static_cast<float*>(p.LayerData(r.layer)) + r.base;
    for (int32_t blk : *b) std::fill(data + blk * r.per_block, data + (blk + 1) * r.per_block, 0.f);
  }
  for (size_t i = 0; i < a->size(); ++i) {
    std::string one;
    p.ReadBlock((*a)[i], &one);
    auto want = p.ReadBlocks({(*a)[i]});
    ASSERT_TRUE(want.ok());
    ASSERT_EQ(one.size(), p.BlockBytes());
    EXPECT_EQ(std::vector<char>(one.begin(), one.end()), *want) << "block " << i;
    p.WriteBlock((*b)[i], one);
  }
  for (const Region& r : regions) {
    const float* data = static_cast<const float*>(p.LayerData(r.layer)) + r.base;
    for (size_t i = 0; i < b->size(); ++i) {
      for (int64_t e = 0; e < r.per_block; ++e) {
        EXPECT_EQ(data[(*b)[i] * r.per_block + e],
                  tag(r, static_cast<int64_t>(i) * r.per_block + e))
            << "WriteBlock: layer " << r.layer << " block " << i << " element " << e;
      }
    }
  }
  ASSERT_TRUE(p.Free(*a).ok());
  EXPECT_EQ(p.WriteBlocks(*a, *bytes).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deepinfer
