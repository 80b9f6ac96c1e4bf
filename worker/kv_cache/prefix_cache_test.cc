// Tests for PrefixCache: hits and misses, the partial last block, the cache key, references
// shared between sequences, LRU eviction under memory pressure, duplicates, disabled caching,
// units of several blocks (DeepSeek-V4 entries spanning blocks) and the tiers.
#include "worker/kv_cache/prefix_cache.h"

#include <filesystem>
#include <numeric>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int32_t kBlock = 4;

class PrefixCacheTest : public ::testing::Test {
 protected:
  std::unique_ptr<KvBlockPool> MakePool(int32_t blocks) {
    auto pool = KvBlockPool::Create(
        &backend_, {PagedLatentSpec(1, 8, 4, WeightDType::kFloat32), blocks, kBlock});
    EXPECT_TRUE(pool.ok()) << pool.status();
    return std::move(*pool);
  }

  // What the engine does for a sequence that computed all of `tokens`: new blocks for what the
  // cache did not have, every full block registered. Returns the sequence's blocks.
  static std::vector<int32_t> Compute(PrefixCache& cache, const std::vector<int32_t>& tokens,
                                      int32_t* hit_blocks = nullptr) {
    std::vector<uint64_t> hashes;
    cache.ExtendHashes(tokens, static_cast<int64_t>(tokens.size()), &hashes);
    std::vector<int32_t> blocks =
        cache.Acquire(tokens, hashes, static_cast<int64_t>(tokens.size()) - 1);
    const int32_t hit = static_cast<int32_t>(blocks.size());
    if (hit_blocks != nullptr) *hit_blocks = hit;
    const int32_t need = static_cast<int32_t>((tokens.size() + kBlock - 1) / kBlock) -
                         static_cast<int32_t>(blocks.size());
    auto more = cache.Allocate(need);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok()) return blocks;
    blocks.insert(blocks.end(), more->begin(), more->end());
    cache.RegisterComputed(blocks, tokens, static_cast<int64_t>(tokens.size()), hit, &hashes);
    return blocks;
  }

  // A DeepSeek-V4 cache of blocks of kBlock positions: a sliding layer, an HCA layer of
  // `hca_ratio` and a CSA layer of ratio 4.
  std::unique_ptr<KvBlockPool> MakeV4Pool(int32_t blocks, int32_t hca_ratio) {
    KvCacheGroupSpec sliding, hca, csa;
    sliding.kind = KvCacheKind::kSlidingWindow;
    sliding.layers = {0};
    sliding.head_dim = 8;
    sliding.window = 4;
    hca = sliding;
    hca.kind = KvCacheKind::kCompressed;
    hca.layers = {1};
    hca.ratio = hca_ratio;
    csa = sliding;
    csa.kind = KvCacheKind::kCompressedSparse;
    csa.layers = {2};
    csa.ratio = 4;
    csa.index_dim = 4;
    auto pool = KvBlockPool::Create(&backend_, {KvCacheSpec{{sliding, hca, csa}}, blocks, kBlock});
    EXPECT_TRUE(pool.ok()) << pool.status();
    return std::move(*pool);
  }

  static std::vector<int32_t> Range(int32_t from, int32_t n) {
    std::vector<int32_t> v(n);
    std::iota(v.begin(), v.end(), from);
    return v;
  }

  CpuBackend backend_{1};
};

