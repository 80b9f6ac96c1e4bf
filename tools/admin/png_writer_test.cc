// EncodePng: the checksums against their published check values, and a written image read
// back independently -- chunk layout and CRCs walked here, the IDAT stream inflated by the
// system zlib (which verifies the Adler-32), the scanlines compared with the input pixels.
#include "tools/admin/png_writer.h"

#include <zlib.h>

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

uint32_t GetU32(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) |
         (uint32_t(uint8_t(s[at + 2])) << 8) | uint32_t(uint8_t(s[at + 3]));
}

TEST(PngWriterTest, ChecksumsMatchPublishedCheckValues) {
  EXPECT_EQ(Crc32("123456789"), 0xCBF43926u);
  EXPECT_EQ(Crc32(""), 0u);
  EXPECT_EQ(Adler32("Wikipedia"), 0x11E60398u);
  EXPECT_EQ(Adler32(""), 1u);
  // Against zlib's own implementations on arbitrary bytes.
  std::string bytes;
  for (int i = 0; i < 100000; ++i) bytes.push_back(static_cast<char>((i * 131 + i / 7) & 0xFF));
  EXPECT_EQ(Crc32(bytes), crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
  EXPECT_EQ(Adler32(bytes), adler32(1, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

void ExpectDecodes(int width, int height) {
  SCOPED_TRACE(testing::Message() << width << "x" << height);
  std::mt19937 gen(width * 1000 + height);
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3);
  for (uint8_t& b : rgb) b = static_cast<uint8_t>(gen());
  auto png = EncodePng(width, height, rgb);
  ASSERT_TRUE(png.ok()) << png.status();
  const std::string& s = *png;
  ASSERT_EQ(s.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  size_t at = 8;
  std::vector<std::string> types;
  std::string idat;
  while (at < s.size()) {
    ASSERT_LE(at + 12, s.size());
    const uint32_t len = GetU32(s, at);
    ASSERT_LE(at + 12 + len, s.size());
    const std::string type = s.substr(at + 4, 4);
    const std::string typed = s.substr(at + 4, 4 + len);
    EXPECT_EQ(GetU32(s, at + 8 + len),
              crc32(0, reinterpret_cast<const Bytef*>(typed.data()), typed.size()))
        << "CRC of " << type;
    if (type == "IHDR") {
      ASSERT_EQ(len, 13u);
      EXPECT_EQ(GetU32(s, at + 8), static_cast<uint32_t>(width));
      EXPECT_EQ(GetU32(s, at + 12), static_cast<uint32_t>(height));
      EXPECT_EQ(s[at + 16], 8);  // bit depth
      EXPECT_EQ(s[at + 17], 2);  // RGB
    }
    if (type == "IDAT") idat += s.substr(at + 8, len);
    types.push_back(type);
    at += 12 + len;
  }
  EXPECT_EQ(types, (std::vector<std::string>{"IHDR", "IDAT", "IEND"}));
  std::vector<uint8_t> raw(static_cast<size_t>(height) * (1 + width * 3) + 1);
  uLongf raw_len = raw.size();
  ASSERT_EQ(
      uncompress(raw.data(), &raw_len, reinterpret_cast<const Bytef*>(idat.data()), idat.size()),
      Z_OK);
  ASSERT_EQ(raw_len, static_cast<uLongf>(height) * (1 + width * 3));
  for (int y = 0; y < height; ++y) {
    const uint8_t* row = raw.data() + static_cast<size_t>(y) * (1 + width * 3);
    EXPECT_EQ(row[0], 0) << "filter of row " << y;
    EXPECT_TRUE(std::equal(row + 1, row + 1 + width * 3, rgb.begin() + y * width * 3))
        << "row " << y;
  }
}

TEST(PngWriterTest, WrittenImagesDecode) {
  ExpectDecodes(1, 1);
  ExpectDecodes(7, 3);
  // More than one stored deflate block (65535 bytes each).
  ExpectDecodes(300, 100);
}

TEST(PngWriterTest, BadSizesAreRefused) {
  EXPECT_FALSE(EncodePng(0, 1, {}).ok());
  EXPECT_FALSE(EncodePng(2, 2, std::vector<uint8_t>(11)).ok());
}

}  // namespace
}  // namespace deepinfer
