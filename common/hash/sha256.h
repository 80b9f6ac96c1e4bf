// SHA-256, fed in pieces: the checksum of a job's input file as the CLI reads it and as the
// coordinator receives it, and the CLI's default idempotency key (docs/jobs.md).
#ifndef DEEPINFER_COMMON_HASH_SHA256_H_
#define DEEPINFER_COMMON_HASH_SHA256_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deepinfer {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(absl::string_view data);
  // The 32-byte digest of everything fed so far; the object is spent afterwards.
  std::string Finish();

  // The digest of `data`, as 64 lowercase hex digits.
  static std::string Hex(absl::string_view data);
  // The digest of the file at `path`, read in blocks, as 32 bytes; NOT_FOUND if unreadable.
  static absl::StatusOr<std::string> OfFile(const std::string& path);

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_HASH_SHA256_H_
