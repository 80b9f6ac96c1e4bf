// LSA pointers of a registered NCCL window (nccl_window.h).
#include <nccl.h>
#include <nccl_device.h>

#include "worker/comm/nccl_window.h"

namespace deepinfer::comm {
namespace {

__global__ void LsaPointersKernel(ncclWindow_t window, int lsa_ranks, void** out) {
  for (int r = threadIdx.x; r < lsa_ranks; r += blockDim.x) {
    out[r] = ncclGetLsaPointer(window, 0, r);
  }
}

}  // namespace

cudaError_t LsaPointersOfWindow(ncclWindow_vidmem* window, int lsa_ranks, void** device_out,
                                cudaStream_t stream) {
  LsaPointersKernel<<<1, 32, 0, stream>>>(window, lsa_ranks, device_out);
  return cudaGetLastError();
}

int LsaTeamSize(ncclComm* comm) { return ncclTeamLsa(comm).nRanks; }

}  // namespace deepinfer::comm
