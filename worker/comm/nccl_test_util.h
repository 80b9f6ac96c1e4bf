// For the GPU tests of the device expert exchange: whether this machine's NCCL gives symmetric
// windows at all, so that those tests skip (saying why) where it does not, instead of failing on
// the platform.
#ifndef DEEPINFER_WORKER_COMM_NCCL_TEST_UTIL_H_
#define DEEPINFER_WORKER_COMM_NCCL_TEST_UTIL_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "worker/comm/nccl_communicator.h"

namespace deepinfer::comm::testing {

// RegisterSymmetricWindow's UNIMPLEMENTED message on a one-rank NCCL group on GPU `device`, or
// "" when the window registers (or anything else fails: the caller's test then runs and fails
// on it).
inline std::string NoSymmetricWindows(int device = 0) {
  absl::StatusOr<std::string> id = NcclCommunicator::NewUniqueId();
  if (!id.ok()) return "";
  NcclCommunicatorSpec spec;
  spec.unique_id = *id;
  spec.device = device;
  spec.timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm = NcclCommunicator::Create(spec);
  if (!comm.ok()) return "";
  absl::Status window = (*comm)->RegisterSymmetricWindow(4096).status();
  if (!absl::IsUnimplemented(window)) return "";
  return absl::StrCat("this machine's NCCL gives no symmetric windows (run nccl_window_probe): ",
                      window.message());
}

}  // namespace deepinfer::comm::testing

#endif  // DEEPINFER_WORKER_COMM_NCCL_TEST_UTIL_H_
