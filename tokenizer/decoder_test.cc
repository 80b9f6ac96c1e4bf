#include "tokenizer/decoder.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer::tokenizer {
namespace {

std::string Decode(const nlohmann::json& config, std::vector<std::string> tokens) {
  auto decoder = Decoder::FromJson(config);
  EXPECT_TRUE(decoder.ok()) << decoder.status();
  return Decoder::Decode(decoder->get(), std::move(tokens));
}

TEST(DecoderTest, ByteLevel) {
  const nlohmann::json config = {{"type", "ByteLevel"}};
  EXPECT_EQ(Decode(config, {"Hello", "Ġworld", "Ċ"}), "Hello world\n");
  EXPECT_EQ(Decode(config, {"ä½", "ł"}), "你");
  // A token outside the byte alphabet (an added token) is kept as its own text.
  EXPECT_EQ(Decode(config, {"<｜User｜>", "Ġhi"}), "<｜User｜> hi");
  // A character cut short decodes to U+FFFD.
  EXPECT_EQ(Decode(config, {"ä½"}), "\xEF\xBF\xBD");
}

TEST(DecoderTest, ByteFallbackRuns) {
  const nlohmann::json config = {{"type", "ByteFallback"}};
  EXPECT_EQ(Decode(config, {"<0xE4>", "<0xBD>", "<0xA0>", "a"}), "你a");
  // An invalid run gives one U+FFFD per byte token (HF's rule, unlike lossy UTF-8).
  EXPECT_EQ(Decode(config, {"<0xE4>", "<0xBD>", "a"}),
            "\xEF\xBF\xBD\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(Decode(config, {"<0x41>", "<0xZZ>"}), "A<0xZZ>");
}

TEST(DecoderTest, LlamaStyleSequence) {
  const nlohmann::json config = {
      {"type", "Sequence"},
      {"decoders",
       {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
        {{"type", "ByteFallback"}},
        {{"type", "Fuse"}},
        {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  EXPECT_EQ(Decode(config, {"▁Hello", "▁world", "<0x21>"}), "Hello world!");
}

TEST(DecoderTest, NoDecoderJoinsWithSpaces) {
  EXPECT_EQ(Decoder::Decode(nullptr, {"a", "b"}), "a b");
}

TEST(DecoderTest, RejectsUnknownTypes) {
  EXPECT_EQ(Decoder::FromJson({{"type", "WordPiece"}}).status().code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace deepinfer::tokenizer
