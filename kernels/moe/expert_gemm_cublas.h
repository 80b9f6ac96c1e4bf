// Expert GEMMs of a large MoE batch (prefill) on cuBLAS tensor cores: y = x · W_sᵀ for the rows
// of each local expert slot, with the slot boundaries known on the HOST (one small copy of the
// offsets per MoE layer, acceptable at prefill sizes; decode keeps GroupedGemmBf16, which reads
// them on the device). Groups of hundreds to thousands of rows are what cuBLAS's tiles are made
// for; GroupedGemmBf16 has no shared-memory tiling. docs/kernels.md has the measurements.
#ifndef DEEPINFER_KERNELS_MOE_EXPERT_GEMM_CUBLAS_H_
#define DEEPINFER_KERNELS_MOE_EXPERT_GEMM_CUBLAS_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

enum class ExpertGemmCublasAlgo {
  // One cublasGemmGroupedBatchedEx call for all non-empty slots: one host call and one
  // heuristic for the whole layer.
  kGroupedBatched,
  // One cublasGemmEx / cublasSgemm per non-empty slot.
  kPerExpert,
};

// Pointers marked "device" are device addresses; the rest is host memory.
struct ExpertGemmCublasParams {
  int32_t num_slots = 0;
  const int32_t* host_offsets = nullptr;  // [num_slots + 1], non-decreasing, [0] = 0
  // [num_slots] device addresses of each slot's W, [n, k] row-major, of `weight_type`
  // (CUDA_R_16BF or CUDA_R_32F); an empty slot's entry is not read and may be null.
  const void* const* host_weights = nullptr;
  cudaDataType_t weight_type = CUDA_R_16BF;
  int32_t n = 0;             // output features
  int32_t k = 0;             // input features
  const void* x = nullptr;   // device [rows, k], of weight_type (bf16 activations for bf16 W)
  float* y = nullptr;        // device [rows, n], fp32; rows of empty slots are not written
  // kGroupedBatched only: device workspace of 3 * num_slots pointers (the A, B, C arrays that
  // cuBLAS reads on the device), filled from the host on the handle's stream.
  void** device_pointers = nullptr;
};

// Issues the GEMMs on `cublas`'s stream (fp32 output, CUBLAS_COMPUTE_32F: bf16 products are
// exact in fp32, so the result differs from a sequential fp32 sum only in summation order).
// CUBLAS_STATUS_INVALID_VALUE for bad sizes or missing pointers; cuBLAS's status otherwise
// (CUBLAS_STATUS_NOT_SUPPORTED where this cuBLAS has no grouped GEMM for the types: the caller
// may fall back to kPerExpert).
cublasStatus_t ExpertGemmsCublas(cublasHandle_t cublas, const ExpertGemmCublasParams& params,
                                 ExpertGemmCublasAlgo algo);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_EXPERT_GEMM_CUBLAS_H_
