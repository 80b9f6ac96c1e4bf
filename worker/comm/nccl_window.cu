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

const char* MemoryTypeName(cudaMemoryType type) {
  switch (type) {
    case cudaMemoryTypeUnregistered:
      return "unregistered host memory";
    case cudaMemoryTypeHost:
      return "pinned host memory";
    case cudaMemoryTypeDevice:
      return "device memory";
    case cudaMemoryTypeManaged:
      return "managed memory";
  }
  return "memory of an unknown kind";
}

}  // namespace

bool IsDeviceWindowHandle(const ncclWindow_vidmem* window, int device, std::string* why) {
  auto say = [why](std::string text) {
    if (why != nullptr) *why = std::move(text);
    return false;
  };
  if (window == nullptr) return say("the handle is null");
  cudaPointerAttributes attributes{};
  if (cudaError_t e = cudaPointerGetAttributes(&attributes, window); e != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; do not leave it for the next call to report
    return say(std::string("cudaPointerGetAttributes on the handle: ") + cudaGetErrorName(e));
  }
  if (attributes.type != cudaMemoryTypeDevice) {
    return say(std::string("the handle is ") + MemoryTypeName(attributes.type) +
               ", not device memory");
  }
  if (attributes.device != device) {
    return say("the handle is device memory of GPU " + std::to_string(attributes.device) +
               ", not of GPU " + std::to_string(device));
  }
  return true;
}

cudaError_t LsaPointersOfWindow(ncclWindow_vidmem* window, int lsa_ranks, void** device_out,
                                cudaStream_t stream) {
  LsaPointersKernel<<<1, 32, 0, stream>>>(window, lsa_ranks, device_out);
  return cudaGetLastError();
}

int LsaTeamSize(ncclComm* comm) { return ncclTeamLsa(comm).nRanks; }

cudaError_t ReadWindowHeader(const ncclWindow_vidmem* window, WindowHeader* out) {
  ncclWindow_vidmem copy;
  if (cudaError_t e = cudaMemcpy(&copy, window, sizeof(copy), cudaMemcpyDeviceToHost);
      e != cudaSuccess) {
    return e;
  }
  out->lsa_flat_base = copy.lsaFlatBase;
  out->lsa_rank = copy.lsaRank;
  out->world_rank = copy.worldRank;
  out->stride_4g = copy.stride4G;
  return cudaSuccess;
}

}  // namespace deepinfer::comm
