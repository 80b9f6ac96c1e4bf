// The device half of NcclCommunicator::RegisterSymmetricWindow: the LSA (NVLink load/store)
// pointer of every rank's copy of a registered NCCL window, which nccl_device.h only gives
// device code, and (for the diagnostic tool nccl_window_probe) the handle's fields as NCCL's
// device API reads them.
//
// An ncclWindow_t is a pointer to a struct in device memory only where the communicator supports
// symmetric memory (NCCL 2.28: cuMem, NCCL_WIN_ENABLE, CUDA P2P between all ranks). Otherwise
// ncclCommWindowRegister still succeeds, but gives the local registration handle, a host
// pointer (2.28), or null (2.29 and later): a kernel that reads it faults with an illegal
// address, which is sticky. Check the handle with IsDeviceWindowHandle before passing it here.
#ifndef DEEPINFER_WORKER_COMM_NCCL_WINDOW_H_
#define DEEPINFER_WORKER_COMM_NCCL_WINDOW_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

struct ncclWindow_vidmem;  // nccl.h: typedef struct ncclWindow_vidmem* ncclWindow_t
struct ncclComm;           // nccl.h: typedef struct ncclComm* ncclComm_t

namespace deepinfer::comm {

// Whether `window` points at device memory of GPU `device` (cudaPointerGetAttributes), so that
// a kernel may read it. False for null, host or unregistered memory, or another GPU's memory;
// `why` (optional) then says which. Leaves no CUDA error behind.
bool IsDeviceWindowHandle(const ncclWindow_vidmem* window, int device, std::string* why);

// Writes ncclGetLsaPointer(window, 0, r) for r in [0, lsa_ranks) to device_out[r] (device
// memory), on `stream`. `window` must pass IsDeviceWindowHandle.
cudaError_t LsaPointersOfWindow(ncclWindow_vidmem* window, int lsa_ranks, void** device_out,
                                cudaStream_t stream);

// Ranks of `comm`'s LSA team (ncclTeamLsa): those this rank can load from and store to.
int LsaTeamSize(ncclComm* comm);

// The fields of a device window handle that ncclGetLsaPointer reads, copied to the host
// (synchronous). `window` must pass IsDeviceWindowHandle.
struct WindowHeader {
  const void* lsa_flat_base = nullptr;  // rank 0 of the LSA team's copy
  int lsa_rank = -1;
  int world_rank = -1;
  uint32_t stride_4g = 0;  // bytes between the ranks' copies, in units of 4 GiB
};
cudaError_t ReadWindowHeader(const ncclWindow_vidmem* window, WindowHeader* out);

}  // namespace deepinfer::comm

#endif  // DEEPINFER_WORKER_COMM_NCCL_WINDOW_H_
