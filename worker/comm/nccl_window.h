// The device half of NcclCommunicator::RegisterSymmetricWindow: the LSA (NVLink load/store)
// pointer of every rank's copy of a registered NCCL window, which nccl_device.h only gives
// device code.
#ifndef DEEPINFER_WORKER_COMM_NCCL_WINDOW_H_
#define DEEPINFER_WORKER_COMM_NCCL_WINDOW_H_

#include <cuda_runtime_api.h>

struct ncclWindow_vidmem;  // nccl.h: typedef struct ncclWindow_vidmem* ncclWindow_t
struct ncclComm;           // nccl.h: typedef struct ncclComm* ncclComm_t

namespace deepinfer::comm {

// Writes ncclGetLsaPointer(window, 0, r) for r in [0, lsa_ranks) to device_out[r] (device
// memory), on `stream`.
cudaError_t LsaPointersOfWindow(ncclWindow_vidmem* window, int lsa_ranks, void** device_out,
                                cudaStream_t stream);

// Ranks of `comm`'s LSA team (ncclTeamLsa): those this rank can load from and store to.
int LsaTeamSize(ncclComm* comm);

}  // namespace deepinfer::comm

#endif  // DEEPINFER_WORKER_COMM_NCCL_WINDOW_H_
