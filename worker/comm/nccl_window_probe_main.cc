// nccl_window_probe: which NCCL calls of the device expert exchange work on this machine, in one
// run. Prints one "probe: ..." line per call with what it returned:
//  1. the CUDA driver, the NCCL library loaded (version, file) and the NCCL environment;
//  2. raw NCCL on one GPU, a blocking one-rank communicator (nccl_window_probe.h): ncclMemAlloc
//     (a cuMem allocation or not), ncclCommWindowRegister and what memory its handle is, the
//     handle's fields and LSA pointer (only for a device handle), ncclDevCommCreate;
//  3. NcclCommunicator (non-blocking, as the worker forms it): RegisterSymmetricWindow's status,
//     then an all-reduce on the same communicator (it must stay usable when the window is
//     refused) and the CUDA context's health.
// It never lets a kernel read a window handle that is not device memory, so a machine without
// symmetric memory prints why instead of failing every later CUDA call. With
// NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV NCCL adds its own reasons (cuMem, P2P type).
// Exit status: 0 when every step worked (the device exchange can run here), 1 otherwise, 2 for
// bad flags.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/flags/flag_set.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/nccl_window_probe.h"

namespace deepinfer::comm {
namespace {

void Say(const std::string& line) { std::cout << "probe: " << line << std::endl; }

// Step 3; the number of steps that failed.
int ProbeCommunicator(int device, size_t bytes) {
  absl::StatusOr<std::string> id = NcclCommunicator::NewUniqueId();
  if (!id.ok()) {
    Say("NcclCommunicator::NewUniqueId: FAILED: " + id.status().ToString());
    return 1;
  }
  NcclCommunicatorSpec spec;
  spec.unique_id = *id;
  spec.device = device;
  spec.timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm = NcclCommunicator::Create(spec);
  if (!comm.ok()) {
    Say("NcclCommunicator::Create (one rank, non-blocking): FAILED: " + comm.status().ToString());
    return 1;
  }
  Say("NcclCommunicator::Create (one rank, non-blocking): ok");
  int failures = 0;
  absl::StatusOr<SymmetricWindow> window = (*comm)->RegisterSymmetricWindow(bytes);
  if (window.ok()) {
    Say("NcclCommunicator::RegisterSymmetricWindow: ok, rank 0's LSA pointer " +
        std::to_string(reinterpret_cast<uintptr_t>(window->peers[0])));
  } else {
    ++failures;
    Say("NcclCommunicator::RegisterSymmetricWindow: " + window.status().ToString() +
        (window.status().code() == absl::StatusCode::kUnimplemented
             ? " (refused safely: --ep-exchange auto falls back to NCCL all-to-all)"
             : ""));
  }
  int64_t* value = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&value), sizeof(int64_t)) != cudaSuccess) {
    Say("cudaMalloc for the all-reduce: FAILED");
    return failures + 1;
  }
  const int64_t seven = 7;
  int64_t back = 0;
  absl::Status reduced;
  if (cudaMemcpy(value, &seven, sizeof(seven), cudaMemcpyHostToDevice) != cudaSuccess) {
    reduced = absl::InternalError("cudaMemcpy to the device failed");
  } else {
    reduced = (*comm)->AllReduce(value, value, 1, ReduceOp::kSum);
    if (reduced.ok()) reduced = (*comm)->Barrier();
    if (reduced.ok() &&
        cudaMemcpy(&back, value, sizeof(back), cudaMemcpyDeviceToHost) != cudaSuccess) {
      reduced = absl::InternalError("cudaMemcpy from the device failed");
    }
  }
  (void)cudaFree(value);
  if (reduced.ok() && back == seven) {
    Say("AllReduce on the same communicator afterwards: ok");
  } else {
    ++failures;
    Say("AllReduce on the same communicator afterwards: FAILED: " +
        (reduced.ok() ? "got " + std::to_string(back) : reduced.ToString()));
  }
  comm->reset();
  if (!ProbeCudaContextHealthy("NcclCommunicator")) ++failures;
  return failures;
}

int Main(int argc, char** argv) {
  int64_t device = 0;
  int64_t bytes = 1 << 20;
  FlagSet flags("nccl_window_probe [--device N] [--bytes B]",
                "Prints which NCCL calls of the device expert exchange (symmetric windows, the "
                "device API) work on this machine.");
  flags.AddInt("device", &device, "GPU ordinal.");
  flags.AddInt("bytes", &bytes, "Window size.");
  if (int rc = flags.ParseMain(argc, argv, "nccl_window_probe"); rc >= 0) return rc;
  if (device < 0 || bytes <= 0) {
    std::cerr << "nccl_window_probe: --device must be >= 0 and --bytes > 0\n";
    return 2;
  }
  // NVLink multicast must stay off on our GPU machines (docs/communicator.md); NCCL reads this
  // when it first initialises, which the raw steps do before NcclCommunicator would set it.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  const int raw = ProbeRawNcclWindow(static_cast<int>(device), static_cast<size_t>(bytes));
  const int ours = ProbeCommunicator(static_cast<int>(device), static_cast<size_t>(bytes));
  Say("summary: " + std::to_string(raw) + " raw NCCL step(s) and " + std::to_string(ours) +
      " NcclCommunicator step(s) failed: the device exchange " +
      (raw + ours == 0 ? "can run here" : "cannot run here (see the FAILED lines)"));
  return raw + ours == 0 ? 0 : 1;
}

}  // namespace
}  // namespace deepinfer::comm

int main(int argc, char** argv) { return deepinfer::comm::Main(argc, argv); }