TEST_F(PrefixCacheTest, HitsFullBlocksOfACommonPrefixOnly) {
  auto pool = MakePool(16);
  PrefixCache cache(pool.get(), {true, "model"});
  ASSERT_TRUE(cache.enabled());
  // 3 full blocks and a partial one of 2 tokens.
  const std::vector<int32_t> a = Range(100, 14);
  int32_t hits = -1;
  std::vector<int32_t> blocks_a = Compute(cache, a, &hits);
  EXPECT_EQ(hits, 0);                       // an empty cache misses
  EXPECT_EQ(cache.num_cached_blocks(), 3);  // the partial last block is not cached
  cache.Release(blocks_a);
  EXPECT_EQ(cache.num_referenced_blocks(), 0);
  EXPECT_EQ(cache.num_idle_blocks(), 3);
  EXPECT_EQ(pool->num_free_blocks(), 13);  // the partial block went back to the pool
  EXPECT_EQ(cache.num_available_blocks(), 16);

  // Same first 2 blocks, then a different token in block 3: 2 blocks hit.
  std::vector<int32_t> b = a;
  b[9] = 7;
  std::vector<int32_t> blocks_b = Compute(cache, b, &hits);
  EXPECT_EQ(hits, 2);
  EXPECT_THAT(std::vector<int32_t>(blocks_b.begin(), blocks_b.begin() + 2),
              ElementsAre(blocks_a[0], blocks_a[1]));
  cache.Release(blocks_b);

  // A prompt exactly 3 blocks long that is fully cached keeps its last block to compute (at
  // least one token must be computed for logits): 2 hits.
  const std::vector<int32_t> whole(a.begin(), a.begin() + 12);
  std::vector<int32_t> blocks_w = Compute(cache, whole, &hits);
  EXPECT_EQ(hits, 2);
  cache.Release(blocks_w);
  // One token more: all 3 hit.
  const std::vector<int32_t> longer(a.begin(), a.begin() + 13);
  std::vector<int32_t> blocks_l = Compute(cache, longer, &hits);
  EXPECT_EQ(hits, 3);
  cache.Release(blocks_l);

  // A different first token misses everything, though later blocks repeat a's tokens.
  std::vector<int32_t> c = a;
  c[0] = 1;
  std::vector<int32_t> blocks_c = Compute(cache, c, &hits);
  EXPECT_EQ(hits, 0);
  cache.Release(blocks_c);
  EXPECT_EQ(cache.num_referenced_blocks(), 0);
  EXPECT_EQ(cache.stats().lookups, 5);
  EXPECT_EQ(cache.stats().hit_blocks, 2 + 2 + 3);
}

TEST_F(PrefixCacheTest, KeyIsPartOfTheHash) {
  auto pool = MakePool(8);
  const std::vector<int32_t> t = Range(5, 9);
  std::vector<uint64_t> h1, h2;
  {
    PrefixCache one(pool.get(), {true, "model-a|float32"});
    one.ExtendHashes(t, 9, &h1);
  }
  PrefixCache two(pool.get(), {true, "model-a|bfloat16"});
  two.ExtendHashes(t, 9, &h2);
  ASSERT_EQ(h1.size(), 2u);
  ASSERT_EQ(h2.size(), 2u);
  EXPECT_NE(h1[0], h2[0]);
  EXPECT_NE(h1[1], h2[1]);
  // A block's hash depends on its parent as well as its tokens.
  EXPECT_NE(PrefixBlockHash(1, t.data(), kBlock), PrefixBlockHash(2, t.data(), kBlock));
  EXPECT_NE(PrefixBlockHash(1, t.data(), kBlock), PrefixBlockHash(1, t.data() + 1, kBlock));
  // Hashes already there are kept; more tokens add the blocks they complete.
  std::vector<uint64_t> grown = {h2[0]};
  two.ExtendHashes(t, 9, &grown);
  EXPECT_EQ(grown, h2);
}

TEST_F(PrefixCacheTest, ConcurrentSequencesShareReferencedBlocks) {
  auto pool = MakePool(8);
  PrefixCache cache(pool.get(), {true, "m"});
  const std::vector<int32_t> p = Range(1, 9);  // 2 full blocks + 1 token
  std::vector<int32_t> a = Compute(cache, p);
  int32_t hits = 0;
  std::vector<int32_t> b = Compute(cache, p, &hits);  // while a still holds its blocks
  EXPECT_EQ(hits, 2);
  EXPECT_EQ(b[0], a[0]);
  EXPECT_EQ(b[1], a[1]);
  EXPECT_NE(b[2], a[2]);  // each has its own partial block
  EXPECT_EQ(cache.num_referenced_blocks(), 4);
  EXPECT_EQ(cache.num_available_blocks(), 4);
  cache.Release(a);
  // Still referenced by b: neither idle nor available.
  EXPECT_EQ(cache.num_idle_blocks(), 0);
  EXPECT_EQ(cache.num_referenced_blocks(), 3);
  EXPECT_EQ(cache.num_available_blocks(), 5);
  cache.Release(b);
  EXPECT_EQ(cache.num_idle_blocks(), 2);
  EXPECT_EQ(cache.num_available_blocks(), 8);
}

