// RgbImage: an 8-bit RGB raster for deepinfer-admin's PNG pictures, with the few drawing
// operations a chart needs (filled rectangles, text in the 5x7 bitmap font at an integer
// scale) and PNG encoding (png_writer.h). Coordinates are pixels, origin top left; drawing
// outside the image is clipped.
#ifndef DEEPINFER_TOOLS_ADMIN_RGB_IMAGE_H_
#define DEEPINFER_TOOLS_ADMIN_RGB_IMAGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace deepinfer {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb& o) const { return r == o.r && g == o.g && b == o.b; }
  bool operator!=(const Rgb& o) const { return !(*this == o); }
};

class RgbImage {
 public:
  // CHECK-fails on sizes below 1 (callers compute them).
  RgbImage(int width, int height, Rgb background);

  int width() const { return width_; }
  int height() const { return height_; }
  Rgb At(int x, int y) const;  // CHECK-fails outside the image

  void Set(int x, int y, Rgb colour);
  void FillRect(int x, int y, int w, int h, Rgb colour);
  // The outline of a rectangle, one pixel wide, inside (x, y, w, h).
  void StrokeRect(int x, int y, int w, int h, Rgb colour);

  // Text with its top-left corner at (x, y), each font pixel a scale x scale square, one
  // font pixel between characters.
  void DrawText(int x, int y, const std::string& text, int scale, Rgb colour);
  static int TextWidth(const std::string& text, int scale);
  static int TextHeight(int scale);

  absl::StatusOr<std::string> EncodePng() const;

 private:
  int width_, height_;
  std::vector<uint8_t> rgb_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_TOOLS_ADMIN_RGB_IMAGE_H_
