#include "coordinator/cli/subcommands.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class SubcommandsTest : public ::testing::Test {
 protected:
  int Run(std::vector<std::string> argv) {
    argv.insert(argv.begin(), "tool");
    std::vector<char*> raw;
    for (auto& a : argv) raw.push_back(a.data());
    return RunSubcommands("tool", "A tool.", commands_, static_cast<int>(raw.size()), raw.data());
  }

  std::vector<std::string> seen_;
  std::vector<Subcommand> commands_ = {
      {"alpha", "first", [this](const std::vector<std::string>& a) {
         seen_ = a;
         return 7;
       }}};
};

TEST_F(SubcommandsTest, DispatchesWithRemainingArgs) {
  EXPECT_EQ(Run({"alpha", "--x=1", "y"}), 7);
  EXPECT_THAT(seen_, ElementsAre("--x=1", "y"));
}

TEST_F(SubcommandsTest, HelpCommandForwardsToCommandHelp) {
  EXPECT_EQ(Run({"help", "alpha"}), 7);
  EXPECT_THAT(seen_, ElementsAre("--help"));
}

TEST_F(SubcommandsTest, TopLevelHelpAndErrors) {
  testing::internal::CaptureStdout();
  EXPECT_EQ(Run({"--help"}), 0);
  EXPECT_THAT(testing::internal::GetCapturedStdout(), HasSubstr("alpha   first"));
  testing::internal::CaptureStderr();
  EXPECT_EQ(Run({"bogus"}), 2);
  EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("unknown command 'bogus'"));
  testing::internal::CaptureStderr();
  EXPECT_EQ(Run({}), 2);
  EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("Usage: tool COMMAND"));
}

}  // namespace
}  // namespace deepinfer
