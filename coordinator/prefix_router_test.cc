// Tests for PrefixRouter: least loaded without a cache key, the rank that reports a prompt's
// prefix, the load threshold, dispatches remembered, and leaders of shared prefixes.
#include "coordinator/prefix_router.h"

#include <numeric>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

constexpr uint64_t kRoot = 77;

// 64 tokens of a "system prompt" `s`, then `q` tokens of a question.
std::vector<int32_t> Prompt(int s, int q) {
  std::vector<int32_t> p(64 + q);
  std::iota(p.begin(), p.begin() + 64, 1000 * s);
  std::iota(p.begin() + 64, p.end(), 500000 + 100 * q);
  return p;
}

RankLoad Report(int rank, const std::vector<std::vector<int32_t>>& held) {
  RankLoad load;
  load.set_rank(rank);
  load.set_prefix_cache_root(kRoot);
  for (const auto& tokens : held) {
    for (const PrefixProbe& p : PrefixProbes(kRoot, tokens, 16, tokens.size() / 16)) {
      load.add_cached_probe_hashes(p.hash);
    }
  }
  return load;
}

TEST(PrefixRouterTest, LeastLoadedUntilARankReportsItsCacheKey) {
  PrefixRouter router({});
  router.Reset(3);
  EXPECT_FALSE(router.active());
  EXPECT_TRUE(router.Probes(Prompt(1, 20)).empty());
  EXPECT_EQ(router.Pick({}, {30, 10, 20}, {true, true, true}), 1);
  EXPECT_EQ(router.Pick({}, {30, 10, 20}, {true, false, true}), 2);
  EXPECT_EQ(router.Pick({}, {30, 10, 20}, {false, false, false}), -1);
}

TEST(PrefixRouterTest, SendsARequestWhereItsPrefixIsCachedUnlessThatRankIsTooLoaded) {
  PrefixRouterOptions options;
  options.load_factor = 1.5;
  options.slack_tokens = 100;
  PrefixRouter router(options);
  router.Reset(2);
  router.UpdateRank(Report(0, {}));
  router.UpdateRank(Report(1, {Prompt(7, 0)}));  // rank 1 holds system prompt 7 (4 blocks)
  ASSERT_TRUE(router.active());
  const std::vector<PrefixProbe> probes = router.Probes(Prompt(7, 30));
  EXPECT_EQ(router.MatchedBlocks(1, probes), 4);
  EXPECT_EQ(router.MatchedBlocks(0, probes), 0);
  EXPECT_EQ(router.Pick(probes, {0, 0}, {true, true}), 1);
  EXPECT_EQ(router.Pick(probes, {1000, 1100}, {true, true}), 1);  // 1100 <= 1.5 x 1000 + 100
  EXPECT_EQ(router.Pick(probes, {1000, 1700}, {true, true}), 0);  // too loaded
  EXPECT_EQ(router.Pick(probes, {0, 0}, {true, false}), 0);       // full
  // Another system prompt: nobody holds it, least loaded.
  EXPECT_EQ(router.Pick(router.Probes(Prompt(8, 30)), {10, 5}, {true, true}), 1);
  EXPECT_EQ(router.Pick(router.Probes(Prompt(8, 30)), {5, 10}, {true, true}), 0);
}

TEST(PrefixRouterTest, RemembersWhereItSentAPrefixAndForgetsItOnANewGroup) {
  PrefixRouter router({});
  router.Reset(2);
  router.UpdateRank(Report(0, {}));
  const std::vector<PrefixProbe> probes = router.Probes(Prompt(3, 17));
  EXPECT_EQ(router.Pick(probes, {5, 0}, {true, true}), 1);
  router.Record(0, probes);
  EXPECT_EQ(router.Pick(probes, {5, 0}, {true, true}), 0);
  // A heartbeat that does not list it does not make the router forget where it went.
  router.UpdateRank(Report(0, {}));
  EXPECT_EQ(router.Pick(probes, {5, 0}, {true, true}), 0);
  router.Reset(2);
  router.UpdateRank(Report(0, {}));
  EXPECT_EQ(router.Pick(probes, {5, 0}, {true, true}), 1);
}

TEST(PrefixRouterTest, RequestsSharingAPrefixWaitForTheirLeader) {
  PrefixRouter router({});
  router.Reset(2);
  router.UpdateRank(Report(0, {}));
  const std::vector<PrefixProbe> first = router.Probes(Prompt(4, 10));
  const std::vector<PrefixProbe> second = router.Probes(Prompt(4, 20));
  const std::vector<PrefixProbe> other = router.Probes(Prompt(5, 20));
  EXPECT_EQ(router.LeaderOf(first), nullptr);
  router.Lead("a", first, 0);
  ASSERT_NE(router.LeaderOf(second), nullptr);
  EXPECT_EQ(*router.LeaderOf(second), "a");
  EXPECT_EQ(router.LeaderOf(other), nullptr);
  // One shared block is not a group.
  std::vector<int32_t> one_block = Prompt(4, 20);
  one_block[20] = -5;
  EXPECT_EQ(router.LeaderOf(router.Probes(one_block)), nullptr);
  EXPECT_THAT(router.leaders(), ::testing::ElementsAre("a"));
  router.EndLead("a");
  EXPECT_EQ(router.LeaderOf(second), nullptr);
  // A request sent where blocks 0..3 are held leads nothing of them.
  router.Lead("c", first, 4);
  EXPECT_EQ(router.LeaderOf(second), nullptr);
  EXPECT_TRUE(router.leaders().empty());
  // A rank that reports the prefix cached ends the wait too.
  router.Lead("b", first, 0);
  router.UpdateRank(Report(1, {Prompt(4, 0)}));
  EXPECT_EQ(router.LeaderOf(second), nullptr);
}

TEST(PrefixRouterTest, DisabledIsLeastLoaded) {
  PrefixRouterOptions options;
  options.enabled = false;
  PrefixRouter router(options);
  router.Reset(2);
  router.UpdateRank(Report(1, {Prompt(7, 0)}));
  const std::vector<PrefixProbe> probes = router.Probes(Prompt(7, 30));
  EXPECT_TRUE(probes.empty());
  EXPECT_EQ(router.Pick(probes, {0, 5}, {true, true}), 0);
}

}  // namespace
}  // namespace deepinfer
