// HostMemory from /proc/meminfo.
#include "worker/engine/host_memory.h"

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace deepinfer {

absl::StatusOr<int64_t> ParseMemAvailable(absl::string_view meminfo) {
  for (absl::string_view line : absl::StrSplit(meminfo, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemAvailable:")) continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    int64_t kib = 0;
    if (fields.size() != 2 || fields[1] != "kB" || !absl::SimpleAtoi(fields[0], &kib) || kib < 0) {
      return absl::DataLossError(absl::StrCat(
          "cannot read the MemAvailable line 'MemAvailable:", line, "' (expected a number of kB)"));
    }
    return kib * 1024;
  }
  return absl::DataLossError("no MemAvailable line (Linux 3.14 or later has one)");
}

absl::StatusOr<int64_t> ProcMeminfo::AvailableBytes() const {
  std::ifstream in(path_);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path_));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<int64_t> bytes = ParseMemAvailable(text.str());
  if (!bytes.ok()) {
    return absl::Status(bytes.status().code(), absl::StrCat(path_, ": ", bytes.status().message()));
  }
  return bytes;
}

}  // namespace deepinfer
