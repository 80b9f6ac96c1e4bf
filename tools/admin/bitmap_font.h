// A 5x7 pixel font for the text in deepinfer-admin's PNG pictures (titles, axis labels, tick
// numbers): digits, capital letters and the punctuation numbers and labels need. Lower-case
// letters are drawn as capitals; any other character as '?'.
#ifndef DEEPINFER_TOOLS_ADMIN_BITMAP_FONT_H_
#define DEEPINFER_TOOLS_ADMIN_BITMAP_FONT_H_

#include <array>

namespace deepinfer {

constexpr int kGlyphWidth = 5;
constexpr int kGlyphHeight = 7;

// One glyph: kGlyphHeight rows, top first, of kGlyphWidth characters, '#' for ink.
using Glyph = std::array<const char*, kGlyphHeight>;

// The glyph of `c` (see the top comment for characters the font lacks).
const Glyph& GlyphFor(char c);

// Whether the font has a glyph of its own for `c` (before the lower-case and '?' fallbacks).
bool HasGlyph(char c);

}  // namespace deepinfer

#endif  // DEEPINFER_TOOLS_ADMIN_BITMAP_FONT_H_
