// RgbImage and the 5x7 font: glyph table shape, text drawn pixel for pixel from its glyphs at
// scale 1 and 2, widths, the lower-case and '?' fallbacks, clipping, rectangles.
#include "tools/admin/rgb_image.h"

#include <set>
#include <string>

#include "gtest/gtest.h"
#include "tools/admin/bitmap_font.h"

namespace deepinfer {
namespace {

constexpr Rgb kWhite{255, 255, 255}, kInk{0, 0, 0};

TEST(BitmapFontTest, EveryGlyphIsFiveBySevenAndDigitsDiffer) {
  const std::string chars = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ .,:/-+=()%_?";
  std::set<std::string> digits;
  for (char c : chars) {
    ASSERT_TRUE(HasGlyph(c)) << c;
    int ink = 0;
    std::string bits;
    for (const char* row : GlyphFor(c)) {
      ASSERT_EQ(std::string(row).size(), static_cast<size_t>(kGlyphWidth)) << c;
      for (int i = 0; i < kGlyphWidth; ++i) {
        ASSERT_TRUE(row[i] == '#' || row[i] == ' ') << c;
        ink += row[i] == '#';
      }
      bits += row;
    }
    EXPECT_EQ(ink == 0, c == ' ') << c;
    if (c >= '0' && c <= '9') digits.insert(bits);
  }
  EXPECT_EQ(digits.size(), 10u);
  EXPECT_FALSE(HasGlyph('a'));
  EXPECT_EQ(&GlyphFor('a'), &GlyphFor('A'));
  EXPECT_EQ(&GlyphFor('~'), &GlyphFor('?'));
}

// The ink of `text` drawn at (x, y) is exactly its glyphs, scaled; nothing else changes.
void ExpectText(const std::string& text, int scale) {
  SCOPED_TRACE(text + " at scale " + std::to_string(scale));
  RgbImage img(80, 30, kWhite);
  const int x0 = 3, y0 = 4;
  img.DrawText(x0, y0, text, scale, kInk);
  for (int y = 0; y < img.height(); ++y) {
    for (int x = 0; x < img.width(); ++x) {
      bool want = false;
      const int col = (x - x0) / scale, row = (y - y0) / scale;
      if (x >= x0 && y >= y0 && row < kGlyphHeight) {
        const int ch = col / (kGlyphWidth + 1), in = col % (kGlyphWidth + 1);
        if (ch < static_cast<int>(text.size()) && in < kGlyphWidth) {
          want = GlyphFor(text[ch])[row][in] == '#';
        }
      }
      ASSERT_EQ(img.At(x, y) == kInk, want) << x << "," << y;
    }
  }
}

TEST(RgbImageTest, TextIsItsGlyphs) {
  ExpectText("1.5K", 1);
  ExpectText("GPU 7", 1);
  ExpectText("MAX", 2);
  EXPECT_EQ(RgbImage::TextWidth("", 2), 0);
  EXPECT_EQ(RgbImage::TextWidth("A", 1), 5);
  EXPECT_EQ(RgbImage::TextWidth("AB", 2), 22);  // 5 + 1 + 5 font pixels
  EXPECT_EQ(RgbImage::TextHeight(3), 21);
}

TEST(RgbImageTest, RectanglesAndClipping) {
  RgbImage img(10, 8, kWhite);
  img.FillRect(-5, -5, 8, 7, kInk);  // clipped to (0,0)-(2,1)
  EXPECT_EQ(img.At(2, 1), kInk);
  EXPECT_EQ(img.At(3, 1), kWhite);
  EXPECT_EQ(img.At(2, 2), kWhite);
  img.DrawText(8, 6, "888", 3, kInk);  // mostly outside: no crash
  const Rgb red{200, 0, 0};
  img.StrokeRect(4, 2, 4, 4, red);
  EXPECT_EQ(img.At(4, 2), red);
  EXPECT_EQ(img.At(7, 5), red);
  EXPECT_EQ(img.At(5, 3), kWhite);  // inside stays
  auto png = img.EncodePng();
  ASSERT_TRUE(png.ok()) << png.status();
  EXPECT_EQ(png->substr(1, 3), "PNG");
}

}  // namespace
}  // namespace deepinfer
