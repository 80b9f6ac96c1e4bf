#include "tokenizer/incremental_decoder.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tokenizer/test_tokenizer_json.h"

namespace deepinfer::tokenizer {
namespace {

// In the test tokenizer ids 0..255 are single bytes, so characters can be split across ids.
class IncrementalDecoderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tokenizer = Tokenizer::FromJson(TestTokenizerJson().dump(), nullptr);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
  }
  std::vector<std::string> Stream(const std::vector<uint32_t>& ids, std::string* rest) {
    IncrementalDecoder decoder(tokenizer_.get(), false);
    std::vector<std::string> pieces;
    for (uint32_t id : ids) pieces.push_back(decoder.Add(id));
    *rest = decoder.Finish();
    return pieces;
  }
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(IncrementalDecoderTest, HoldsBackSplitCharacters) {
  std::string rest;
  // "a😀b": the emoji is F0 9F 98 80, one id per byte.
  const std::vector<std::string> pieces = Stream({'a', 0xF0, 0x9F, 0x98, 0x80, 'b'}, &rest);
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "", "", "", "😀", "b"}));
  EXPECT_EQ(rest, "");
}

TEST_F(IncrementalDecoderTest, InvalidBytesComeOutAsReplacementOnceSettled) {
  std::string rest;
  const std::vector<std::string> pieces = Stream({'a', 0xFF, 'b', 0xE4}, &rest);
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "",
                                              "\xEF\xBF\xBD"
                                              "b",
                                              ""}));
  // The stream ended inside a character: Finish gives what one-shot decoding gives.
  EXPECT_EQ(rest, "\xEF\xBF\xBD");
}

TEST_F(IncrementalDecoderTest, MergedAndAddedTokens) {
  std::string rest;
  const std::vector<std::string> pieces = Stream({265, 259, 264, 266}, &rest);
  EXPECT_EQ(pieces, (std::vector<std::string>{"<s>", "hello", " world", "</s>"}));
  IncrementalDecoder skipping(tokenizer_.get(), /*skip_special_tokens=*/true);
  EXPECT_EQ(skipping.Add(265), "");
  EXPECT_EQ(skipping.Add(259), "hello");
  EXPECT_EQ(skipping.Add(264), " world");
}

// Ids past the tokenizer's vocabulary (a model may generate them) add no text, as in HF, and
// do not disturb the characters being assembled around them.
TEST_F(IncrementalDecoderTest, UnknownIdsAddNoText) {
  std::string rest;
  // "a😀b" with unknown ids before, inside and after the emoji's bytes.
  const std::vector<std::string> pieces =
      Stream({99999, 'a', 0xF0, 0x9F, 4000, 0x98, 0x80, 99999, 'b', 4000}, &rest);
  EXPECT_EQ(pieces, (std::vector<std::string>{"", "a", "", "", "", "", "😀", "", "b", ""}));
  EXPECT_EQ(rest, "");
  // Only unknown ids: no text at all.
  EXPECT_EQ(Stream({4000, 99999}, &rest), (std::vector<std::string>{"", ""}));
  EXPECT_EQ(rest, "");
}

// A Llama-style byte-fallback tokenizer: "<0xE4><0xBD><0xA0>" is "你", and the decoder strips
// the first token's leading space, so windows that start mid-stream must not lose spaces.
TEST(IncrementalDecoderByteFallbackTest, StreamsByteTokensAndKeepsSpaces) {
  const nlohmann::json json = {
      {"added_tokens", nlohmann::json::array()},
      {"model",
       {{"type", "BPE"},
        {"vocab",
         {{"<unk>", 0}, {"▁a", 1}, {"<0xE4>", 2}, {"<0xBD>", 3}, {"<0xA0>", 4}, {"▁b", 5}}},
        {"merges", nlohmann::json::array()},
        {"unk_token", "<unk>"},
        {"byte_fallback", true}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}}};
  auto tokenizer = Tokenizer::FromJson(json.dump(), nullptr);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  IncrementalDecoder decoder(tokenizer->get(), false);
  std::vector<std::string> pieces;
  for (uint32_t id : {1, 2, 3, 4, 5, 5}) pieces.push_back(decoder.Add(id));
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "", "", "你", " b", " b"}));
  auto one_shot = (*tokenizer)->Decode({1, 2, 3, 4, 5, 5}, false);
  ASSERT_TRUE(one_shot.ok());
  EXPECT_EQ(*one_shot, "a你 b b");
}

}  // namespace
}  // namespace deepinfer::tokenizer
