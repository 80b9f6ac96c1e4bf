#include "tools/admin/png_writer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace deepinfer {
namespace {

void PutU32(std::string* out, uint32_t v) {
  out->push_back(static_cast<char>(v >> 24));
  out->push_back(static_cast<char>(v >> 16));
  out->push_back(static_cast<char>(v >> 8));
  out->push_back(static_cast<char>(v));
}

void PutChunk(std::string* out, const char type[4], absl::string_view data) {
  PutU32(out, static_cast<uint32_t>(data.size()));
  std::string typed(type, 4);
  typed.append(data.data(), data.size());
  out->append(typed);
  PutU32(out, Crc32(typed));
}

}  // namespace

uint32_t Crc32(absl::string_view data, uint32_t crc) {
  crc = ~crc;
  for (unsigned char c : data) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint32_t Adler32(absl::string_view data) {
  uint32_t a = 1, b = 0;
  for (unsigned char c : data) {
    a = (a + c) % 65521;
    b = (b + a) % 65521;
  }
  return (b << 16) | a;
}

absl::StatusOr<std::string> EncodePng(int width, int height, const std::vector<uint8_t>& rgb) {
  if (width <= 0 || height <= 0 ||
      rgb.size() != static_cast<size_t>(width) * static_cast<size_t>(height) * 3) {
    return absl::InvalidArgumentError(absl::StrCat("PNG of ", width, "x", height, " needs ",
                                                   static_cast<int64_t>(width) * height * 3,
                                                   " RGB bytes, got ", rgb.size()));
  }
  // Raw scanlines: filter type 0 (none) before each row.
  std::string raw;
  raw.reserve(static_cast<size_t>(height) * (1 + width * 3));
  for (int y = 0; y < height; ++y) {
    raw.push_back('\0');
    raw.append(reinterpret_cast<const char*>(rgb.data()) + static_cast<size_t>(y) * width * 3,
               static_cast<size_t>(width) * 3);
  }
  // zlib: header (deflate, 32K window, no dictionary, check bits), stored blocks of at most
  // 65535 bytes (BFINAL on the last, LEN and its complement little-endian), Adler-32.
  std::string z = {'\x78', '\x01'};
  size_t pos = 0;
  do {
    const size_t n = std::min<size_t>(65535, raw.size() - pos);
    const bool last = pos + n == raw.size();
    z.push_back(last ? '\x01' : '\x00');
    z.push_back(static_cast<char>(n & 0xFF));
    z.push_back(static_cast<char>(n >> 8));
    z.push_back(static_cast<char>(~n & 0xFF));
    z.push_back(static_cast<char>((~n >> 8) & 0xFF));
    z.append(raw, pos, n);
    pos += n;
  } while (pos < raw.size());
  PutU32(&z, Adler32(raw));

  std::string png = "\x89PNG\r\n\x1a\n";
  std::string ihdr;
  PutU32(&ihdr, static_cast<uint32_t>(width));
  PutU32(&ihdr, static_cast<uint32_t>(height));
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit, RGB, deflate, no filter, no interlace
  PutChunk(&png, "IHDR", ihdr);
  PutChunk(&png, "IDAT", z);
  PutChunk(&png, "IEND", "");
  return png;
}

}  // namespace deepinfer
