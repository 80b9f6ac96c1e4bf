// Data plane choice and the NCCL bootstrap over the TCP group.
#include "worker/comm/data_plane.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#ifdef DEEPINFER_WITH_NCCL
#include "worker/comm/nccl_communicator.h"
#endif

namespace deepinfer::comm {

absl::StatusOr<DataPlaneChoice> ParseDataPlaneChoice(absl::string_view flag) {
  if (flag == "auto") return DataPlaneChoice::kAuto;
  if (flag == "tcp") return DataPlaneChoice::kTcp;
  if (flag == "nccl") return DataPlaneChoice::kNccl;
  return absl::InvalidArgumentError(
      absl::StrCat("communicator '", flag, "' is not one of auto, tcp, nccl"));
}

const char* DataPlaneName(DataPlane plane) { return plane == DataPlane::kNccl ? "nccl" : "tcp"; }

bool NcclAvailable() {
#ifdef DEEPINFER_WITH_NCCL
  return true;
#else
  return false;
#endif
}

absl::Status CheckDataPlaneChoice(DataPlaneChoice choice, absl::string_view backend) {
  if (choice != DataPlaneChoice::kNccl) return absl::OkStatus();
  if (backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("communicator nccl needs the cuda backend (NCCL moves GPU memory), not '",
                     backend, "'; use --backend cuda, or --communicator tcp"));
  }
  if (!NcclAvailable()) {
    return absl::UnimplementedError(
        "communicator nccl: this binary was built without CUDA/NCCL (--config=cpu)");
  }
  return absl::OkStatus();
}

absl::StatusOr<DataPlane> ResolveDataPlane(DataPlaneChoice choice, absl::string_view backend,
                                           int world_size) {
  if (absl::Status s = CheckDataPlaneChoice(choice, backend); !s.ok()) return s;
  switch (choice) {
    case DataPlaneChoice::kTcp:
      return DataPlane::kTcp;
    case DataPlaneChoice::kNccl:
      return DataPlane::kNccl;
    case DataPlaneChoice::kAuto:
      break;
  }
  return backend == "cuda" && world_size > 1 && NcclAvailable() ? DataPlane::kNccl
                                                                : DataPlane::kTcp;
}

absl::StatusOr<std::string> ShareFromRankZero(Communicator* control, const std::string& bytes,
                                              size_t size) {
  if (control == nullptr || control->memory_kind() != MemoryKind::kHost) {
    return absl::InvalidArgumentError("ShareFromRankZero needs a host communicator");
  }
  if (control->rank() == 0 && bytes.size() != size) {
    absl::Status error = absl::InvalidArgumentError(absl::StrCat(
        "ShareFromRankZero: rank 0 has ", bytes.size(), " bytes, the group expects ", size));
    control->Abort(error);
    return error;
  }
  // Every rank contributes a slot of `size` bytes (only rank 0's carries data): an AllGather
  // is the one collective of the interface that moves one rank's bytes to all.
  std::vector<char> slots(size * control->world_size());
  char* mine = slots.data() + size * control->rank();
  if (control->rank() == 0) std::copy(bytes.begin(), bytes.end(), mine);
  if (absl::Status s = control->AllGather(mine, size, slots.data()); !s.ok()) return s;
  return std::string(slots.data(), size);
}

absl::StatusOr<std::unique_ptr<Communicator>> FormNcclCommunicator(Communicator* control,
                                                                   int device, StreamHandle stream,
                                                                   absl::Duration timeout) {
#ifdef DEEPINFER_WITH_NCCL
  if (control == nullptr) return absl::InvalidArgumentError("FormNcclCommunicator: no control");
  std::string id;
  if (control->rank() == 0) {
    absl::StatusOr<std::string> made = NcclCommunicator::NewUniqueId();
    if (!made.ok()) {
      control->Abort(made.status());
      return made.status();
    }
    id = *std::move(made);
  }
  absl::StatusOr<std::string> shared =
      ShareFromRankZero(control, id, NcclCommunicator::UniqueIdBytes());
  if (!shared.ok()) return shared.status();
  NcclCommunicatorSpec spec;
  spec.rank = control->rank();
  spec.world_size = control->world_size();
  spec.unique_id = *std::move(shared);
  spec.device = device;
  spec.default_stream = stream;
  spec.timeout = timeout;
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> nccl = NcclCommunicator::Create(spec);
  if (!nccl.ok()) {
    // The peers may still be in init: tell them through the control group.
    control->Abort(nccl.status());
    return nccl.status();
  }
  return std::unique_ptr<Communicator>(std::move(*nccl));
#else
  (void)control;
  (void)device;
  (void)stream;
  (void)timeout;
  return absl::UnimplementedError(
      "NCCL communicator: this binary was built without CUDA/NCCL (--config=cpu)");
#endif
}

}  // namespace deepinfer::comm
