// ExpertBalancer: heartbeats feed the window, plans come from it (and improve a skewed load),
// epochs count up, a placement goes only to groups it fits, the automatic interval.
#include "coordinator/expert_balancer.h"

#include "common/eplb/placement_proto.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;

// One heartbeat of `rank` with counts for 1 layer of 8 experts over `steps` steps.
HeartbeatRequest Beat(int rank, int64_t steps, std::vector<int64_t> counts, uint64_t epoch = 0) {
  HeartbeatRequest hb;
  ExpertLoadReport* r = hb.add_expert_loads();
  r->set_rank(rank);
  r->set_group_generation(1);
  r->set_num_steps(steps);
  r->set_num_layers(1);
  r->set_num_experts(static_cast<int>(counts.size()));
  for (int64_t c : counts) r->add_counts(c);
  hb.set_placement_epoch(epoch);
  return hb;
}

ExpertBalancerConfig Config() {
  ExpertBalancerConfig c;
  c.num_logical = 8;
  c.num_groups = 2;
  c.num_redundant = 2;
  c.window_steps = 100;
  return c;
}

TEST(ExpertBalancerTest, NoPlanWithoutStatistics) {
  ExpertBalancer b(Config());
  auto plan = b.PlanFor(PlacementPolicy::kAuto, 2, 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(plan.status())) << plan.status();
}

TEST(ExpertBalancerTest, PlansASkewedWindowBetterThanContiguousAndCountsEpochs) {
  ExpertBalancer b(Config());
  // Experts 0 and 1 (both on rank 0 when contiguous) take almost everything.
  b.OnHeartbeat("w0", Beat(0, 10, {500, 400, 10, 10, 10, 10, 10, 10}));
  b.OnHeartbeat("w1", Beat(1, 10, {500, 400, 10, 10, 10, 10, 10, 10}));
  auto plan = b.PlanFor(PlacementPolicy::kGlobal, 2, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GT(plan->imbalance_before, 1.8);
  EXPECT_LT(plan->imbalance_after, 1.1);
  EXPECT_EQ(plan->placement->num_physical(), 10);
  EXPECT_THAT(plan->report, HasSubstr("window of 10 steps"));
  EXPECT_THAT(plan->report, HasSubstr("experts in order"));
  EXPECT_EQ(b.SpecForGroup(2).layers_size(), 0);  // nothing handed out yet
  EXPECT_EQ(b.Commit(plan->placement), 1u);
  ExpertPlacementSpec spec = b.SpecForGroup(2);
  EXPECT_EQ(spec.epoch(), 1u);
  EXPECT_EQ(*PlacementFromProto(spec), *plan->placement);
  EXPECT_EQ(b.SpecForGroup(4).layers_size(), 0);  // 10 slots do not divide over 4 ranks
  // The next plan compares with the placement now in use.
  auto again = b.PlanFor(PlacementPolicy::kGlobal, 2, 1);
  ASSERT_TRUE(again.ok());
  EXPECT_THAT(again->report, HasSubstr("current placement"));
  EXPECT_LT(again->imbalance_before, 1.1);
  EXPECT_EQ(b.Commit(again->placement), 2u);
}

TEST(ExpertBalancerTest, StatusReportsWindowAndTheOldestRunningEpoch) {
  ExpertBalancer b(Config());
  b.OnHeartbeat("w0", Beat(0, 4, {1, 2, 3, 4, 5, 6, 7, 8}, 3));
  b.OnHeartbeat("w1", Beat(1, 4, {1, 1, 1, 1, 1, 1, 1, 1}, 2));
  GetExpertLoadResponse r;
  b.FillStatus({"w0", "w1"}, &r);
  EXPECT_EQ(r.window_steps(), 100);
  EXPECT_EQ(r.num_steps(), 4);
  EXPECT_EQ(r.num_layers(), 1);
  EXPECT_EQ(r.num_experts(), 8);
  ASSERT_EQ(r.loads_size(), 8);
  EXPECT_EQ(r.loads(7), 9);
  EXPECT_EQ(r.active_epoch(), 2u);
}

TEST(ExpertBalancerTest, AutomaticRebalanceIsDueEveryIntervalOfRankZeroSteps) {
  ExpertBalancerConfig c = Config();
  c.interval_steps = 20;
  ExpertBalancer b(c);
  EXPECT_FALSE(b.AutoRebalanceDue());
  b.OnHeartbeat("w1", Beat(1, 50, {1, 1, 1, 1, 1, 1, 1, 1}));  // rank 1 does not count
  EXPECT_FALSE(b.AutoRebalanceDue());
  b.OnHeartbeat("w0", Beat(0, 15, {1, 1, 1, 1, 1, 1, 1, 1}));
  EXPECT_FALSE(b.AutoRebalanceDue());
  b.OnHeartbeat("w0", Beat(0, 5, {1, 1, 1, 1, 1, 1, 1, 1}));
  EXPECT_TRUE(b.AutoRebalanceDue());
  b.MarkChecked();
  EXPECT_FALSE(b.AutoRebalanceDue());
}

TEST(ExpertBalancerTest, AnInitialPlacementIsEpochOne) {
  ExpertBalancerConfig c = Config();
  auto p = ExpertPlacement::FromPhy2Log({{0, 1, 2, 3, 4, 5, 6, 7, 0, 1}}, 8);
  ASSERT_TRUE(p.ok());
  c.initial = std::make_shared<const ExpertPlacement>(*p);
  ExpertBalancer b(c);
  EXPECT_EQ(b.SpecForGroup(2).epoch(), 1u);
  EXPECT_EQ(b.SpecForGroup(1).layers_size(), 0);  // one rank: no placement
}

}  // namespace
}  // namespace deepinfer
