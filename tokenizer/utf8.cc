#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

// Number of bytes of a (possibly incomplete) sequence at text[pos] that are consistent with
// valid UTF-8, and the length the sequence needs. `needed` is 0 for an invalid lead byte.
void ScanSequence(absl::string_view text, size_t pos, size_t* consistent, size_t* needed) {
  const uint8_t lead = static_cast<uint8_t>(text[pos]);
  uint8_t low = 0x80, high = 0xBF;  // allowed range of the second byte
  if (lead < 0x80) {
    *consistent = *needed = 1;
    return;
  } else if (lead >= 0xC2 && lead <= 0xDF) {
    *needed = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    *needed = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    *needed = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    *consistent = 0;
    *needed = 0;
    return;
  }
  size_t i = 1;
  for (; i < *needed && pos + i < text.size(); ++i) {
    const uint8_t b = static_cast<uint8_t>(text[pos + i]);
    const uint8_t lo = i == 1 ? low : 0x80, hi = i == 1 ? high : 0xBF;
    if (b < lo || b > hi) break;
  }
  *consistent = i;
}

}  // namespace

size_t ValidUtf8SequenceLength(absl::string_view text, size_t pos) {
  size_t consistent, needed;
  ScanSequence(text, pos, &consistent, &needed);
  return needed != 0 && consistent == needed ? needed : 0;
}

char32_t DecodeCodePoint(absl::string_view text, size_t pos, size_t* length) {
  const uint8_t lead = static_cast<uint8_t>(text[pos]);
  if (lead < 0x80) {
    *length = 1;
    return lead;
  }
  size_t n = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
  char32_t cp = lead & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<uint8_t>(text[pos + i]) & 0x3F);
  *length = n;
  return cp;
}

void AppendCodePoint(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsValidUtf8(absl::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t n = ValidUtf8SequenceLength(text, pos);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

std::string RepairUtf8(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    size_t consistent, needed;
    ScanSequence(text, pos, &consistent, &needed);
    if (needed != 0 && consistent == needed) {
      out.append(text.data() + pos, needed);
      pos += needed;
    } else {
      out.append("\xEF\xBF\xBD");
      pos += consistent == 0 ? 1 : consistent;
    }
  }
  return out;
}

bool IsUnicodeWhitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

const ByteLevelAlphabet& ByteLevelAlphabet::Get() {
  static const ByteLevelAlphabet* alphabet = new ByteLevelAlphabet();
  return *alphabet;
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  char_to_byte_.fill(-1);
  int next_extra = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const char32_t cp = printable ? b : next_extra++;
    AppendCodePoint(cp, &byte_to_char_[b]);
    char_to_byte_[cp] = static_cast<int16_t>(b);
  }
}

}  // namespace deepinfer::tokenizer
