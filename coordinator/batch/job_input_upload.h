// JobInputUpload: a job's input file written to the coordinator's disk as it arrives in
// chunks (JobService.UploadJob), before the job exists. It counts the request lines (the
// lines that are not blank: not only ASCII whitespace), checksums the bytes (SHA-256) and
// syncs the file at the end, so that a job id handed out for it survives a crash. Memory use
// does not grow with the input: bytes go to the file as they come.
#ifndef DEEPINFER_COORDINATOR_BATCH_JOB_INPUT_UPLOAD_H_
#define DEEPINFER_COORDINATOR_BATCH_JOB_INPUT_UPLOAD_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/hash/sha256.h"

namespace deepinfer {

// A finished upload: the file and what was learned on the way.
struct StagedInput {
  std::string path;
  int64_t bytes = 0;
  // Lines with anything but ASCII whitespace on them: the job's requests.
  int64_t request_lines = 0;
  std::string sha256;  // 32 bytes
};

class JobInputUpload {
 public:
  // Creates (or truncates) `path`. `expected_bytes` >= 0: the input's announced size, which
  // Append and Finish hold it to; < 0: any size.
  static absl::StatusOr<std::unique_ptr<JobInputUpload>> Create(std::string path,
                                                                int64_t expected_bytes);
  // Removes the file unless Finish succeeded.
  ~JobInputUpload();

  JobInputUpload(const JobInputUpload&) = delete;
  JobInputUpload& operator=(const JobInputUpload&) = delete;

  // The next bytes. INVALID_ARGUMENT past the expected size; RESOURCE_EXHAUSTED (naming the
  // file) when the disk is full, INTERNAL when the write fails otherwise.
  absl::Status Append(absl::string_view data);

  // Syncs and closes the file. INVALID_ARGUMENT when fewer bytes came than announced, or when
  // `expected_sha256` (32 bytes; empty: not checked) is not theirs; RESOURCE_EXHAUSTED or
  // INTERNAL when the file cannot be synced. After success the file is the caller's.
  absl::StatusOr<StagedInput> Finish(absl::string_view expected_sha256);

  int64_t bytes() const { return bytes_; }

 private:
  JobInputUpload(std::string path, int fd, int64_t expected_bytes)
      : path_(std::move(path)), fd_(fd), expected_bytes_(expected_bytes) {}
  void CountLines(absl::string_view data);

  const std::string path_;
  int fd_;
  const int64_t expected_bytes_;
  int64_t bytes_ = 0;
  int64_t synced_to_ = 0;  // writeback started up to here
  int64_t request_lines_ = 0;
  bool line_has_content_ = false;  // the line being read so far is not blank
  bool finished_ = false;
  Sha256 sha256_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_BATCH_JOB_INPUT_UPLOAD_H_
