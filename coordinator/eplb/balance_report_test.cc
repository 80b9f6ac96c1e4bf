#include "coordinator/eplb/balance_report.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::DoubleEq;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(BalanceReportTest, SplitsReplicatedExpertsEvenly) {
  // Expert 0 (900 tokens) has replicas on both GPUs; 1 and 2 one each.
  ExpertPlacement placement = *ExpertPlacement::FromPhy2Log({{0, 1, 0, 2}}, 3);
  absl::StatusOr<BalanceReport> report =
      BalanceReport::ForPlacement(placement, {{900, 100, 300}}, 2);
  ASSERT_TRUE(report.ok()) << report.status();
  const BalanceReport::Layer& layer = report->layers()[0];
  EXPECT_THAT(layer.gpu_tokens, ElementsAre(DoubleEq(550), DoubleEq(750)));
  EXPECT_DOUBLE_EQ(layer.max_tokens, 750);
  EXPECT_DOUBLE_EQ(layer.mean_tokens, 650);
  EXPECT_DOUBLE_EQ(layer.imbalance(), 750.0 / 650);
}

TEST(BalanceReportTest, OverallIsSumOfMaximaOverSumOfMeans) {
  ExpertPlacement placement = *ExpertPlacement::FromPhy2Log({{0, 1}, {0, 1}}, 2);
  BalanceReport report = *BalanceReport::ForPlacement(placement, {{300, 100}, {0, 0}}, 2);
  EXPECT_DOUBLE_EQ(report.layers()[0].imbalance(), 1.5);
  EXPECT_DOUBLE_EQ(report.layers()[1].imbalance(), 1.0);  // no load: balanced by definition
  EXPECT_DOUBLE_EQ(report.total_max_tokens(), 300);
  EXPECT_DOUBLE_EQ(report.total_mean_tokens(), 200);
  EXPECT_DOUBLE_EQ(report.imbalance(), 1.5);
}

TEST(BalanceReportTest, ContiguousLayoutWithoutReplicas) {
  // 5 experts over 2 GPUs: GPU 0 hosts experts 0-1, GPU 1 hosts 2-4.
  BalanceReport report = *BalanceReport::ForContiguous({{10, 20, 30, 40, 50}}, 2);
  EXPECT_THAT(report.layers()[0].gpu_tokens, ElementsAre(DoubleEq(30), DoubleEq(120)));
}

TEST(BalanceReportTest, RejectsMismatchedInputs) {
  ExpertPlacement placement = *ExpertPlacement::FromPhy2Log({{0, 1, 0, 2}}, 3);
  EXPECT_THAT(BalanceReport::ForPlacement(placement, {{1, 2}}, 2).status().message(),
              HasSubstr("expert loads have 1 layers of 2 experts, the placement 1 layers of 3"));
  EXPECT_THAT(BalanceReport::ForPlacement(placement, {{1, 2, 3}}, 3).status().message(),
              HasSubstr("cannot be spread evenly over 3 GPUs"));
  EXPECT_FALSE(BalanceReport::ForContiguous({{1, 2}}, 0).ok());
}

TEST(BalanceReportTest, FormatsBeforeAndAfter) {
  ExpertPlacement placement = *ExpertPlacement::FromPhy2Log({{0, 1, 0, 2}}, 3);
  const ExpertLoads loads = {{900, 100, 300}};
  const std::string table = FormatBalanceComparison(
      *BalanceReport::ForContiguous(loads, 2), *BalanceReport::ForPlacement(placement, loads, 2));
  EXPECT_THAT(table, HasSubstr("before max"));
  // Before: GPU 0 has expert 0 (900), GPU 1 experts 1-2 (400): 900 / 650.
  EXPECT_THAT(table, HasSubstr("900.0"));
  EXPECT_THAT(table, HasSubstr("1.385"));
  EXPECT_THAT(table, HasSubstr("1.154"));  // after: 750 / 650
  EXPECT_THAT(table, HasSubstr("overall"));
}

}  // namespace
}  // namespace deepinfer
