#include "common/eplb/expert_placement.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;

TEST(ExpertPlacementTest, DerivesReplicaTablesFromPhy2Log) {
  // 3 experts in 4 slots; expert 1 twice.
  absl::StatusOr<ExpertPlacement> p = ExpertPlacement::FromPhy2Log({{1, 0, 2, 1}, {0, 1, 2, 2}}, 3);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->num_layers(), 2);
  EXPECT_EQ(p->num_physical(), 4);
  EXPECT_EQ(p->num_logical(), 3);
  EXPECT_EQ(p->logcnt(), (std::vector<std::vector<int>>{{1, 2, 1}, {1, 1, 2}}));
  EXPECT_EQ(p->log2phy()[0], (std::vector<std::vector<int>>{{1}, {0, 3}, {2}}));
  EXPECT_EQ(p->log2phy()[1], (std::vector<std::vector<int>>{{0}, {1}, {2, 3}}));
  EXPECT_EQ(p->max_replicas(), 2);
  EXPECT_EQ(p->GpuOfSlot(0, 2), 0);
  EXPECT_EQ(p->GpuOfSlot(1, 2), 0);
  EXPECT_EQ(p->GpuOfSlot(2, 2), 1);
  EXPECT_EQ(p->GpuOfSlot(3, 4), 3);
}

TEST(ExpertPlacementTest, RejectsMissingExpertsAndBadShapes) {
  absl::Status s = ExpertPlacement::FromPhy2Log({{0, 0, 2}}, 3).status();
  EXPECT_THAT(s.message(), HasSubstr("layer 0: logical expert 1 has no physical slot"));
  s = ExpertPlacement::FromPhy2Log({{0, 1, 3}}, 3).status();
  EXPECT_THAT(s.message(), HasSubstr("slot 2 holds expert 3, outside [0, 3)"));
  s = ExpertPlacement::FromPhy2Log({{0, 1}, {0, 1, 1}}, 2).status();
  EXPECT_THAT(s.message(), HasSubstr("phy2log layer 1 has 3 slots, layer 0 has 2"));
  s = ExpertPlacement::FromPhy2Log({}, 2).status();
  EXPECT_THAT(s.message(), HasSubstr("no layers"));
}

TEST(ExpertPlacementTest, FromTablesKeepsReplicaOrderAndChecksConsistency) {
  // Replicas of expert 1 listed in reverse slot order, padded with -1.
  absl::StatusOr<ExpertPlacement> p =
      ExpertPlacement::FromTables({{1, 0, 2, 1}}, {{{1, -1}, {3, 0}, {2, -1}}}, {{1, 2, 1}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->log2phy()[0], (std::vector<std::vector<int>>{{1}, {3, 0}, {2}}));

  absl::Status s =
      ExpertPlacement::FromTables({{1, 0, 2, 1}}, {{{1, -1}, {0, 3}, {2, -1}}}, {{1, 1, 2}})
          .status();
  EXPECT_THAT(s.message(), HasSubstr("expert 1: logcnt says 1 replicas, phy2log has 2"));
  s = ExpertPlacement::FromTables({{1, 0, 2, 1}}, {{{1, -1}, {0, 2}, {3, -1}}}, {{1, 2, 1}})
          .status();
  EXPECT_THAT(s.message(), HasSubstr("expert 1: log2phy lists slots [0, 2], phy2log puts it in "
                                     "slots [0, 3]"));
  s = ExpertPlacement::FromTables({{1, 0, 2, 1}}, {{{-1, 1}, {0, 3}, {2, -1}}}, {{1, 2, 1}})
          .status();
  EXPECT_THAT(s.message(), HasSubstr("slot after -1 padding"));
  s = ExpertPlacement::FromTables({{1, 0, 2, 1}}, {}, {{1, 2, 1}}).status();
  EXPECT_THAT(s.message(), HasSubstr("phy2log has 1 layers, log2phy 0, logcnt 1"));
}

TEST(ExpertPlacementTest, GpuCountMustDivideSlots) {
  absl::StatusOr<ExpertPlacement> p = ExpertPlacement::FromPhy2Log({{0, 1, 2, 3, 4, 5}}, 6);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->CheckGpuCount(3).ok());
  absl::Status s = p->CheckGpuCount(4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("6 physical expert slots per layer cannot be spread evenly "
                                     "over 4 GPUs; GPU counts that work: 1, 2, 3, 6"));
  EXPECT_FALSE(p->CheckGpuCount(0).ok());
}

}  // namespace
}  // namespace deepinfer
