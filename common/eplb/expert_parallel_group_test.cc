#include "common/eplb/expert_parallel_group.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

TEST(CheckRoutedExpertsSplitTest, DivisorsPassOthersNameTheDivisors) {
  for (int64_t ranks : {1, 2, 4, 8}) EXPECT_TRUE(CheckRoutedExpertsSplit(8, ranks).ok()) << ranks;
  absl::Status s = CheckRoutedExpertsSplit(8, 3);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(),
            "8 routed experts cannot be split over 3 ranks; rank counts that divide 8: 1, 2, 4, 8");
  EXPECT_FALSE(CheckRoutedExpertsSplit(8, 16).ok());
  EXPECT_FALSE(CheckRoutedExpertsSplit(8, 0).ok());
}

TEST(CheckRoutedExpertsSplitTest, DenseModelsFitAnyGroup) {
  EXPECT_TRUE(CheckRoutedExpertsSplit(0, 3).ok());
}

TEST(SelectExpertParallelMembersTest, AllWorkersWhenTheirRanksDivide) {
  ExpertParallelSelection s = SelectExpertParallelMembers(8, {2, 1, 1});
  EXPECT_EQ(s.members, 3u);
  EXPECT_EQ(s.world_size, 4);
  EXPECT_TRUE(s.left_out_because.ok());
}

TEST(SelectExpertParallelMembersTest, LeavesTheLastOutUntilTheRanksDivide) {
  ExpertParallelSelection s = SelectExpertParallelMembers(8, {1, 1, 1});
  EXPECT_EQ(s.members, 2u);
  EXPECT_EQ(s.world_size, 2);
  EXPECT_EQ(s.left_out_because.message(),
            "8 routed experts cannot be split over 3 ranks; rank counts that divide 8: 1, 2, 4, 8");
  s = SelectExpertParallelMembers(8, {2, 3, 1});  // 6, then 5: only the first worker
  EXPECT_EQ(s.members, 1u);
  EXPECT_EQ(s.world_size, 2);
}

TEST(SelectExpertParallelMembersTest, NoGroupWhenNoPrefixDivides) {
  ExpertParallelSelection s = SelectExpertParallelMembers(8, {3});
  EXPECT_EQ(s.members, 0u);
  EXPECT_EQ(s.world_size, 0);
  EXPECT_FALSE(s.left_out_because.ok());
}

}  // namespace
}  // namespace deepinfer
