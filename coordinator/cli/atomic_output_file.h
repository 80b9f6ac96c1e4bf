// AtomicOutputFile: an output file of the CLI (`deepinfer results --output`, `deepinfer run
// --output`) written whole or not at all. The bytes go to a new file beside the target (same
// directory, so the final rename stays on one file system) and replace the target only on
// Commit. Until then, and when the writer is dropped without committing (the coordinator
// could not be reached, the job was cancelled, the process was interrupted), the target keeps
// its old bytes, or stays absent.
#ifndef DEEPINFER_COORDINATOR_CLI_ATOMIC_OUTPUT_FILE_H_
#define DEEPINFER_COORDINATOR_CLI_ATOMIC_OUTPUT_FILE_H_

#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deepinfer {

class AtomicOutputFile {
 public:
  // Creates the temporary file beside `path` (beside the file a symlink at `path` points
  // to). An error naming the directory when it cannot be written.
  static absl::StatusOr<std::unique_ptr<AtomicOutputFile>> Create(const std::string& path);
  ~AtomicOutputFile();  // Removes the temporary file unless committed.

  AtomicOutputFile(const AtomicOutputFile&) = delete;
  AtomicOutputFile& operator=(const AtomicOutputFile&) = delete;

  void Write(absl::string_view bytes);
  // Flushes and syncs the temporary file and renames it over the target; the target gets
  // the old file's permissions, or the usual ones (0666 less the umask) for a new file.
  // DATA_LOSS when a write failed or the disk is full; the target is then unchanged.
  absl::Status Commit();

  const std::string& path() const { return path_; }

 private:
  AtomicOutputFile(std::string path, std::string target, std::string temporary, FILE* file)
      : path_(std::move(path)),
        target_(std::move(target)),
        temporary_(std::move(temporary)),
        file_(file) {}

  const std::string path_;       // as given
  const std::string target_;     // what the rename replaces (symlinks resolved)
  const std::string temporary_;  // the file being written
  FILE* file_;                   // null once closed
  bool committed_ = false;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_CLI_ATOMIC_OUTPUT_FILE_H_
