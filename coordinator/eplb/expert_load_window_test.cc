// ExpertLoadWindow: sums over ranks, slides by steps (whole and straddling reports), resets on a
// new generation, refuses malformed reports.
#include "coordinator/eplb/expert_load_window.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::DoubleEq;
using ::testing::ElementsAre;

TEST(ExpertLoadWindowTest, EmptyUntilAReportArrives) {
  ExpertLoadWindow w(10);
  EXPECT_TRUE(w.Get().loads.empty());
  EXPECT_EQ(w.Get().num_steps, 0);
  ASSERT_TRUE(w.Add(0, 1, 0, 1, 2, {0, 0}).ok());  // zero steps: ignored
  EXPECT_TRUE(w.Get().loads.empty());
}

TEST(ExpertLoadWindowTest, SumsRanksAndLayers) {
  ExpertLoadWindow w(100);
  ASSERT_TRUE(w.Add(0, 1, 5, 2, 3, {1, 2, 3, 4, 5, 6}).ok());
  ASSERT_TRUE(w.Add(1, 1, 5, 2, 3, {10, 0, 0, 0, 0, 10}).ok());
  ASSERT_TRUE(w.Add(0, 1, 3, 2, 3, {1, 1, 1, 1, 1, 1}).ok());
  ExpertLoadWindow::Snapshot s = w.Get();
  EXPECT_EQ(s.num_steps, 8);
  EXPECT_EQ(s.num_layers, 2);
  EXPECT_EQ(s.num_experts, 3);
  EXPECT_THAT(s.loads[0], ElementsAre(12, 3, 4));
  EXPECT_THAT(s.loads[1], ElementsAre(5, 6, 17));
}

TEST(ExpertLoadWindowTest, KeepsOnlyTheLastWindowStepsProRata) {
  ExpertLoadWindow w(10);
  // 4 steps all on expert 0, then 4 on expert 1, then 4 on expert 2: the last 10 steps are
  // 2 of the first report (half its load), and the two others whole.
  ASSERT_TRUE(w.Add(0, 1, 4, 1, 3, {40, 0, 0}).ok());
  ASSERT_TRUE(w.Add(0, 1, 4, 1, 3, {0, 40, 0}).ok());
  ASSERT_TRUE(w.Add(0, 1, 4, 1, 3, {0, 0, 40}).ok());
  ExpertLoadWindow::Snapshot s = w.Get();
  EXPECT_EQ(s.num_steps, 10);
  EXPECT_THAT(s.loads[0], ElementsAre(DoubleEq(20), DoubleEq(40), DoubleEq(40)));
  // Four more steps: the first report is gone, the second counts for 2 of its 4 steps.
  ASSERT_TRUE(w.Add(0, 1, 4, 1, 3, {8, 8, 8}).ok());
  s = w.Get();
  EXPECT_EQ(s.num_steps, 10);
  EXPECT_THAT(s.loads[0], ElementsAre(DoubleEq(8), DoubleEq(28), DoubleEq(48)));
}

TEST(ExpertLoadWindowTest, ANewGenerationStartsAfreshAndOldOnesAreDropped) {
  ExpertLoadWindow w(10);
  ASSERT_TRUE(w.Add(0, 2, 3, 1, 2, {5, 5}).ok());
  ASSERT_TRUE(w.Add(0, 3, 1, 1, 2, {1, 0}).ok());
  ASSERT_TRUE(w.Add(1, 2, 3, 1, 2, {7, 7}).ok());  // late report of generation 2: dropped
  ExpertLoadWindow::Snapshot s = w.Get();
  EXPECT_EQ(s.generation, 3u);
  EXPECT_EQ(s.num_steps, 1);
  EXPECT_THAT(s.loads[0], ElementsAre(1, 0));
}

TEST(ExpertLoadWindowTest, MalformedReportsAreRefused) {
  ExpertLoadWindow w(10);
  EXPECT_TRUE(absl::IsInvalidArgument(w.Add(0, 1, 1, 2, 2, {1, 2, 3})));
  EXPECT_TRUE(absl::IsInvalidArgument(w.Add(0, 1, -1, 1, 1, {1})));
  EXPECT_TRUE(absl::IsInvalidArgument(w.Add(0, 1, 1, 1, 1, {-4})));
  ASSERT_TRUE(w.Add(0, 1, 1, 1, 2, {1, 2}).ok());
  absl::Status st = w.Add(1, 1, 1, 2, 1, {1, 2});
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("earlier reports"));
  EXPECT_THAT(w.Get().loads[0], ElementsAre(1, 2));
}

}  // namespace
}  // namespace deepinfer
