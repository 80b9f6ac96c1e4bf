// The raw-NCCL steps of nccl_window_probe (nccl_window_probe.h).
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <nccl_device.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "worker/comm/nccl_window.h"
#include "worker/comm/nccl_window_probe.h"

namespace deepinfer::comm {
namespace {

void Say(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::printf("probe: ");
  std::vprintf(format, args);
  std::printf("\n");
  std::fflush(stdout);
  va_end(args);
}

// Prints the result of an NCCL call; false (and one more failure) unless ncclSuccess.
bool Nccl(int* failures, const char* call, ncclResult_t r, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  Say("%s: %s%s%s%s", call, r == ncclSuccess ? "ok" : "FAILED: ", ncclGetErrorString(r),
      (last != nullptr && *last != '\0') ? " -- NCCL says: " : "",
      (last != nullptr && *last != '\0') ? last : "");
  if (r != ncclSuccess) ++*failures;
  return r == ncclSuccess;
}

bool Cuda(int* failures, const char* call, cudaError_t e) {
  if (e == cudaSuccess) {
    Say("%s: ok", call);
    return true;
  }
  Say("%s: FAILED: %s: %s", call, cudaGetErrorName(e), cudaGetErrorString(e));
  ++*failures;
  return false;
}

// A driver API function through the runtime (no link against libcuda), or null.
template <typename Fn>
Fn Driver(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<Fn>(fn);
}

void PrintEnvironment(int device) {
  int driver = 0, runtime = 0, count = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaGetDeviceCount(&count);
  Say("CUDA driver %d, runtime %d, %d GPU(s)", driver, runtime, count);
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    Say("GPU %d: %s, compute capability %d.%d", device, prop.name, prop.major, prop.minor);
  }
  using GetFn = CUresult (*)(CUdevice*, int);
  using AttrFn = CUresult (*)(int*, CUdevice_attribute, CUdevice);
  auto get = Driver<GetFn>("cuDeviceGet");
  auto attr = Driver<AttrFn>("cuDeviceGetAttribute");
  CUdevice dev = 0;
  int vmm = -1, fabric = -1, posix = -1;
  if (get != nullptr && attr != nullptr && get(&dev, device) == CUDA_SUCCESS) {
    attr(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
    attr(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev);
    attr(&fabric, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, dev);
  }
  Say("driver: virtual memory management (cuMem) %d, POSIX fd handles %d, fabric handles %d "
      "(-1: not read)",
      vmm, posix, fabric);
  int pageable = -1;
  (void)cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, device);
  Say("GPU reads pageable host memory (HMM/ATS): %d", pageable);

  int loaded = 0;
  (void)ncclGetVersion(&loaded);
  Dl_info info{};
  const char* file =
      dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) != 0 && info.dli_fname != nullptr
          ? info.dli_fname
          : "(unknown)";
  Say("NCCL: compiled against version code %d, loaded %d from %s", NCCL_VERSION_CODE, loaded, file);
  if (loaded / 100 != NCCL_VERSION_CODE / 100) {
    Say("NCCL: the loaded library is another minor version than the headers (the device API's "
        "structs are the headers')");
  }
  for (const char* name :
       {"NCCL_CUMEM_ENABLE", "NCCL_WIN_ENABLE", "NCCL_LOCAL_REGISTER", "NCCL_NVLS_ENABLE",
        "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE", "NCCL_CUMEM_HOST_ENABLE",
        "NCCL_RUNTIME_CONNECT", "NCCL_DEBUG", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"}) {
    const char* value = std::getenv(name);
    Say("env %s=%s", name, value != nullptr ? value : "(unset)");
  }
}

}  // namespace

bool ProbeCudaContextHealthy(const char* after) {
  const cudaError_t e = cudaDeviceSynchronize();
  Say("CUDA context after %s: %s%s", after,
      e == cudaSuccess ? "healthy" : "BROKEN: ", e == cudaSuccess ? "" : cudaGetErrorName(e));
  return e == cudaSuccess;
}