TEST_F(PrefixCacheTest, EvictsLeastRecentlyReleasedTailFirst) {
  auto pool = MakePool(6);
  PrefixCache cache(pool.get(), {true, "m"});
  const std::vector<int32_t> x = Range(10, 8), y = Range(50, 8), z = Range(90, 8);
  std::vector<int32_t> bx = Compute(cache, x);
  std::vector<int32_t> by = Compute(cache, y);
  cache.Release(bx);  // idle: x1, x0
  cache.Release(by);  // idle: x1, x0, y1, y0
  EXPECT_EQ(pool->num_free_blocks(), 2);
  // Touching x makes it the most recently released: idle y1, y0, x1, x0.
  int32_t hits = 0;
  cache.Release(Compute(cache, Range(10, 9), &hits));
  EXPECT_EQ(hits, 2);
  EXPECT_EQ(pool->num_free_blocks(), 2);  // x's new partial block went back
  // z needs 2 blocks: the 2 free ones, nothing evicted.
  std::vector<int32_t> bz = Compute(cache, z);
  EXPECT_EQ(cache.stats().evictions, 0);
  // One block more than is free: y's tail goes first, then its head.
  auto one = cache.Allocate(1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)[0], by[1]);
  auto two = cache.Allocate(1);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ((*two)[0], by[0]);
  EXPECT_EQ(cache.stats().evictions, 2);
  cache.Release(*one);
  cache.Release(*two);
  EXPECT_EQ(pool->num_free_blocks(), 2);  // not cached: straight back to the pool
  // x survived; y is gone.
  cache.Release(Compute(cache, Range(10, 9), &hits));
  EXPECT_EQ(hits, 2);
  cache.Release(Compute(cache, Range(50, 9), &hits));
  EXPECT_EQ(hits, 0);
  // z holds 2 blocks; 4 are available (free or idle). Asking for 5 takes nothing.
  EXPECT_EQ(cache.num_available_blocks(), 4);
  const int32_t idle = cache.num_idle_blocks();
  auto five = cache.Allocate(5);
  EXPECT_EQ(five.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache.num_idle_blocks(), idle);
  EXPECT_EQ(cache.num_available_blocks(), 4);
  cache.Release(bz);
  EXPECT_EQ(cache.num_referenced_blocks(), 0);
}

TEST_F(PrefixCacheTest, DuplicateBlockStaysPrivate) {
  auto pool = MakePool(8);
  PrefixCache cache(pool.get(), {true, "m"});
  const std::vector<int32_t> p = Range(1, 4);
  std::vector<uint64_t> h;
  cache.ExtendHashes(p, 4, &h);
  // Two sequences computed the same block at the same time (neither could hit the other).
  auto a = cache.Allocate(1);
  auto b = cache.Allocate(1);
  ASSERT_TRUE(a.ok() && b.ok());
  cache.Register((*a)[0], h[0], cache.root_hash(), p.data(), h[0]);
  cache.Register((*b)[0], h[0], cache.root_hash(), p.data(), h[0]);
  EXPECT_EQ(cache.stats().duplicates, 1);
  EXPECT_EQ(cache.num_cached_blocks(), 1);
  cache.Release(*b);
  EXPECT_EQ(pool->num_free_blocks(), 7);  // b was not cached: back to the pool
  cache.Release(*a);
  EXPECT_EQ(cache.num_idle_blocks(), 1);
  EXPECT_THAT(cache.Acquire(p, h, 4), ElementsAre((*a)[0]));
  cache.Release({(*a)[0]});
}

TEST_F(PrefixCacheTest, DisabledCachesNothing) {
  auto pool = MakePool(8);
  PrefixCache cache(pool.get(), {false, "m"});
  EXPECT_FALSE(cache.enabled());
  const std::vector<int32_t> p = Range(1, 9);
  std::vector<int32_t> a = Compute(cache, p);
  EXPECT_EQ(cache.num_cached_blocks(), 0);
  cache.Release(a);
  EXPECT_EQ(pool->num_free_blocks(), 8);
  int32_t hits = -1;
  cache.Release(Compute(cache, p, &hits));
  EXPECT_EQ(hits, 0);
  EXPECT_THAT(cache.Acquire(p, {1, 2}, 8), IsEmpty());
}

