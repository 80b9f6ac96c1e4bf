#include "common/eplb/placement_json.h"

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;

TEST(PlacementJsonTest, WritesEplbFormatWithPadding) {
  ExpertPlacement placement = *ExpertPlacement::FromPhy2Log({{1, 0, 2, 1}}, 3);
  EXPECT_EQ(PlacementToJson(placement),
            "{\n"
            "  \"phy2log\": [\n    [1,0,2,1]\n  ],\n"
            "  \"log2phy\": [\n    [[1,-1],[0,3],[2,-1]]\n  ],\n"
            "  \"logcnt\": [\n    [1,2,1]\n  ]\n"
            "}\n");
}

TEST(PlacementJsonTest, RoundTrip) {
  // Replica order other than slot order must survive.
  ExpertPlacement placement = *ExpertPlacement::FromTables(
      {{1, 0, 2, 1, 1, 3}, {0, 1, 2, 3, 3, 3}},
      {{{1}, {4, 0, 3}, {2}, {5}}, {{0}, {1}, {2}, {5, 3, 4}}}, {{1, 3, 1, 1}, {1, 1, 1, 3}});
  absl::StatusOr<ExpertPlacement> parsed = ParsePlacementJson(PlacementToJson(placement));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, placement);

  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/placement.json";
  ASSERT_TRUE(WritePlacementFile(path, placement).ok());
  absl::StatusOr<ExpertPlacement> read = ReadPlacementFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, placement);
}

TEST(PlacementJsonTest, ErrorsSayWhatAndWhere) {
  struct Case {
    const char* json;
    const char* error;
  };
  for (const Case& c : {
           Case{"{", "not valid JSON"},
           Case{"[1]", "expected an object"},
           Case{R"({"phy2log": [[0]], "logcnt": [[1]]})", "missing key \"log2phy\""},
           Case{R"({"phy2log": [[0, "a"]], "log2phy": [[[0]]], "logcnt": [[1]]})",
                "phy2log[0][1]: \"a\" is not an integer"},
           Case{R"({"phy2log": [[0, 1.5]], "log2phy": [[[0]]], "logcnt": [[1]]})",
                "phy2log[0][1]: 1.5 is not an integer"},
           Case{R"({"phy2log": [[0, 0]], "log2phy": 3, "logcnt": [[2]]})",
                "log2phy is not an array"},
           Case{R"({"phy2log": [[0, 0]], "log2phy": [[[0, 1]]], "logcnt": [[1]]})",
                "logcnt says 1 replicas, phy2log has 2"},
           Case{R"({"phy2log": [[0, 1]], "log2phy": [[[0], [1]]], "logcnt": [[1, 1]],
                    "extra": 1})",
                ""},
       }) {
    absl::StatusOr<ExpertPlacement> parsed = ParsePlacementJson(c.json);
    if (std::string(c.error).empty()) {
      EXPECT_TRUE(parsed.ok()) << c.json << ": " << parsed.status();  // unknown keys ignored
      continue;
    }
    ASSERT_FALSE(parsed.ok()) << c.json;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.error)) << c.json;
  }
}

TEST(PlacementJsonTest, FileErrorsNameTheFile) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/bad.json";
  std::ofstream(path) << R"({"phy2log": [[0, 0]], "log2phy": [[[0, 1]]], "logcnt": [[1]]})";
  absl::StatusOr<ExpertPlacement> read = ReadPlacementFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(), HasSubstr(path + ": layer 0 expert 0: logcnt says 1"));
  read = ReadPlacementFile(path + ".missing");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(read.status().message(), HasSubstr(".missing: cannot open placement file"));
}

}  // namespace
}  // namespace deepinfer
