#include "coordinator/eplb/expert_loads.h"

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;

TEST(ExpertLoadsTest, ParsesLayersOfNumbers) {
  absl::StatusOr<ExpertLoads> loads = ParseExpertLoadsJson("[[1, 2.5, 0], [3, 4, 5]]");
  ASSERT_TRUE(loads.ok()) << loads.status();
  EXPECT_EQ(*loads, (ExpertLoads{{1, 2.5, 0}, {3, 4, 5}}));
}

TEST(ExpertLoadsTest, RejectsBadInputSayingWhere) {
  struct Case {
    const char* json;
    const char* error;
  };
  for (const Case& c : {Case{"[[1, 2", "not valid JSON"}, Case{"{\"a\": 1}", "array of layers"},
                        Case{"[]", "no layers"}, Case{"[[]]", "layer 0 has no experts"},
                        Case{"[[1, 2], 3]", "layer 1 is not an array"},
                        Case{"[[1, 2], [1, \"x\"]]", "layer 1 expert 1: \"x\" is not a number"},
                        Case{"[[1, 2], [1, 2, 3]]", "layer 1 has 3 experts, layer 0 has 2"},
                        Case{"[[1, -2]]", "layer 0 expert 1 has load -2"}}) {
    absl::StatusOr<ExpertLoads> loads = ParseExpertLoadsJson(c.json);
    ASSERT_FALSE(loads.ok()) << c.json;
    EXPECT_EQ(loads.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_THAT(loads.status().message(), HasSubstr(c.error)) << c.json;
  }
}

TEST(ExpertLoadsTest, FileRoundTripAndErrorsNameTheFile) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/loads.json";
  const ExpertLoads loads = {{1234567, 0.125, 3}, {0, 1e-3, 7}};
  ASSERT_TRUE(WriteExpertLoadsFile(path, loads).ok());
  absl::StatusOr<ExpertLoads> read = ReadExpertLoadsFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, loads);  // exact: numbers are written round-trip precise

  std::ofstream(path) << "[[1, 2], [3]]";
  read = ReadExpertLoadsFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(), HasSubstr(path + ": expert loads: layer 1 has 1"));

  read = ReadExpertLoadsFile(path + ".missing");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(read.status().message(), HasSubstr(path + ".missing: cannot open"));
}

}  // namespace
}  // namespace deepinfer
