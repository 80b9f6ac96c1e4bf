// The cuBLAS half of the device-planned chunked expert GEMMs (kernels/moe/expert_gemm_plan.h):
// one cublasGemmBatchedEx over the pointer arrays PlanExpertGemmBatches filled, with a batch
// count fixed on the host, so the call can be captured in a CUDA graph.
#ifndef DEEPINFER_KERNELS_MOE_EXPERT_GEMM_PLANNED_H_
#define DEEPINFER_KERNELS_MOE_EXPERT_GEMM_PLANNED_H_

#include <cublas_v2.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// Per entry j: C_j[chunk_rows, n] (row-major, ld n; fp32, or bf16 rounded to nearest with
// out_bf16) = B_j[chunk_rows, k] (bf16, ld k) · A_j[n, k]ᵀ (bf16), with `pointers` the device
// array [A | B | C] of 3 * batch entries. CUBLAS_COMPUTE_32F: bf16 products are exact in fp32.
// CUBLAS_STATUS_INVALID_VALUE for non-positive sizes or a null pointer array.
cublasStatus_t PlannedExpertGemmsBf16(cublasHandle_t cublas, void* const* pointers, int32_t batch,
                                      int32_t n, int32_t k, int32_t chunk_rows, bool out_bf16);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_EXPERT_GEMM_PLANNED_H_
