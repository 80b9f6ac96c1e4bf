#include "tokenizer/utf8.h"

#include <string>

#include "gtest/gtest.h"

namespace deepinfer::tokenizer {
namespace {

constexpr char kFffd[] = "\xEF\xBF\xBD";

// Expected values follow the WHATWG / Rust from_utf8_lossy rule: one U+FFFD per maximal
// subpart of an ill-formed sequence.
TEST(Utf8Test, RepairReplacesMaximalInvalidSubparts) {
  EXPECT_EQ(RepairUtf8("plain é 你 😀"), "plain é 你 😀");
  EXPECT_EQ(RepairUtf8("\xE4\xBD"), kFffd);  // truncated 3-byte
  EXPECT_EQ(RepairUtf8("\xE4\xBD"
                       "a"),
            std::string(kFffd) + "a");
  EXPECT_EQ(RepairUtf8("\xC0\xAF"), std::string(kFffd) + kFffd);              // overlong
  EXPECT_EQ(RepairUtf8("\xED\xA0\x80"), std::string(kFffd) + kFffd + kFffd);  // surrogate
  EXPECT_EQ(RepairUtf8("\xF4\x90\x80\x80"), std::string(kFffd) + kFffd + kFffd + kFffd);
  EXPECT_EQ(RepairUtf8("\xF0\x9F\x98"
                       "x"),
            std::string(kFffd) + "x");
  EXPECT_EQ(RepairUtf8("\x80\xFF"), std::string(kFffd) + kFffd);
}

TEST(Utf8Test, Validity) {
  EXPECT_TRUE(IsValidUtf8("ok 你"));
  EXPECT_FALSE(IsValidUtf8("\xE4\xBD"));
}

TEST(Utf8Test, CodePoints) {
  size_t length = 0;
  EXPECT_EQ(DecodeCodePoint("😀", 0, &length), U'\U0001F600');
  EXPECT_EQ(length, 4u);
  std::string out;
  AppendCodePoint(0x4F60, &out);
  EXPECT_EQ(out, "你");
  EXPECT_TRUE(IsUnicodeWhitespace(0x3000));
  EXPECT_FALSE(IsUnicodeWhitespace('x'));
}

TEST(Utf8Test, ByteLevelAlphabetIsGpt2s) {
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  EXPECT_EQ(alphabet.CharFor(' '), "Ġ");
  EXPECT_EQ(alphabet.CharFor('\n'), "Ċ");
  EXPECT_EQ(alphabet.CharFor('a'), "a");
  for (int b = 0; b < 256; ++b) {
    size_t length;
    EXPECT_EQ(alphabet.ByteFor(DecodeCodePoint(alphabet.CharFor(b), 0, &length)), b);
  }
  EXPECT_EQ(alphabet.ByteFor(0x4F60), -1);
}

}  // namespace
}  // namespace deepinfer::tokenizer
