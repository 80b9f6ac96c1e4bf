#include "tests/testing/subprocess.h"

#include <signal.h>

#include "gtest/gtest.h"

namespace deepinfer::testing {
namespace {

TEST(SubprocessTest, CapturesOutputAndExitCode) {
  auto result = RunCommand({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, TempPath("sh1"));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 3);
  EXPECT_EQ(result->out, "out\n");
  EXPECT_EQ(result->err, "err\n");
}

TEST(SubprocessTest, SignalEndsProcess) {
  auto p = Subprocess::Start({"/bin/sleep", "60"}, TempPath("sleep"));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->Wait(absl::Milliseconds(50)).status().code(), absl::StatusCode::kDeadlineExceeded);
  p->Signal(SIGKILL);
  auto code = p->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 128 + SIGKILL);
}

}  // namespace
}  // namespace deepinfer::testing
