#include "coordinator/eplb/redundant_experts.h"

#include <cstdlib>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;

TEST(RedundantExpertsTest, DefaultIs32) {
  EXPECT_EQ(*ResolveNumRedundantExperts(std::nullopt, nullptr), 32);
  EXPECT_EQ(*ResolveNumRedundantExperts(std::nullopt, ""), 32);  // empty counts as unset
}

TEST(RedundantExpertsTest, FlagOverridesDefault) {
  EXPECT_EQ(*ResolveNumRedundantExperts(16, nullptr), 16);
  EXPECT_EQ(*ResolveNumRedundantExperts(0, nullptr), 0);
}

TEST(RedundantExpertsTest, EnvironmentWinsOverFlag) {
  EXPECT_EQ(*ResolveNumRedundantExperts(16, "64"), 64);
  EXPECT_EQ(*ResolveNumRedundantExperts(std::nullopt, "0"), 0);
}

TEST(RedundantExpertsTest, BadValuesAreClearErrors) {
  absl::StatusOr<int> r = ResolveNumRedundantExperts(16, "lots");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS=\"lots\" is not an integer"));
  r = ResolveNumRedundantExperts(std::nullopt, "-4");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS = -4"));
  r = ResolveNumRedundantExperts(std::nullopt, "12abc");
  EXPECT_FALSE(r.ok());
  r = ResolveNumRedundantExperts(-1, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("--num-redundant-experts = -1"));
  r = ResolveNumRedundantExperts(int64_t{1} << 40, nullptr);
  EXPECT_FALSE(r.ok());
}

TEST(RedundantExpertsTest, ReadsTheProcessEnvironment) {
  ASSERT_EQ(setenv(kOverrideNumExtraExpertsEnv, "8", 1), 0);
  EXPECT_EQ(*ResolveNumRedundantExpertsFromEnv(16), 8);
  ASSERT_EQ(unsetenv(kOverrideNumExtraExpertsEnv), 0);
  EXPECT_EQ(*ResolveNumRedundantExpertsFromEnv(16), 16);
  EXPECT_EQ(*ResolveNumRedundantExpertsFromEnv(std::nullopt), 32);
}

TEST(RedundantExpertsTest, DivisibilityOverRanks) {
  EXPECT_TRUE(CheckExpertsDivideOverRanks(256, 32, 32).ok());
  EXPECT_TRUE(CheckExpertsDivideOverRanks(256, 0, 16).ok());
  absl::Status s = CheckExpertsDivideOverRanks(256, 32, 40);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("288 physical experts (256 logical + 32 redundant) do not "
                                     "divide evenly over 40 ranks"));
  EXPECT_THAT(s.message(), HasSubstr("24 redundant (280 physical, 7 per rank) or 64 redundant "
                                     "(320 physical, 8 per rank)"));
  // Nothing below zero redundant experts is offered.
  s = CheckExpertsDivideOverRanks(10, 1, 4);
  EXPECT_THAT(s.message(), HasSubstr("work: 2 redundant (12 physical, 3 per rank)"));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr(" or ")));
  EXPECT_FALSE(CheckExpertsDivideOverRanks(256, 32, 0).ok());
}

}  // namespace
}  // namespace deepinfer