// A block evicted from the pool goes to the store; the next sequence with the prefix gets a new
// block holding the same entries (a host-tier hit after device eviction).
TEST_F(PrefixCacheTest, EvictedBlocksComeBackFromTheStore) {
  auto pool = MakePool(4);
  KvBlockStore store({1 << 20, "", 0});
  PrefixCache cache(pool.get(), {true, "model", &store});
  const std::vector<int32_t> a = Range(100, 9);  // 2 full blocks and 1 token
  std::vector<int32_t> blocks = Compute(cache, a);
  // Entries the "model" wrote: a pattern per block.
  std::vector<std::string> written(2);
  for (int i = 0; i < 2; ++i) {
    written[i] = std::string(pool->BlockBytes(), static_cast<char>(0));
    for (size_t j = 0; j < written[i].size(); ++j) written[i][j] = static_cast<char>(j * 3 + i);
    pool->WriteBlock(blocks[i], written[i]);
  }
  cache.Release(blocks);
  // Another sequence takes the whole pool: both cached blocks are evicted, to the store.
  auto all = cache.Allocate(4);
  ASSERT_TRUE(all.ok()) << all.status();
  for (int32_t b : *all) pool->WriteBlock(b, std::string(pool->BlockBytes(), 'x'));
  EXPECT_EQ(cache.stats().evictions, 2);
  EXPECT_EQ(cache.stats().spilled, 2);
  EXPECT_EQ(cache.num_cached_blocks(), 0);
  cache.Release(*all);

  int32_t hits = -1;
  std::vector<int32_t> again = Compute(cache, a, &hits);
  EXPECT_EQ(hits, 2);
  EXPECT_EQ(cache.stats().restored, 2);
  EXPECT_EQ(store.stats().host_hits, 2);
  for (int i = 0; i < 2; ++i) {
    std::string got;
    pool->ReadBlock(again[i], &got);
    EXPECT_EQ(got, written[i]) << "block " << i;
  }
  EXPECT_EQ(cache.num_cached_blocks(), 2);
  cache.Release(again);
}

// Restoring stops while it would leave no block for the tokens computed after the hit.
TEST_F(PrefixCacheTest, RestoringLeavesABlockForTheComputedTokens) {
  auto pool = MakePool(3);
  KvBlockStore store({1 << 20, "", 0});
  PrefixCache cache(pool.get(), {true, "model", &store});
  const std::vector<int32_t> a = Range(0, 12);  // 3 full blocks
  cache.Release(Compute(cache, a));
  auto all = cache.Allocate(3);  // evicts all three to the store
  ASSERT_TRUE(all.ok());
  cache.Release(*all);
  std::vector<uint64_t> hashes;
  cache.ExtendHashes(a, 12, &hashes);
  std::vector<int32_t> got = cache.Acquire(a, hashes, 11);  // at most 2 blocks
  EXPECT_EQ(got.size(), 2u);
  EXPECT_EQ(cache.num_available_blocks(), 1);
  cache.Release(got);
}

// Idle cached blocks left when the cache goes are kept by the store (a group re-formed, or the
// worker shutting down with a disk tier).
TEST_F(PrefixCacheTest, DestroyingTheCacheKeepsIdleBlocksInTheStore) {
  auto pool = MakePool(8);
  KvBlockStore store({1 << 20, "", 0});
  const std::vector<int32_t> a = Range(0, 12);
  {
    PrefixCache cache(pool.get(), {true, "model", &store});
    cache.Release(Compute(cache, a));
  }
  EXPECT_EQ(store.stats().puts, 3);
  PrefixCache cache(pool.get(), {true, "model", &store});
  int32_t hits = -1;
  cache.Release(Compute(cache, a, &hits));
  EXPECT_EQ(hits, 2);  // all but the last token: 2 of the 3 blocks
}

