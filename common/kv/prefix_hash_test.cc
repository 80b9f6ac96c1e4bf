// Tests for the chain hashes and probe blocks.
#include "common/kv/prefix_hash.h"

#include <numeric>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

TEST(PrefixHashTest, ProbeBlocksArePowersOfTwoMinusOne) {
  std::vector<int64_t> probes;
  for (int64_t i = 0; i < 40; ++i) {
    if (IsPrefixProbeBlock(i)) probes.push_back(i);
  }
  EXPECT_THAT(probes, ::testing::ElementsAre(0, 1, 3, 7, 15, 31));
  EXPECT_FALSE(IsPrefixProbeBlock(-1));
}

TEST(PrefixHashTest, ProbesFollowTheChainAndStopAtTheLastFullBlock) {
  std::vector<int32_t> tokens(4 * 9 + 2);
  std::iota(tokens.begin(), tokens.end(), 5);
  const uint64_t root = PrefixRootHash("key");
  const std::vector<PrefixProbe> p = PrefixProbes(root, tokens, 4, 100);
  ASSERT_EQ(p.size(), 4u);  // blocks 0, 1, 3, 7 of the 9 full ones
  uint64_t h = root;
  for (int i = 0; i < 8; ++i) h = PrefixBlockHash(h, tokens.data() + 4 * i, 4);
  EXPECT_EQ(p[3].hash, h);
  EXPECT_EQ(p[3].block, 7);
  EXPECT_EQ(PrefixProbes(root, tokens, 4, 3).size(), 2u);  // blocks 0 and 1 of the first 3
  // Another root or one other token early on changes every probe from there.
  EXPECT_NE(PrefixProbes(PrefixRootHash("other"), tokens, 4, 100)[0].hash, p[0].hash);
  tokens[5] += 1;
  const std::vector<PrefixProbe> q = PrefixProbes(root, tokens, 4, 100);
  EXPECT_EQ(q[0].hash, p[0].hash);
  EXPECT_NE(q[1].hash, p[1].hash);
  EXPECT_NE(q[3].hash, p[3].hash);
}

}  // namespace
}  // namespace deepinfer
