#include "coordinator/batch/job_input_upload.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace deepinfer {
namespace {

// A failed write to `path`: RESOURCE_EXHAUSTED for a full disk (or quota).
absl::Status WriteError(const std::string& path, int error) {
  std::string message = absl::StrCat("cannot write '", path, "': ", std::strerror(error));
  if (error == ENOSPC || error == EDQUOT) return absl::ResourceExhaustedError(std::move(message));
  return absl::InternalError(std::move(message));
}

// Writeback of what was written is started every this many bytes, so that the sync at the
// end finds little left to write.
constexpr int64_t kWritebackBytes = int64_t{64} << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<JobInputUpload>> JobInputUpload::Create(std::string path,
                                                                       int64_t expected_bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot create '", path, "': ", std::strerror(errno)));
  }
  return std::unique_ptr<JobInputUpload>(new JobInputUpload(std::move(path), fd, expected_bytes));
}

JobInputUpload::~JobInputUpload() {
  if (fd_ >= 0) close(fd_);
  if (!finished_) std::remove(path_.c_str());
}

void JobInputUpload::CountLines(absl::string_view data) {
  size_t i = 0;
  while (i < data.size()) {
    if (!line_has_content_) {
      // Look for the first byte that is not whitespace, or the line's end.
      for (; i < data.size() && data[i] != '\n'; ++i) {
        if (!absl::ascii_isspace(static_cast<unsigned char>(data[i]))) {
          line_has_content_ = true;
          break;
        }
      }
    }
    const void* newline = std::memchr(data.data() + i, '\n', data.size() - i);
    if (newline == nullptr) return;
    i = static_cast<const char*>(newline) - data.data() + 1;
    if (line_has_content_) ++request_lines_;
    line_has_content_ = false;
  }
}

absl::Status JobInputUpload::Append(absl::string_view data) {
  if (fd_ < 0) return absl::FailedPreconditionError("the upload is finished");
  if (expected_bytes_ >= 0 && bytes_ + static_cast<int64_t>(data.size()) > expected_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("more input than the ", expected_bytes_,
                                                   " bytes announced in the upload's header"));
  }
  sha256_.Update(data);
  CountLines(data);
  for (size_t done = 0; done < data.size();) {
    const ssize_t n = write(fd_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return WriteError(path_, n < 0 ? errno : EIO);
    done += static_cast<size_t>(n);
  }
  bytes_ += static_cast<int64_t>(data.size());
  if (bytes_ - synced_to_ >= kWritebackBytes) {
    // Starts writing back without waiting for it; errors surface at the final sync.
    (void)sync_file_range(fd_, synced_to_, bytes_ - synced_to_, SYNC_FILE_RANGE_WRITE);
    synced_to_ = bytes_;
  }
  return absl::OkStatus();
}

absl::StatusOr<StagedInput> JobInputUpload::Finish(absl::string_view expected_sha256) {
  if (fd_ < 0) return absl::FailedPreconditionError("the upload is finished");
  if (expected_bytes_ >= 0 && bytes_ != expected_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("the upload ended after ", bytes_, " of the ",
                                                   expected_bytes_, " bytes announced"));
  }
  StagedInput staged;
  staged.path = path_;
  staged.bytes = bytes_;
  staged.request_lines = request_lines_ + (line_has_content_ ? 1 : 0);
  staged.sha256 = sha256_.Finish();
  if (!expected_sha256.empty() && expected_sha256 != staged.sha256) {
    return absl::InvalidArgumentError(
        "the bytes received do not have the SHA-256 announced in the upload's header");
  }
  const int fd = fd_;
  fd_ = -1;
  const bool synced = fdatasync(fd) == 0;
  const int sync_errno = errno;
  if (close(fd) != 0 || !synced) {
    return absl::InternalError(
        absl::StrCat("cannot write '", path_, "': ", std::strerror(synced ? errno : sync_errno)));
  }
  finished_ = true;
  return staged;
}

}  // namespace deepinfer
