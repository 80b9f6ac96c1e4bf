#include "tokenizer/bpe_model.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer::tokenizer {
namespace {

using ::testing::ElementsAre;

std::unique_ptr<BpeModel> Model(nlohmann::json config) {
  config["type"] = "BPE";
  auto model = BpeModel::FromJson(config);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

std::vector<uint32_t> Tokenize(const BpeModel& model, absl::string_view word) {
  std::vector<uint32_t> ids;
  model.Tokenize(word, &ids);
  return ids;
}

TEST(BpeModelTest, AppliesMergesByRank) {
  const nlohmann::json vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}};
  // "b c" outranks "a b", so "abc" goes a|bc and then needs "a bc".
  auto bc_first = Model({{"vocab", vocab}, {"merges", {"b c", "a b", "a bc"}}});
  EXPECT_THAT(Tokenize(*bc_first, "abc"), ElementsAre(5));
  auto ab_first = Model({{"vocab", vocab}, {"merges", {"a b", "b c", "a bc"}}});
  // a|b merges first; "ab c" is not a merge, so it stops at ab|c.
  EXPECT_THAT(Tokenize(*ab_first, "abc"), ElementsAre(3, 2));
  // The newer list-of-pairs merge format.
  auto pairs = Model({{"vocab", vocab},
                      {"merges", nlohmann::json::array({nlohmann::json::array({"b", "c"}),
                                                        nlohmann::json::array({"a", "bc"})})}});
  EXPECT_THAT(Tokenize(*pairs, "abc"), ElementsAre(5));
}

TEST(BpeModelTest, EqualRanksMergeLeftmostFirst) {
  auto model = Model({{"vocab", {{"a", 0}, {"aa", 1}}}, {"merges", {"a a"}}});
  EXPECT_THAT(Tokenize(*model, "aaa"), ElementsAre(1, 0));
  EXPECT_THAT(Tokenize(*model, "aaaa"), ElementsAre(1, 1));
}

TEST(BpeModelTest, UnknownCharacters) {
  const nlohmann::json vocab = {{"<unk>", 0}, {"a", 1}};
  auto plain =
      Model({{"vocab", vocab}, {"merges", nlohmann::json::array()}, {"unk_token", "<unk>"}});
  EXPECT_THAT(Tokenize(*plain, "xya"), ElementsAre(0, 0, 1));
  auto fused = Model({{"vocab", vocab},
                      {"merges", nlohmann::json::array()},
                      {"unk_token", "<unk>"},
                      {"fuse_unk", true}});
  EXPECT_THAT(Tokenize(*fused, "xya"), ElementsAre(0, 1));
  // Without an unk token HF drops unknown characters.
  auto no_unk = Model({{"vocab", vocab}, {"merges", nlohmann::json::array()}});
  EXPECT_THAT(Tokenize(*no_unk, "xa"), ElementsAre(1));
}

TEST(BpeModelTest, ByteFallback) {
  auto model = Model({{"vocab", {{"<unk>", 0}, {"a", 1}, {"<0xC3>", 2}, {"<0xA9>", 3}}},
                      {"merges", nlohmann::json::array()},
                      {"unk_token", "<unk>"},
                      {"byte_fallback", true}});
  EXPECT_THAT(Tokenize(*model, "a\xC3\xA9"), ElementsAre(1, 2, 3));  // "aé"
  EXPECT_THAT(Tokenize(*model, "\xC3\xB1"), ElementsAre(0));         // "ñ": 0xB1 missing
}

TEST(BpeModelTest, ContinuingSubwordPrefixAndIgnoreMerges) {
  auto prefixed = Model({{"vocab", {{"a", 0}, {"##b", 1}, {"ab", 2}}},
                         {"merges", {"a ##b"}},
                         {"continuing_subword_prefix", "##"}});
  EXPECT_THAT(Tokenize(*prefixed, "ab"), ElementsAre(2));
  // With ignore_merges a word that is in the vocabulary is taken whole, whatever the merges.
  auto whole = Model({{"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}},
                      {"merges", nlohmann::json::array()},
                      {"ignore_merges", true}});
  EXPECT_THAT(Tokenize(*whole, "ab"), ElementsAre(2));
  auto split =
      Model({{"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", nlohmann::json::array()}});
  EXPECT_THAT(Tokenize(*split, "ab"), ElementsAre(0, 1));
}

TEST(BpeModelTest, Lookups) {
  auto model = Model({{"vocab", {{"a", 0}, {"b", 2}}}, {"merges", nlohmann::json::array()}});
  EXPECT_EQ(model->TokenToId("b"), 2u);
  EXPECT_EQ(model->TokenToId("c"), std::nullopt);
  ASSERT_NE(model->IdToToken(2), nullptr);
  EXPECT_EQ(*model->IdToToken(2), "b");
  EXPECT_EQ(model->IdToToken(1), nullptr);  // hole
  EXPECT_EQ(model->IdToToken(7), nullptr);
}

TEST(BpeModelTest, RejectsBrokenModels) {
  EXPECT_FALSE(
      BpeModel::FromJson({{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", {"a b"}}}).ok());
  EXPECT_FALSE(BpeModel::FromJson({{"type", "BPE"}, {"merges", nlohmann::json::array()}}).ok());
  EXPECT_EQ(BpeModel::FromJson({{"type", "BPE"},
                                {"vocab", {{"a", 0}}},
                                {"merges", nlohmann::json::array()},
                                {"dropout", 0.1}})
                .status()
                .code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace deepinfer::tokenizer
