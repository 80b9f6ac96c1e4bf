// The raw-NCCL half of nccl_window_probe (nccl_window_probe_main.cc): each NCCL and CUDA call
// that a symmetric window and NCCL's device API need, on a one-rank blocking communicator, with
// what it returned. Never reads a window handle from a kernel unless it is device memory.
#ifndef DEEPINFER_WORKER_COMM_NCCL_WINDOW_PROBE_H_
#define DEEPINFER_WORKER_COMM_NCCL_WINDOW_PROBE_H_

#include <cstddef>

namespace deepinfer::comm {

// Prints (stdout, one "probe: ..." line per call, flushed) the CUDA driver and runtime, the NCCL
// library (compiled against, loaded, its file), the NCCL environment variables that decide
// symmetric memory, then on GPU `device`: ncclCommInitAll, ncclTeamLsa, ncclMemAlloc (and whether
// its memory is a cuMem allocation), ncclCommWindowRegister (the handle and what memory it is),
// the handle's fields and LSA pointer (a device handle only), a write through the local pointer
// read back through the LSA one, and ncclDevCommCreate. Returns the number of steps that failed.
int ProbeRawNcclWindow(int device, size_t bytes);

// Whether the CUDA context of the current device still works (cudaDeviceSynchronize), printed.
bool ProbeCudaContextHealthy(const char* after);

}  // namespace deepinfer::comm

#endif  // DEEPINFER_WORKER_COMM_NCCL_WINDOW_PROBE_H_
