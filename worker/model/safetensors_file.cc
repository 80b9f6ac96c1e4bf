// SafetensorsFile: mmap + header validation.
#include "worker/model/safetensors_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace deepinfer {

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": fstat failed: ", std::strerror(errno)));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return absl::DataLossError(
        absl::StrCat(path, ": truncated safetensors file (", size, " bytes, no header)"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(path, ": mmap failed: ", std::strerror(errno)));
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile(path, map, size));
  const uint8_t* base = static_cast<const uint8_t*>(map);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(base[i]) << (8 * i);
  if (header_len > size - 8) {
    return absl::DataLossError(absl::StrCat(path, ": truncated safetensors file: header of ",
                                            header_len, " bytes but file has ", size, " bytes"));
  }
  const char* hdr = reinterpret_cast<const char*>(base + 8);
  nlohmann::json j =
      nlohmann::json::parse(hdr, hdr + header_len, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": safetensors header is not a JSON object"));
  }
  const uint8_t* data = base + 8 + header_len;
  const size_t data_size = size - 8 - header_len;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    auto bad = [&](const std::string& why) {
      return absl::DataLossError(absl::StrCat(path, ": tensor '", it.key(), "': ", why));
    };
    const nlohmann::json& t = it.value();
    if (!t.is_object()) return bad("header entry is not an object");
    auto dt = t.find("dtype");
    auto sh = t.find("shape");
    auto off = t.find("data_offsets");
    if (dt == t.end() || !dt->is_string()) return bad("missing dtype");
    if (sh == t.end() || !sh->is_array()) return bad("missing shape");
    if (off == t.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned()) {
      return bad("missing or malformed data_offsets");
    }
    SafetensorsTensor tensor;
    tensor.name = it.key();
    auto dtype = ParseDType(dt->get<std::string>());
    if (!dtype.ok()) return bad(std::string(dtype.status().message()));
    tensor.dtype = *dtype;
    // Element counts are bounded by the file size, so a hostile shape cannot overflow them.
    const uint64_t max_elements = 8 * static_cast<uint64_t>(size) + 1;
    uint64_t elements = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned()) return bad("shape entries must be non-negative integers");
      const uint64_t dim = d.get<uint64_t>();
      if (dim > max_elements || (dim != 0 && elements > max_elements / dim)) {
        return bad(absl::StrCat("shape ", sh->dump(), " holds more elements than the ", size,
                                "-byte file can store"));
      }
      elements *= dim;
      tensor.shape.push_back(static_cast<int64_t>(dim));
    }
    const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return bad(absl::StrCat("data [", begin, ", ", end, ") lies beyond the ", data_size,
                              " data bytes in the file (truncated file?)"));
    }
    tensor.nbytes = end - begin;
    const int64_t expected = DTypeStorageBytes(*dtype, tensor.num_elements());
    if (expected < 0) {
      return bad(absl::StrCat(tensor.num_elements(), " elements of ", DTypeName(*dtype),
                              " do not fill whole bytes"));
    }
    if (tensor.nbytes != static_cast<uint64_t>(expected)) {
      return bad(absl::StrCat("holds ", tensor.nbytes, " bytes but shape [",
                              absl::StrJoin(tensor.shape, ","), "] of ", DTypeName(*dtype),
                              " needs ", expected));
    }
    tensor.data = data + begin;
    f->tensors_.emplace(tensor.name, std::move(tensor));
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

const SafetensorsTensor* SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace deepinfer
