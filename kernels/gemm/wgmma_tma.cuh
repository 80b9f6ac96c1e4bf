// Hopper (sm_90a) building blocks the wgmma GEMMs share: mbarriers, TMA 2D tensor loads, the
// shared-memory matrix descriptor of a K-major 128-byte swizzled tile, the wgmma fences, and on
// the host cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda). The
// device functions exist only in the sm_90a image (__CUDA_ARCH_FEAT_SM90_ALL).
#ifndef DEEPINFER_KERNELS_GEMM_WGMMA_TMA_CUH_
#define DEEPINFER_KERNELS_GEMM_WGMMA_TMA_CUH_

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {
namespace wgmma {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

// A box of the 2D tensor map at (x = inner / k byte, y = row) into shared memory, completing
// its bytes on `bar`. Out-of-bounds elements are zero-filled and count towards the bytes.
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int32_t x,
                                          int32_t y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// Shared-memory matrix descriptor of a K-major tile with 128-byte swizzle: rows of 128 bytes,
// 8-row swizzle atoms 1024 bytes apart (stride byte offset), the leading byte offset unused
// (the k extent of one wgmma, 32 bytes, lies within a swizzle row; 1 as CUTLASS sets it). The
// start address may move by 32-byte k steps inside a 1024-byte aligned atom.
__device__ __forceinline__ uint64_t SmemDesc(uint32_t addr) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>(1) << 16;          // leading byte offset (>> 4)
  d |= static_cast<uint64_t>(1024 >> 4) << 32;  // stride byte offset (>> 4)
  d |= static_cast<uint64_t>(1) << 62;          // 128-byte swizzle
  return d;
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void WgmmaWaitAll() {
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
// Keeps the compiler from moving reads or writes of r across the asynchronous wgmma.
__device__ __forceinline__ void FenceReg(float& r) { asm volatile("" : "+f"(r)::"memory"); }

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// cuTensorMapEncodeTiled through the runtime's driver entry point; null where the driver has
// none.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiledFn EncodeTiled() {
  static const EncodeTiledFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      return static_cast<EncodeTiledFn>(nullptr);
    }
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

// A [rows, cols] row-major byte matrix (e4m3; row stride ld bytes) in boxes of box_rows x
// box_cols bytes with the 128-byte swizzle (box_cols 128), out-of-bounds elements read as
// zero. A host-only encode (no device call), so it may run during a CUDA graph capture.
inline cudaError_t MakeMap(CUtensorMap* map, const void* data, int64_t rows, int64_t cols,
                           int64_t ld, uint32_t box_rows, uint32_t box_cols) {
  const EncodeTiledFn encode = EncodeTiled();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld)};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(data), dims, strides, box,
             elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace wgmma
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_WGMMA_TMA_CUH_
