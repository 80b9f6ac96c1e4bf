#include "tokenizer/normalizer.h"

#include <string>

#include "gtest/gtest.h"

namespace deepinfer::tokenizer {
namespace {

std::string Normalize(const nlohmann::json& config, std::string text) {
  auto normalizer = Normalizer::FromJson(config);
  EXPECT_TRUE(normalizer.ok()) << normalizer.status();
  (*normalizer)->Normalize(&text);
  return text;
}

TEST(NormalizerTest, SupportedTypes) {
  EXPECT_EQ(Normalize({{"type", "Prepend"}, {"prepend", "▁"}}, "hi"), "▁hi");
  EXPECT_EQ(Normalize({{"type", "Prepend"}, {"prepend", "▁"}}, ""), "");
  EXPECT_EQ(
      Normalize({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}, "a b c"),
      "a▁b▁c");
  EXPECT_EQ(Normalize({{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", " "}},
                      "a \t\n b"),
            "a b");
  EXPECT_EQ(
      Normalize({{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}}, "\u3000 x "),
      "x ");
  EXPECT_EQ(
      Normalize({{"type", "Sequence"},
                 {"normalizers", {{{"type", "Strip"}}, {{"type", "Prepend"}, {"prepend", "_"}}}}},
                "  x  "),
      "_x");
  auto none = Normalizer::FromJson(nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
}

TEST(NormalizerTest, UnicodeFormsAreRejectedNotApproximated) {
  EXPECT_EQ(Normalizer::FromJson({{"type", "NFKC"}}).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Normalizer::FromJson({{"type", "Lowercase"}}).status().code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace deepinfer::tokenizer