// At worker shutdown only the disk tier outlives the process: a cache destroyed after
// KvBlockStore::BeginShutdown hands its idle blocks to a store with a directory, where a later
// worker's store finds them.
TEST_F(PrefixCacheTest, AtShutdownIdleBlocksReachTheDiskTier) {
  const std::vector<int32_t> a = Range(0, 12);
  const std::string dir = ::testing::TempDir() + "/prefix_cache_shutdown";
  std::filesystem::remove_all(dir);
  int64_t puts_before_shutdown = 0;
  {
    auto pool = MakePool(8);
    KvBlockStore store({1 << 20, dir, 1 << 20});
    {
      PrefixCache cache(pool.get(), {true, "model", &store});
      cache.Release(Compute(cache, a));
      puts_before_shutdown = store.stats().puts;
      store.BeginShutdown();
      EXPECT_EQ(store.capacity_bytes(), 1 << 20);
    }
    EXPECT_EQ(store.stats().puts - puts_before_shutdown, 3);
    store.Flush();
  }
  auto pool = MakePool(8);
  KvBlockStore later({1 << 20, dir, 1 << 20});
  PrefixCache cache(pool.get(), {true, "model", &later});
  int32_t hits = -1;
  cache.Release(Compute(cache, a, &hits));
  EXPECT_EQ(hits, 2);
  EXPECT_EQ(later.stats().disk_hits, 2);
}

// Without a disk tier a cache destroyed at shutdown copies nothing off the pool.
TEST_F(PrefixCacheTest, AtShutdownWithoutADiskTierNothingIsSpilled) {
  auto pool = MakePool(8);
  KvBlockStore store({1 << 20, "", 0});
  {
    PrefixCache cache(pool.get(), {true, "model", &store});
    cache.Release(Compute(cache, Range(0, 12)));
    EXPECT_EQ(cache.num_idle_blocks(), 3);
    EXPECT_GT(store.capacity_bytes(), 0);
    store.BeginShutdown();
    EXPECT_EQ(store.capacity_bytes(), 0);
  }
  EXPECT_EQ(store.stats().puts, 0);
}

TEST_F(PrefixCacheTest, ProbeSummaryHoldsTheCachedProbeBlocks) {
  auto pool = MakePool(16);
  PrefixCache cache(pool.get(), {true, "model"});
  const std::vector<int32_t> a = Range(0, 4 * 5 + 1);  // 5 full blocks: probes 0, 1, 3
  std::vector<int32_t> blocks = Compute(cache, a);
  std::vector<uint64_t> hashes;
  cache.ExtendHashes(a, static_cast<int64_t>(a.size()), &hashes);
  std::vector<uint64_t> want = {hashes[0], hashes[1], hashes[3]};
  EXPECT_THAT(cache.ProbeSummary(10), ::testing::UnorderedElementsAreArray(want));
  // They are what PrefixProbes gives the coordinator for the same tokens.
  std::vector<uint64_t> probes;
  for (const PrefixProbe& p : PrefixProbes(cache.root_hash(), a, kBlock, 5)) {
    probes.push_back(p.hash);
  }
  EXPECT_EQ(probes, want);
  EXPECT_EQ(cache.ProbeSummary(2).size(), 2u);
  cache.Release(blocks);
  EXPECT_THAT(cache.ProbeSummary(10), ::testing::UnorderedElementsAreArray(want));  // idle too
}

