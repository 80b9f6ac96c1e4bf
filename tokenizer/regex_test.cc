#include "tokenizer/regex.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

std::unique_ptr<Regex> Compile(const std::string& pattern) {
  auto regex = Regex::Compile(pattern);
  EXPECT_TRUE(regex.ok()) << regex.status();
  return regex.ok() ? *std::move(regex) : nullptr;
}

TEST(RegexTest, FindAllAdvancesPastEmptyMatches) {
  std::vector<std::pair<size_t, size_t>> matches;
  Compile("x*")->FindAll("axé", &matches);
  // Empty at 0, "x" at 1, empty before and after the two-byte "é".
  EXPECT_THAT(matches, ElementsAre(Pair(0, 0), Pair(1, 2), Pair(2, 2), Pair(4, 4)));
}

TEST(RegexTest, WhitespaceIsUnicodeWhiteSpaceAsInOniguruma) {
  auto space = Compile("^\\s$");
  EXPECT_TRUE(space->FullMatch("\u3000"));
  EXPECT_TRUE(space->FullMatch("\xC2\x85"));  // U+0085
  EXPECT_FALSE(space->FullMatch("\u180e"));   // PCRE2 alone would say yes
  EXPECT_TRUE(Compile("[^\\s]")->FullMatch("\u180e"));
  EXPECT_TRUE(Compile("\\S")->FullMatch("\u180e"));
  EXPECT_FALSE(Compile("\\S")->FullMatch(" "));
}

TEST(RegexTest, CategoriesIncludeCharactersNewerThanPcre2Tables) {
  EXPECT_TRUE(Compile("\\p{S}")->FullMatch("\U0001FABB"));  // Unicode 15 emoji
  EXPECT_TRUE(Compile("[\\p{P}\\p{S}]")->FullMatch("\U0001FABB"));
  EXPECT_FALSE(Compile("[^\\p{S}]")->FullMatch("\U0001FABB"));
  EXPECT_FALSE(Compile("\\P{S}")->FullMatch("\U0001FABB"));
  EXPECT_TRUE(Compile("\\p{L}")->FullMatch("\U00031350"));  // CJK extension H
  EXPECT_TRUE(Compile("\\p{N}{1,3}")->FullMatch("123"));
}

TEST(RegexTest, QuotedTextAndEscapesAreLeftAlone) {
  EXPECT_TRUE(Compile("\\Q\\s+\\E")->FullMatch("\\s+"));
  EXPECT_TRUE(Compile("\\\\s")->FullMatch("\\s"));
  EXPECT_TRUE(Compile("[]\\s]")->FullMatch("]"));
  EXPECT_TRUE(Compile("[[:alpha:]\\s]")->FullMatch(" "));
}

TEST(RegexTest, BadPatternIsAnError) {
  auto regex = Regex::Compile("(unclosed");
  EXPECT_EQ(regex.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deepinfer::tokenizer