int ProbeRawNcclWindow(int device, size_t bytes) {
  int failures = 0;
  PrintEnvironment(device);
  if (!Cuda(&failures, "cudaSetDevice", cudaSetDevice(device))) return failures;

  ncclComm_t comm = nullptr;
  if (!Nccl(&failures, "ncclCommInitAll (one rank, blocking)", ncclCommInitAll(&comm, 1, &device),
            nullptr)) {
    return failures;
  }
  const ncclTeam_t lsa = ncclTeamLsa(comm);
  Say("ncclTeamLsa: %d rank(s), this rank %d", lsa.nRanks, lsa.rank);

  void* memory = nullptr;
  if (Nccl(&failures, "ncclMemAlloc", ncclMemAlloc(&memory, bytes), comm)) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, memory) == cudaSuccess) {
      Say("ncclMemAlloc memory %p: type %d (2 = device), GPU %d", memory, static_cast<int>(a.type),
          a.device);
    }
    using RetainFn = CUresult (*)(CUmemGenericAllocationHandle*, void*);
    using ReleaseFn = CUresult (*)(CUmemGenericAllocationHandle);
    auto retain = Driver<RetainFn>("cuMemRetainAllocationHandle");
    auto release = Driver<ReleaseFn>("cuMemRelease");
    CUmemGenericAllocationHandle handle = 0;
    if (retain == nullptr || release == nullptr) {
      Say("cuMemRetainAllocationHandle: not found in the driver");
    } else if (retain(&handle, memory) == CUDA_SUCCESS) {
      release(handle);
      Say("ncclMemAlloc memory is a cuMem allocation (NCCL's cuMem is on)");
    } else {
      (void)cudaGetLastError();
      Say("ncclMemAlloc memory is NOT a cuMem allocation: NCCL fell back to cudaMalloc, so its "
          "cuMem is off and it cannot make symmetric windows");
    }
    (void)cudaMemset(memory, 0, bytes);
  }

  ncclWindow_t window = nullptr;
  bool device_handle = false;
  if (memory != nullptr &&
      Nccl(&failures, "ncclCommWindowRegister (NCCL_WIN_COLL_SYMMETRIC)",
           ncclCommWindowRegister(comm, memory, bytes, &window, NCCL_WIN_COLL_SYMMETRIC), comm)) {
    std::string why;
    device_handle = IsDeviceWindowHandle(window, device, &why);
    Say("window handle %p: %s", static_cast<void*>(window),
        device_handle ? "device memory of this GPU (a kernel may read it)" : why.c_str());
    if (!device_handle) {
      ++failures;
      Say("no symmetric memory on this communicator: no kernel reads the handle (with "
          "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT NCCL prints why: cuMem, P2P type)");
    }
  }
  if (device_handle) {
    WindowHeader header;
    if (Cuda(&failures, "reading the handle's fields", ReadWindowHeader(window, &header))) {
      Say("handle: lsaFlatBase %p, lsaRank %d, worldRank %d, stride4G %u", header.lsa_flat_base,
          header.lsa_rank, header.world_rank, header.stride_4g);
    }
    void** table = nullptr;
    void* lsa0 = nullptr;
    if (Cuda(&failures, "cudaMalloc (pointer table)",
             cudaMalloc(reinterpret_cast<void**>(&table), sizeof(void*))) &&
        Cuda(&failures, "LsaPointersOfWindow (kernel: ncclGetLsaPointer(window, 0, 0))",
             LsaPointersOfWindow(window, 1, table, nullptr)) &&
        Cuda(&failures, "cudaDeviceSynchronize after the kernel", cudaDeviceSynchronize()) &&
        Cuda(&failures, "copying the pointer back",
             cudaMemcpy(&lsa0, table, sizeof(void*), cudaMemcpyDeviceToHost))) {
      Say("LSA pointer of rank 0: %p (the local pointer is %p)", lsa0, memory);
      const uint64_t want = 0x70726f6265ull;
      uint64_t got = 0;
      if (lsa0 != nullptr &&
          Cuda(&failures, "writing through the local pointer",
               cudaMemcpy(memory, &want, sizeof(want), cudaMemcpyHostToDevice)) &&
          Cuda(&failures, "reading through the LSA pointer",
               cudaMemcpy(&got, lsa0, sizeof(got), cudaMemcpyDeviceToHost))) {
        Say("the LSA pointer reads %s",
            got == want ? "what the local pointer wrote: ok" : "something else: FAILED");
        if (got != want) ++failures;
      }
    }
    if (table != nullptr) (void)cudaFree(table);
  }

  ncclDevCommRequirements requirements;
  std::memset(&requirements, 0, sizeof(requirements));
  ncclDevComm dev_comm;
  std::memset(&dev_comm, 0, sizeof(dev_comm));
  if (Nccl(&failures, "ncclDevCommCreate (no requirements)",
           ncclDevCommCreate(comm, &requirements, &dev_comm), comm)) {
    Say("ncclDevComm: rank %d of %d, LSA rank %d of %d", dev_comm.rank, dev_comm.nRanks,
        dev_comm.lsaRank, dev_comm.lsaSize);
    Nccl(&failures, "ncclDevCommDestroy", ncclDevCommDestroy(comm, &dev_comm), comm);
  }
  if (window != nullptr) {
    Nccl(&failures, "ncclCommWindowDeregister", ncclCommWindowDeregister(comm, window), comm);
  }
  if (memory != nullptr) Nccl(&failures, "ncclMemFree", ncclMemFree(memory), comm);
  Nccl(&failures, "ncclCommDestroy", ncclCommDestroy(comm), nullptr);
  if (!ProbeCudaContextHealthy("the raw NCCL steps")) ++failures;
  return failures;
}

}  // namespace deepinfer::comm
