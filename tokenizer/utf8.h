// UTF-8 helpers shared by the tokenizer: code point decoding, lossy repair of invalid input
// (the same replacement rule as Rust's String::from_utf8_lossy and the WHATWG decoder, which is
// what HF tokenizers and Node apply), and the GPT-2 byte-to-unicode alphabet used by ByteLevel.
#ifndef TOKENIZER_UTF8_H_
#define TOKENIZER_UTF8_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace deepinfer::tokenizer {

// Length in bytes of the valid UTF-8 sequence starting at text[pos], or 0 when the bytes there
// are not a complete, valid sequence.
size_t ValidUtf8SequenceLength(absl::string_view text, size_t pos);

// Decodes the code point at text[pos]; text must be valid UTF-8 there. Sets *length.
char32_t DecodeCodePoint(absl::string_view text, size_t pos, size_t* length);

void AppendCodePoint(char32_t code_point, std::string* out);

bool IsValidUtf8(absl::string_view text);

// Replaces every maximal invalid subsequence by U+FFFD (Rust from_utf8_lossy / WHATWG rule).
std::string RepairUtf8(absl::string_view text);

// Unicode White_Space (what Rust's char::is_whitespace tests).
bool IsUnicodeWhitespace(char32_t code_point);

// GPT-2's reversible byte <-> printable-character mapping.
class ByteLevelAlphabet {
 public:
  static const ByteLevelAlphabet& Get();

  // UTF-8 encoding of the character standing for `byte`.
  const std::string& CharFor(uint8_t byte) const { return byte_to_char_[byte]; }
  // The byte a code point stands for, or -1 if it is not in the alphabet.
  int ByteFor(char32_t code_point) const {
    return code_point < char_to_byte_.size() ? char_to_byte_[code_point] : -1;
  }

 private:
  ByteLevelAlphabet();
  std::array<std::string, 256> byte_to_char_;
  std::array<int16_t, 512> char_to_byte_;
};

}  // namespace deepinfer::tokenizer

#endif  // TOKENIZER_UTF8_H_