// DeepSeek-V4's kinds keep per-sequence state that a hit rebuilds by a bounded replay: their
// blocks are cached as any other. An HCA entry of 8 positions spans two blocks of 4 and is
// written when its window closes, so blocks are registered and hit two at a time.
TEST_F(PrefixCacheTest, EntriesSpanningBlocksAreCachedInWholeUnits) {
  auto pool = MakeV4Pool(32, /*hca_ratio=*/8);
  PrefixCache cache(pool.get(), {true, "v4"});
  ASSERT_TRUE(cache.enabled());
  EXPECT_EQ(pool->spec().EntrySpan(), 8);
  EXPECT_EQ(cache.unit_blocks(), 2);
  EXPECT_EQ(cache.CompleteBlocks(7), 0);
  EXPECT_EQ(cache.CompleteBlocks(8), 2);
  EXPECT_EQ(cache.CompleteBlocks(15), 2);
  EXPECT_EQ(cache.CompleteBlocks(16), 4);

  // 5 full blocks and a token: the first two units are registered, block 4 (half a unit) not.
  const std::vector<int32_t> a = Range(100, 21);
  int32_t hits = -1;
  cache.Release(Compute(cache, a, &hits));
  EXPECT_EQ(hits, 0);
  EXPECT_EQ(cache.num_cached_blocks(), 4);
  // The same tokens hit the two units (max 20 tokens: 5 blocks, whole units: 4).
  cache.Release(Compute(cache, a, &hits));
  EXPECT_EQ(hits, 4);
  // A sequence that leaves `a` in block 3 keeps the first unit only.
  std::vector<int32_t> b = a;
  b[13] = 5;
  cache.Release(Compute(cache, b, &hits));
  EXPECT_EQ(hits, 2);
  EXPECT_EQ(cache.stats().hit_blocks, 6);
}

// The entries of a unit's first block depend on the tokens of its second: a block cached by a
// sequence whose second block differed is not taken, even though its own hash matches.
TEST_F(PrefixCacheTest, AUnitIsTakenOnlyFromTheSequenceThatMatchesAllOfIt) {
  auto pool = MakeV4Pool(32, /*hca_ratio=*/8);
  PrefixCache cache(pool.get(), {true, "v4"});
  const std::vector<int32_t> x = Range(0, 9);  // one unit and a token
  std::vector<int32_t> y = x;
  y[5] = 77;  // same block 0, another block 1
  int32_t hits = -1;
  cache.Release(Compute(cache, x, &hits));
  EXPECT_EQ(cache.num_cached_blocks(), 2);
  cache.Release(Compute(cache, y, &hits));
  EXPECT_EQ(hits, 0);                       // x's block 0 holds the HCA entry of x's tokens 0..7
  EXPECT_EQ(cache.stats().duplicates, 1);   // y's own block 0 stays private
  EXPECT_EQ(cache.num_cached_blocks(), 3);  // y's block 1 is cached
  cache.Release(Compute(cache, y, &hits));
  EXPECT_EQ(hits, 0);  // still x's block 0 for the hash of block 0
  cache.Release(Compute(cache, x, &hits));
  EXPECT_EQ(hits, 2);
}

// Tiers hold single blocks keyed by their own hash: a cache in units of two has none, one in
// units of one (V4 ratios that divide the block size) keeps them.
TEST_F(PrefixCacheTest, TiersOnlyForUnitsOfOneBlock) {
  KvBlockStore store({1 << 20, "", 0});
  {
    auto pool = MakeV4Pool(4, /*hca_ratio=*/8);
    PrefixCache cache(pool.get(), {true, "v4", &store});
    cache.Release(Compute(cache, Range(0, 9)));
    auto all = cache.Allocate(4);  // evicts the cached unit
    ASSERT_TRUE(all.ok());
    cache.Release(*all);
    EXPECT_EQ(cache.stats().evictions, 2);
    EXPECT_EQ(cache.stats().spilled, 0);
  }
  auto pool = MakeV4Pool(4, /*hca_ratio=*/4);
  PrefixCache cache(pool.get(), {true, "v4", &store});
  EXPECT_EQ(cache.unit_blocks(), 1);
  const std::vector<int32_t> a = Range(0, 9);
  std::vector<int32_t> blocks = Compute(cache, a);
  const std::string written(pool->BlockBytes(), 'w');
  pool->WriteBlock(blocks[0], written);
  cache.Release(blocks);
  auto all = cache.Allocate(4);
  ASSERT_TRUE(all.ok());
  cache.Release(*all);
  EXPECT_EQ(cache.stats().spilled, 2);
  int32_t hits = -1;
  std::vector<int32_t> again = Compute(cache, a, &hits);
  EXPECT_EQ(hits, 2);
  std::string got;
  pool->ReadBlock(again[0], &got);
  EXPECT_EQ(got, written);
  cache.Release(again);
}

}  // namespace
}  // namespace deepinfer
