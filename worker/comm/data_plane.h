// Data plane: which Communicator carries a group's expert-parallel exchange (TCP between host
// buffers, or NCCL between GPUs), and how an NCCL group is formed on top of the TCP group the
// worker already has. The one place that knows whether this build has NCCL, so that the worker
// and RankGroup build without CUDA (`--config=cpu`), as backend_factory does for backends.
//
// Bootstrap (docs/communicator.md, "Forming a group (NCCL)"): the coordinator hands out the
// rank layout and the TCP root address as for a TCP group; every rank first joins that TCP
// group (the control plane: lock-step agreement, barriers, and this bootstrap), then rank 0
// makes an NCCL unique id and the others receive it over the TCP group (ShareFromRankZero, an
// AllGather of fixed-size slots), and every rank calls ncclCommInitRankConfig on its GPU.
#ifndef DEEPINFER_WORKER_COMM_DATA_PLANE_H_
#define DEEPINFER_WORKER_COMM_DATA_PLANE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"

namespace deepinfer::comm {

// The --communicator flag.
enum class DataPlaneChoice { kAuto, kTcp, kNccl };
enum class DataPlane { kTcp, kNccl };

// "auto", "tcp" or "nccl"; INVALID_ARGUMENT naming the value otherwise.
absl::StatusOr<DataPlaneChoice> ParseDataPlaneChoice(absl::string_view flag);
const char* DataPlaneName(DataPlane plane);
// Whether this binary was built with NCCL.
bool NcclAvailable();

// Checks a choice against the backend before any group exists (a worker's flags):
// INVALID_ARGUMENT for nccl without the cuda backend, UNIMPLEMENTED for nccl in a build
// without NCCL.
absl::Status CheckDataPlaneChoice(DataPlaneChoice choice, absl::string_view backend);
// The data plane of a group of `world_size` ranks: auto is NCCL when the backend is cuda, the
// group has more than one rank and the build has NCCL, TCP otherwise. Errors as
// CheckDataPlaneChoice.
absl::StatusOr<DataPlane> ResolveDataPlane(DataPlaneChoice choice, absl::string_view backend,
                                           int world_size);

// Collective over the host communicator `control`: returns rank 0's `bytes` on every rank
// (the others' `bytes` are ignored). Every rank passes the same `size`; rank 0's `bytes` must
// have that size (INVALID_ARGUMENT, and the group is aborted, otherwise).
absl::StatusOr<std::string> ShareFromRankZero(Communicator* control, const std::string& bytes,
                                              size_t size);

// Collective over `control` (a host communicator of the group): forms the NCCL communicator
// with the same rank and world size on GPU `device`, with default stream `stream` (a
// cudaStream_t, e.g. the backend's; may be null), each step bounded by `timeout`. On failure
// `control` is aborted too, so that the peers do not wait. UNIMPLEMENTED in a build without
// NCCL; otherwise NcclCommunicator::Create's errors.
absl::StatusOr<std::unique_ptr<Communicator>> FormNcclCommunicator(Communicator* control,
                                                                   int device, StreamHandle stream,
                                                                   absl::Duration timeout);

}  // namespace deepinfer::comm

#endif  // DEEPINFER_WORKER_COMM_DATA_PLANE_H_
