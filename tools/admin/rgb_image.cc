#include "tools/admin/rgb_image.h"

#include <algorithm>

#include "glog/logging.h"
#include "tools/admin/bitmap_font.h"
#include "tools/admin/png_writer.h"

namespace deepinfer {

RgbImage::RgbImage(int width, int height, Rgb background) : width_(width), height_(height) {
  CHECK_GE(width, 1);
  CHECK_GE(height, 1);
  rgb_.resize(static_cast<size_t>(width) * height * 3);
  FillRect(0, 0, width, height, background);
}

Rgb RgbImage::At(int x, int y) const {
  CHECK(x >= 0 && x < width_ && y >= 0 && y < height_) << x << "," << y;
  const uint8_t* p = rgb_.data() + (static_cast<size_t>(y) * width_ + x) * 3;
  return {p[0], p[1], p[2]};
}

void RgbImage::Set(int x, int y, Rgb colour) {
  if (x < 0 || x >= width_ || y < 0 || y >= height_) return;
  uint8_t* p = rgb_.data() + (static_cast<size_t>(y) * width_ + x) * 3;
  p[0] = colour.r;
  p[1] = colour.g;
  p[2] = colour.b;
}

void RgbImage::FillRect(int x, int y, int w, int h, Rgb colour) {
  const int x0 = std::max(0, x), x1 = std::min(width_, x + w);
  const int y0 = std::max(0, y), y1 = std::min(height_, y + h);
  for (int py = y0; py < y1; ++py) {
    for (int px = x0; px < x1; ++px) Set(px, py, colour);
  }
}

void RgbImage::StrokeRect(int x, int y, int w, int h, Rgb colour) {
  FillRect(x, y, w, 1, colour);
  FillRect(x, y + h - 1, w, 1, colour);
  FillRect(x, y, 1, h, colour);
  FillRect(x + w - 1, y, 1, h, colour);
}

int RgbImage::TextWidth(const std::string& text, int scale) {
  if (text.empty()) return 0;
  return static_cast<int>(text.size()) * (kGlyphWidth + 1) * scale - scale;
}

int RgbImage::TextHeight(int scale) { return kGlyphHeight * scale; }

void RgbImage::DrawText(int x, int y, const std::string& text, int scale, Rgb colour) {
  for (char c : text) {
    const Glyph& glyph = GlyphFor(c);
    for (int row = 0; row < kGlyphHeight; ++row) {
      for (int col = 0; col < kGlyphWidth; ++col) {
        if (glyph[row][col] == '#') {
          FillRect(x + col * scale, y + row * scale, scale, scale, colour);
        }
      }
    }
    x += (kGlyphWidth + 1) * scale;
  }
}

absl::StatusOr<std::string> RgbImage::EncodePng() const {
  return ::deepinfer::EncodePng(width_, height_, rgb_);
}

}  // namespace deepinfer
