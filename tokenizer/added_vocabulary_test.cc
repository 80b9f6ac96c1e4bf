#include "tokenizer/added_vocabulary.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer::tokenizer {
namespace {

using ::testing::ElementsAre;

AddedToken Token(uint32_t id, std::string content) {
  AddedToken token;
  token.id = id;
  token.content = std::move(content);
  token.special = true;
  token.normalized = false;
  return token;
}

// Pieces as "text" or "#id:text".
std::vector<std::string> Split(const AddedVocabulary& vocabulary, const std::string& text,
                               bool normalized_pass = false) {
  std::vector<TextPiece> pieces;
  vocabulary.Split(text, normalized_pass, &pieces);
  std::vector<std::string> out;
  for (const TextPiece& piece : pieces) {
    const std::string slice = text.substr(piece.begin, piece.end - piece.begin);
    out.push_back(piece.token_id ? "#" + std::to_string(*piece.token_id) + ":" + slice : slice);
  }
  return out;
}

TEST(AddedVocabularyTest, LeftmostLongestMatch) {
  auto vocabulary =
      AddedVocabulary::Create({Token(1, "<a>"), Token(2, "<a><b>"), Token(3, "b")}, nullptr);
  ASSERT_TRUE(vocabulary.ok());
  EXPECT_THAT(Split(**vocabulary, "x<a><b>y<a>b"),
              ElementsAre("x", "#2:<a><b>", "y", "#1:<a>", "#3:b"));
  EXPECT_THAT(Split(**vocabulary, ""), ElementsAre());
  EXPECT_THAT(Split(**vocabulary, "plain"), ElementsAre("plain"));
}

TEST(AddedVocabularyTest, StripOptionsTakeSurroundingWhitespace) {
  AddedToken left = Token(1, "<l>");
  left.lstrip = true;
  AddedToken right = Token(2, "<r>");
  right.rstrip = true;
  auto vocabulary = AddedVocabulary::Create({left, right}, nullptr);
  ASSERT_TRUE(vocabulary.ok());
  EXPECT_THAT(Split(**vocabulary, "a  <l>  b"), ElementsAre("a", "#1:  <l>", "  b"));
  EXPECT_THAT(Split(**vocabulary, "a \t<r> \n b"), ElementsAre("a \t", "#2:<r> \n ", "b"));
  // lstrip never reaches back into the previous token.
  EXPECT_THAT(Split(**vocabulary, "<r>  <l>"), ElementsAre("#2:<r>  ", "#1:<l>"));
}

TEST(AddedVocabularyTest, SingleWordNeedsWordBoundaries) {
  AddedToken word = Token(1, "cat");
  word.single_word = true;
  auto vocabulary = AddedVocabulary::Create({word}, nullptr);
  ASSERT_TRUE(vocabulary.ok());
  EXPECT_THAT(Split(**vocabulary, "a cat!"), ElementsAre("a ", "#1:cat", "!"));
  EXPECT_THAT(Split(**vocabulary, "concatenate cat_"), ElementsAre("concatenate cat_"));
}

TEST(AddedVocabularyTest, NormalizedTokensMatchInTheSecondPass) {
  AddedToken normalized = Token(1, "<n>");
  normalized.normalized = true;
  normalized.special = false;
  auto vocabulary = AddedVocabulary::Create({normalized, Token(2, "<raw>")}, nullptr);
  ASSERT_TRUE(vocabulary.ok());
  EXPECT_THAT(Split(**vocabulary, "a<n>b<raw>"), ElementsAre("a<n>b", "#2:<raw>"));
  EXPECT_THAT(Split(**vocabulary, "a<n>b<raw>", true), ElementsAre("a", "#1:<n>", "b<raw>"));
  EXPECT_EQ((*vocabulary)->TokenToId("<raw>"), 2u);
  ASSERT_NE((*vocabulary)->FindById(1), nullptr);
  EXPECT_EQ((*vocabulary)->FindById(1)->content, "<n>");
}

TEST(AddedVocabularyTest, ParsesJsonWithHfDefaults) {
  auto tokens = AddedVocabulary::ParseJson(nlohmann::json::parse(
      R"([{"id": 5, "content": "<x>", "special": true}, {"id": 6, "content": "y"}])"));
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(tokens->size(), 2u);
  EXPECT_FALSE((*tokens)[0].normalized);  // special tokens default to normalized=false
  EXPECT_TRUE((*tokens)[1].normalized);
  EXPECT_FALSE(AddedVocabulary::ParseJson(nlohmann::json::parse(R"([{"content": "x"}])")).ok());
}

}  // namespace
}  // namespace deepinfer::tokenizer
