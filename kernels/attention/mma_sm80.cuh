// Inline PTX wrappers for the bf16 tensor-core kernels of this folder (sm_80+: mma.sync,
// ldmatrix, cp.async groups). On older targets they compile to nothing; the kernels that use
// them are only launched on sm_80+.
#ifndef DEEPINFER_KERNELS_ATTENTION_MMA_SM80_CUH_
#define DEEPINFER_KERNELS_ATTENTION_MMA_SM80_CUH_

#include <cuda_bf16.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {
namespace sm80 {

__device__ __forceinline__ uint32_t SharedAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// c[0..3] += A (16x16 bf16, row-major fragment a[0..3]) * B (16x8 bf16, fragment b0, b1), fp32
// sums.
__device__ __forceinline__ void MmaBf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Four 8x8 bf16 matrices from shared memory; lane l gives the shared address of row l % 8 of
// matrix l / 8. Trans: each thread gets a column pair instead of a row pair (V as the B
// operand).
template <bool kTrans>
__device__ __forceinline__ void LdMatrixX4(uint32_t* r, uint32_t addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  }
#endif
}
template <bool kTrans>
__device__ __forceinline__ void LdMatrixX4(uint32_t* r, const void* row) {
  LdMatrixX4<kTrans>(r, SharedAddr(row));
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a shared tile of kRowBytes-byte rows, the
// chunk index XOR-swizzled by the row's low 3 bits (ldmatrix reads 8 rows without bank conflicts).
template <int kRowBytes>
__device__ __forceinline__ uint32_t Swizzled(int row, int chunk) {
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

// 16 bytes global -> shared, asynchronously; zero-filled when !valid (src is not read then).
__device__ __forceinline__ void CopyAsync16(uint32_t dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
#endif
}

// Two floats rounded to bf16, lo in the low half.
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ void CopyAsyncCommit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most kPending of this thread's committed copy groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CopyAsyncWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

}  // namespace sm80
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_ATTENTION_MMA_SM80_CUH_
