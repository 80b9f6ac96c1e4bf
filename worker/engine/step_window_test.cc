#include "worker/engine/step_window.h"

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

TEST(StepWindowTest, EmptyWindowSaysNothing) {
  const StepWindow::Summary s = StepWindow(4).summary();
  EXPECT_EQ(s.steps, 0);
  EXPECT_EQ(s.tokens_max, 0);
  EXPECT_EQ(s.tokens_mean, 0.0);
}

TEST(StepWindowTest, KeepsTheLastStepsOnly) {
  StepWindow w(3);
  w.Record(100, 0);  // falls out of the window below
  w.Record(4, 4);
  w.Record(8, 2);
  w.Record(6, 5);
  const StepWindow::Summary s = w.summary();
  EXPECT_EQ(s.steps, 3);
  EXPECT_EQ(s.tokens_max, 8);
  EXPECT_DOUBLE_EQ(s.tokens_mean, 6.0);  // (4 + 8 + 6) / 3
  EXPECT_EQ(s.last_decode_rows, 5);
}

}  // namespace
}  // namespace deepinfer
