// Row-major C = B · Aᵀ is column-major Cᵀ = A(op T) · Bᵀ(op N): the "TN" layout of
// expert_gemm_cublas.cc.
#include "kernels/moe/expert_gemm_planned.h"

namespace deepinfer {
namespace kernels {

cublasStatus_t PlannedExpertGemmsBf16(cublasHandle_t cublas, void* const* pointers, int32_t batch,
                                      int32_t n, int32_t k, int32_t chunk_rows, bool out_bf16) {
  if (pointers == nullptr || batch < 1 || n < 1 || k < 1 || chunk_rows < 1) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const float alpha = 1.0f, beta = 0.0f;
  const void* const* a = const_cast<const void* const*>(pointers);
  return cublasGemmBatchedEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, chunk_rows, k, &alpha, a,
                             CUDA_R_16BF, k, a + batch, CUDA_R_16BF, k, &beta, pointers + 2 * batch,
                             out_bf16 ? CUDA_R_16BF : CUDA_R_32F, n, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

}  // namespace kernels
}  // namespace deepinfer
