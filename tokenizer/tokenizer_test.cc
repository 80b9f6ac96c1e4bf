#include "tokenizer/tokenizer.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tokenizer/test_tokenizer_json.h"

namespace deepinfer::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<Tokenizer> Load(const nlohmann::json& tokenizer_json,
                                const nlohmann::json& config = nullptr) {
  auto tokenizer = Tokenizer::FromJson(tokenizer_json.dump(), config);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

TEST(TokenizerTest, EncodesWithMergesAndDecodes) {
  auto tokenizer = Load(TestTokenizerJson());
  EXPECT_THAT(tokenizer->Encode("hello world", false), ElementsAre(259, 264));
  // "hellx": "hell" then the byte-level 'x'.
  EXPECT_THAT(tokenizer->Encode("hellx", false), ElementsAre(258, 'x'));
  auto decoded = tokenizer->Decode({259, 264}, false);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, "hello world");
}

TEST(TokenizerTest, AddedTokensAreCutOutAndSkippableWhenDecoding) {
  auto tokenizer = Load(TestTokenizerJson());
  EXPECT_THAT(tokenizer->Encode("<s>hello</s>", false), ElementsAre(265, 259, 266));
  // <tool> strips the spaces around it.
  EXPECT_THAT(tokenizer->Encode("hello  <tool>  hello", false), ElementsAre(259, 267, 259));
  auto with_special = tokenizer->Decode({265, 259, 266}, false);
  auto without_special = tokenizer->Decode({265, 259, 266}, true);
  ASSERT_TRUE(with_special.ok() && without_special.ok());
  EXPECT_EQ(*with_special, "<s>hello</s>");
  EXPECT_EQ(*without_special, "hello");
  EXPECT_EQ(tokenizer->Decode({99999}, false).status().code(), absl::StatusCode::kOutOfRange);
}

// HF tokenizers' decode leaves out ids it does not know; Decode refuses them.
TEST(TokenizerTest, DecodeSkippingUnknownLeavesUnknownIdsOut) {
  auto tokenizer = Load(TestTokenizerJson());
  EXPECT_EQ(tokenizer->DecodeSkippingUnknown({99999, 259, 4000, 264, 99999}, false), "hello world");
  EXPECT_EQ(tokenizer->DecodeSkippingUnknown({265, 4000, 266}, false), "<s></s>");
  EXPECT_EQ(tokenizer->DecodeSkippingUnknown({265, 4000, 266}, true), "");
  EXPECT_EQ(tokenizer->DecodeSkippingUnknown({4000}, false), "");
  auto strict = tokenizer->Decode({259, 4000}, false);
  EXPECT_EQ(strict.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(strict.status().message(), HasSubstr("4000"));
}

TEST(TokenizerTest, TemplatePostProcessorOnlyWithSpecialTokens) {
  const nlohmann::json post = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
      {"special_tokens",
       {{"<s>", {{"id", "<s>"}, {"ids", {265}}, {"tokens", {"<s>"}}}},
        {"</s>", {{"id", "</s>"}, {"ids", {266}}, {"tokens", {"</s>"}}}}}}};
  auto tokenizer = Load(TestTokenizerJson(post));
  EXPECT_THAT(tokenizer->Encode("hello", true), ElementsAre(265, 259, 266));
  EXPECT_THAT(tokenizer->Encode("hello", false), ElementsAre(259));
}

TEST(TokenizerTest, LlamaConfigAddsBosLikeTransformers) {
  const nlohmann::json config = {{"tokenizer_class", "LlamaTokenizerFast"},
                                 {"add_bos_token", true},
                                 {"bos_token", {{"content", "<s>"}}},
                                 {"eos_token", "</s>"}};
  auto tokenizer = Load(TestTokenizerJson(), config);
  EXPECT_THAT(tokenizer->Encode("hello", true), ElementsAre(265, 259));
  nlohmann::json with_eos = config;
  with_eos["add_bos_token"] = false;
  with_eos["add_eos_token"] = true;
  EXPECT_THAT(Load(TestTokenizerJson(), with_eos)->Encode("hello", true), ElementsAre(259, 266));
  // Other classes keep tokenizer.json's post-processor (none here).
  nlohmann::json other = config;
  other["tokenizer_class"] = "PreTrainedTokenizerFast";
  EXPECT_THAT(Load(TestTokenizerJson(), other)->Encode("hello", true), ElementsAre(259));
}

TEST(TokenizerTest, AddedTokenIdsAreAssignedAsHfDoes) {
  nlohmann::json json = TestTokenizerJson();
  // Ids in the file are ignored: content already in the vocabulary keeps its id, new content
  // gets the next free id after the vocabulary.
  json["added_tokens"].push_back({{"id", 999}, {"content", "hello"}, {"special", false}});
  json["added_tokens"].push_back({{"id", 5}, {"content", "<new>"}, {"special", true}});
  auto tokenizer = Load(json);
  EXPECT_EQ(tokenizer->TokenToId("hello"), 259u);
  EXPECT_EQ(tokenizer->TokenToId("<new>"), 269u);
  EXPECT_THAT(tokenizer->Encode("<new>hello", false), ElementsAre(269, 259));
}

TEST(TokenizerTest, InvalidUtf8IsRepairedToReplacementCharacter) {
  auto tokenizer = Load(TestTokenizerJson());
  const std::vector<uint32_t> ids = tokenizer->Encode(
      "a\xFF"
      "b",
      false);
  auto decoded = tokenizer->Decode(ids, false);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded,
            "a\xEF\xBF\xBD"
            "b");
}

TEST(TokenizerTest, RejectsUnsupportedOrBrokenFiles) {
  EXPECT_EQ(Tokenizer::FromJson("{not json", nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  nlohmann::json unigram = TestTokenizerJson();
  unigram["model"]["type"] = "Unigram";
  EXPECT_EQ(Tokenizer::FromJson(unigram.dump(), nullptr).status().code(),
            absl::StatusCode::kUnimplemented);
  nlohmann::json nfc = TestTokenizerJson();
  nfc["normalizer"] = {{"type", "NFC"}};
  EXPECT_EQ(Tokenizer::FromJson(nfc.dump(), nullptr).status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(TokenizerTest, FromDirectory) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/model";
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  EXPECT_EQ(Tokenizer::FromDirectory(dir).status().code(), absl::StatusCode::kNotFound);
  std::ofstream(dir + "/tokenizer.json") << TestTokenizerJson().dump();
  auto tokenizer = Tokenizer::FromDirectory(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_THAT((*tokenizer)->Encode("hello", true), ElementsAre(259));
  std::ofstream(dir + "/tokenizer_config.json") << "{broken";
  EXPECT_EQ(Tokenizer::FromDirectory(dir).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deepinfer::tokenizer
