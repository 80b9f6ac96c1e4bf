#include "coordinator/cli/atomic_output_file.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace deepinfer {
namespace {

std::string ErrnoText(int error) { return std::strerror(error); }

}  // namespace

absl::StatusOr<std::unique_ptr<AtomicOutputFile>> AtomicOutputFile::Create(
    const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("no output file named");
  std::string target = path;
  struct stat link_info;
  if (lstat(path.c_str(), &link_info) == 0 && S_ISLNK(link_info.st_mode)) {
    char resolved[PATH_MAX];
    if (realpath(path.c_str(), resolved) != nullptr) target = resolved;
  }
  struct stat target_info;
  const bool exists = stat(target.c_str(), &target_info) == 0;
  if (exists && S_ISDIR(target_info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is a directory"));
  }
  // A hidden name in the target's directory: "DIR/.NAME.tmp-PID-RANDOM".
  const size_t slash = target.find_last_of('/');
  const std::string prefix = slash == std::string::npos ? "" : target.substr(0, slash + 1);
  const std::string dir = prefix.empty() ? "." : prefix;
  const std::string base = target.substr(prefix.size());
  absl::BitGen gen;
  for (int attempt = 0;; ++attempt) {
    const std::string temporary =
        absl::StrFormat("%s.%s.tmp-%d-%08x", prefix, base, getpid(), absl::Uniform<uint32_t>(gen));
    const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
      if (errno == EEXIST && attempt < 8) continue;
      const int error = errno;
      return absl::PermissionDeniedError(absl::StrCat("cannot write '", path, "': cannot create ",
                                                      "a file in ", dir, ": ", ErrnoText(error)));
    }
    // A replaced file keeps its permissions; a new one has what the umask gives (open's 0666).
    if (exists) (void)fchmod(fd, target_info.st_mode & 07777);
    FILE* file = fdopen(fd, "wb");
    if (file == nullptr) {
      const int error = errno;
      close(fd);
      unlink(temporary.c_str());
      return absl::InternalError(absl::StrCat("cannot write '", path, "': ", ErrnoText(error)));
    }
    return std::unique_ptr<AtomicOutputFile>(
        new AtomicOutputFile(path, std::move(target), std::move(temporary), file));
  }
}

AtomicOutputFile::~AtomicOutputFile() {
  if (file_ != nullptr) std::fclose(file_);
  if (!committed_) unlink(temporary_.c_str());
}

void AtomicOutputFile::Write(absl::string_view bytes) {
  if (file_ != nullptr) std::fwrite(bytes.data(), 1, bytes.size(), file_);
}

absl::Status AtomicOutputFile::Commit() {
  if (file_ == nullptr) return absl::FailedPreconditionError("already committed");
  bool ok = std::fflush(file_) == 0 && !std::ferror(file_);
  int error = ok ? 0 : errno;
  if (ok && fsync(fileno(file_)) != 0) {
    ok = false;
    error = errno;
  }
  if (std::fclose(file_) != 0 && ok) {
    ok = false;
    error = errno;
  }
  file_ = nullptr;
  if (!ok) {
    return absl::DataLossError(absl::StrCat("error writing '", path_, "' (", ErrnoText(error),
                                            "); it was left as it was"));
  }
  if (rename(temporary_.c_str(), target_.c_str()) != 0) {
    error = errno;
    return absl::InternalError(absl::StrCat("cannot replace '", path_, "': ", ErrnoText(error),
                                            "; it was left as it was"));
  }
  committed_ = true;
  return absl::OkStatus();
}

}  // namespace deepinfer
