#include "common/flags/flag_set.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;

struct Options {
  std::string coordinator = "127.0.0.1:7070";
  int64_t port = 0;
  double ratio = 0.9;
  bool verbose = false;
  bool color = true;
};

class FlagSetTest : public ::testing::Test {
 protected:
  FlagSetTest() : flags_("tool cmd [flags]", "Does a thing.") {
    flags_.AddString("coordinator", &opts_.coordinator, "Coordinator address.");
    flags_.AddInt("port", &opts_.port, "Port.\nSecond line.");
    flags_.AddDouble("ratio", &opts_.ratio, "Ratio.");
    flags_.AddBool("verbose", &opts_.verbose, "Talk more.");
    flags_.AddBool("color", &opts_.color, "Colour.");
  }
  Options opts_;
  FlagSet flags_;
};

TEST_F(FlagSetTest, DefaultsStayWhenAbsent) {
  ASSERT_TRUE(flags_.Parse({}).ok());
  EXPECT_EQ(opts_.coordinator, "127.0.0.1:7070");
  EXPECT_EQ(opts_.port, 0);
  EXPECT_FALSE(opts_.verbose);
}

TEST_F(FlagSetTest, ParsesAllForms) {
  ASSERT_TRUE(flags_
                  .Parse({"--coordinator=h:1", "--port", "42", "--ratio=0.5", "--verbose",
                          "--nocolor", "pos1", "--", "--not-a-flag"})
                  .ok());
  EXPECT_EQ(opts_.coordinator, "h:1");
  EXPECT_EQ(opts_.port, 42);
  EXPECT_DOUBLE_EQ(opts_.ratio, 0.5);
  EXPECT_TRUE(opts_.verbose);
  EXPECT_FALSE(opts_.color);
  EXPECT_THAT(flags_.positional(), ::testing::ElementsAre("pos1", "--not-a-flag"));
}

TEST_F(FlagSetTest, NoDashNegatesABool) {
  opts_.verbose = true;
  ASSERT_TRUE(flags_.Parse({"--no-color", "--no_verbose"}).ok());
  EXPECT_FALSE(opts_.color);
  EXPECT_FALSE(opts_.verbose);
  // Only booleans, and only without a value.
  EXPECT_FALSE(flags_.Parse({"--no-port"}).ok());
  EXPECT_FALSE(flags_.Parse({"--no-color=true"}).ok());
}

TEST_F(FlagSetTest, BoolWithExplicitValueAndSnakeCase) {
  ASSERT_TRUE(flags_.Parse({"--verbose=false", "--color=0"}).ok());
  EXPECT_FALSE(opts_.verbose);
  EXPECT_FALSE(opts_.color);
}

TEST_F(FlagSetTest, ErrorsNameTheFlag) {
  auto unknown = flags_.Parse({"--bogus=1"});
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("--bogus"));
  FlagSet f2("x", "");
  int64_t n = 0;
  f2.AddInt("n", &n, "");
  auto bad = f2.Parse({"--n=abc"});
  EXPECT_THAT(std::string(bad.message()), HasSubstr("--n expects an integer, got 'abc'"));
  auto missing_value = f2.Parse({"--n"});
  EXPECT_THAT(std::string(missing_value.message()), HasSubstr("--n needs a value"));
}

TEST_F(FlagSetTest, RequiredFlags) {
  flags_.Require("coordinator");
  auto s = flags_.Parse({"--port=1"});
  EXPECT_THAT(std::string(s.message()), HasSubstr("missing required flag --coordinator"));
}

TEST_F(FlagSetTest, HelpSkipsValidationAndListsDefaults) {
  flags_.Require("coordinator");
  ASSERT_TRUE(flags_.Parse({"--help"}).ok());
  EXPECT_TRUE(flags_.help_requested());
  std::string help = flags_.Help();
  EXPECT_THAT(help, HasSubstr("Usage: tool cmd [flags]"));
  EXPECT_THAT(help, HasSubstr("--coordinator=VALUE  (required)"));
  EXPECT_THAT(help, HasSubstr("--port=N  (default: 0)"));
  EXPECT_THAT(help, HasSubstr("      Second line."));
  EXPECT_THAT(help, HasSubstr("--verbose  (default: false)"));
}

TEST_F(FlagSetTest, ParseMainReturnsExitCodes) {
  std::string a0 = "tool", a1 = "--port=3", a2 = "extra", bad = "--bogus";
  char* ok[] = {a0.data(), a1.data()};
  EXPECT_EQ(flags_.ParseMain(2, ok, "tool"), -1);
  EXPECT_EQ(opts_.port, 3);
  char* positional[] = {a0.data(), a2.data()};
  testing::internal::CaptureStderr();
  EXPECT_EQ(flags_.ParseMain(2, positional, "tool"), 2);
  EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("unexpected argument 'extra'"));
  FlagSet other("x", "");
  char* unknown[] = {a0.data(), bad.data()};
  testing::internal::CaptureStderr();
  EXPECT_EQ(other.ParseMain(2, unknown, "tool"), 2);
  EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("tool: unknown flag --bogus"));
}

}  // namespace
}  // namespace deepinfer
