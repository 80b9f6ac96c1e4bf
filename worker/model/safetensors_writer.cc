// SafetensorsWriter: header JSON + concatenated tensor bytes.
#include "worker/model/safetensors_writer.h"

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace deepinfer {

void SafetensorsWriter::Add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                            std::vector<uint8_t> bytes) {
  entries_.push_back({name, dtype, shape, std::move(bytes)});
}

void SafetensorsWriter::AddFloat32(const std::string& name, const std::vector<int64_t>& shape,
                                   const std::vector<float>& values) {
  std::vector<uint8_t> b(values.size() * 4);
  if (!values.empty()) std::memcpy(b.data(), values.data(), b.size());
  Add(name, DType::kF32, shape, std::move(b));
}

void SafetensorsWriter::AddBf16(const std::string& name, const std::vector<int64_t>& shape,
                                const std::vector<float>& values) {
  std::vector<uint8_t> b(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &values[i], 4);
    u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
    const uint16_t h = static_cast<uint16_t>(u >> 16);
    std::memcpy(b.data() + 2 * i, &h, 2);
  }
  Add(name, DType::kBF16, shape, std::move(b));
}

absl::Status SafetensorsWriter::Write(const std::string& path) const {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const Entry& e : entries_) {
    header[e.name] = {{"dtype", DTypeName(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');  // data section 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat(path, ": cannot create"));
  uint64_t len = h.size();
  char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  out.write(len_bytes, 8);
  out.write(h.data(), h.size());
  for (const Entry& e : entries_) {
    out.write(reinterpret_cast<const char*>(e.bytes.data()), e.bytes.size());
  }
  if (!out) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace deepinfer
