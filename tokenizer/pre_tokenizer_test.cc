#include "tokenizer/pre_tokenizer.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer::tokenizer {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Split(const std::string& text, const std::string& pattern,
                               SplitBehavior behavior, bool invert = false) {
  auto regex = Regex::Compile(pattern);
  EXPECT_TRUE(regex.ok()) << regex.status();
  std::vector<std::string> out;
  SplitWithPattern(text, **regex, behavior, invert, &out);
  return out;
}

std::vector<std::string> PreTokenize(const nlohmann::json& config, const std::string& text) {
  auto pre_tokenizer = PreTokenizer::FromJson(config);
  EXPECT_TRUE(pre_tokenizer.ok()) << pre_tokenizer.status();
  std::vector<std::string> splits = {text};
  (*pre_tokenizer)->PreTokenize(&splits);
  return splits;
}

// The examples of HF's SplitDelimiterBehavior documentation.
TEST(PreTokenizerTest, SplitBehaviors) {
  const std::string text = "the-final--countdown";
  EXPECT_THAT(Split(text, "-", SplitBehavior::kRemoved), ElementsAre("the", "final", "countdown"));
  EXPECT_THAT(Split(text, "-", SplitBehavior::kIsolated),
              ElementsAre("the", "-", "final", "-", "-", "countdown"));
  EXPECT_THAT(Split(text, "-", SplitBehavior::kMergedWithPrevious),
              ElementsAre("the-", "final-", "-", "countdown"));
  EXPECT_THAT(Split(text, "-", SplitBehavior::kMergedWithNext),
              ElementsAre("the", "-final", "-", "-countdown"));
  EXPECT_THAT(Split(text, "-", SplitBehavior::kContiguous),
              ElementsAre("the", "-", "final", "--", "countdown"));
}

TEST(PreTokenizerTest, SplitInvertKeepsMatches) {
  EXPECT_THAT(Split("a, bc!", "\\w+", SplitBehavior::kRemoved, /*invert=*/true),
              ElementsAre("a", "bc"));
  EXPECT_THAT(Split("a, bc!", "\\w+", SplitBehavior::kRemoved), ElementsAre(", ", "!"));
}

TEST(PreTokenizerTest, SplitUsesUnicodePropertiesAndLookahead) {
  EXPECT_THAT(Split("ab12345", "\\p{N}{1,3}", SplitBehavior::kIsolated),
              ElementsAre("ab", "123", "45"));
  // \s+(?!\S) leaves the last space for the next word, as GPT-2's regex intends.
  EXPECT_THAT(Split("a   b", "\\s+(?!\\S)|\\S+", SplitBehavior::kIsolated),
              ElementsAre("a", "  ", " ", "b"));
  EXPECT_THAT(Split("中文abc", "[\\x{4e00}-\\x{9fa5}]+", SplitBehavior::kIsolated),
              ElementsAre("中文", "abc"));
}

TEST(PreTokenizerTest, StringPatternIsLiteral) {
  EXPECT_THAT(PreTokenize({{"type", "Split"},
                           {"pattern", {{"String", "."}}},
                           {"behavior", "Removed"},
                           {"invert", false}},
                          "a.b+c"),
              ElementsAre("a", "b+c"));
}

TEST(PreTokenizerTest, ByteLevel) {
  // Bytes map to GPT-2's printable alphabet: space -> "Ġ", "é" (C3 A9) -> "Ã©".
  EXPECT_THAT(
      PreTokenize({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}},
                  "a bé"),
      ElementsAre("aĠbÃ©"));
  EXPECT_THAT(PreTokenize({{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}},
                          "it's 42  go"),
              ElementsAre("Ġit", "'s", "Ġ42", "Ġ", "Ġgo"));
}

TEST(PreTokenizerTest, DigitsAndSequence) {
  EXPECT_THAT(PreTokenize({{"type", "Digits"}, {"individual_digits", true}}, "a123b"),
              ElementsAre("a", "1", "2", "3", "b"));
  EXPECT_THAT(PreTokenize({{"type", "Digits"}, {"individual_digits", false}}, "a123b"),
              ElementsAre("a", "123", "b"));
  EXPECT_THAT(
      PreTokenize({{"type", "Sequence"},
                   {"pretokenizers",
                    {{{"type", "Digits"}, {"individual_digits", false}},
                     {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}},
                  "x 12"),
      ElementsAre("xĠ", "12"));
}

TEST(PreTokenizerTest, RejectsUnknownConfigurations) {
  EXPECT_EQ(PreTokenizer::FromJson({{"type", "Metaspace"}}).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(PreTokenizer::FromJson(
                {{"type", "Split"}, {"pattern", {{"Regex", "("}}}, {"behavior", "Isolated"}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PreTokenizer::FromJson(
                {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Sideways"}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deepinfer::tokenizer
