// A minimal PNG encoder for `deepinfer-admin expert-load --plot`: 8-bit RGB, no filtering,
// the image data in stored (uncompressed) deflate blocks inside a zlib stream, with the CRC-32
// of every chunk and the Adler-32 of the data. Enough for small heat maps; no dependency.
#ifndef DEEPINFER_TOOLS_ADMIN_PNG_WRITER_H_
#define DEEPINFER_TOOLS_ADMIN_PNG_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deepinfer {

// CRC-32 (ISO 3309, as PNG uses it) and Adler-32 (zlib), exposed for tests.
uint32_t Crc32(absl::string_view data, uint32_t crc = 0);
uint32_t Adler32(absl::string_view data);

// `rgb` is height rows of width pixels, 3 bytes each. INVALID_ARGUMENT for empty or
// mismatched sizes.
absl::StatusOr<std::string> EncodePng(int width, int height, const std::vector<uint8_t>& rgb);

}  // namespace deepinfer

#endif  // DEEPINFER_TOOLS_ADMIN_PNG_WRITER_H_
