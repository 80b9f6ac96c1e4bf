// Expert GEMMs of a large MoE batch (prefill) on cuBLAS tensor cores: y = x · W_sᵀ for the rows
// of each local expert slot, with the slot boundaries known on the HOST (one small copy of the
// counts per MoE layer, acceptable at prefill sizes; decode keeps GroupedGemmBf16, which reads
// them on the device). Groups of hundreds to thousands of rows are what cuBLAS's tiles are made
// for; GroupedGemmBf16 has no shared-memory tiling. docs/kernels/moe-prefill.md has the
// measurements.
#ifndef DEEPINFER_KERNELS_MOE_EXPERT_GEMM_CUBLAS_H_
#define DEEPINFER_KERNELS_MOE_EXPERT_GEMM_CUBLAS_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

enum class ExpertGemmCublasAlgo {
  // Each slot cut into chunks of chunk_rows rows (the last one running into the slot's
  // padding), all chunks of all slots in ONE cublasGemmBatchedEx call of a fixed shape. Needs
  // the padded layout of MoePermuteParams::row_align = chunk_rows. One host call per GEMM:
  // a loop of per-expert calls is bound by cuBLAS's host cost (~8-23 us a call, measured).
  kChunked,
  // One cublasGemmEx per non-empty slot (any layout): the fallback where a cuBLAS refuses the
  // batched call, and the reference.
  kPerExpert,
};

// Pointers marked "device" are device addresses; the rest is host memory.
struct ExpertGemmCublasParams {
  int32_t num_slots = 0;
  // [num_slots + 1], non-decreasing, [0] = 0: slot s's rows start at host_offsets[s].
  const int32_t* host_offsets = nullptr;
  // [num_slots] rows of each slot; null: host_offsets[s + 1] - host_offsets[s].
  const int32_t* host_counts = nullptr;
  // [num_slots] device addresses of each slot's W, [n, k] row-major, of `weight_type`
  // (CUDA_R_16BF or CUDA_R_32F); an empty slot's entry is not read and may be null.
  const void* const* host_weights = nullptr;
  cudaDataType_t weight_type = CUDA_R_16BF;
  int32_t n = 0;            // output features
  int32_t k = 0;            // input features
  const void* x = nullptr;  // device [rows, k], of weight_type (bf16 activations for bf16 W)
  void* y = nullptr;        // device [rows, n] of output_type; rows of no slot are not written
                            // (kChunked: padding rows may be written, with meaningless values)
  // CUDA_R_32F, or CUDA_R_16BF (bf16 weights only): the fp32 accumulator rounded to nearest
  // even by cuBLAS's epilogue, half the output bytes.
  cudaDataType_t output_type = CUDA_R_32F;
  // kChunked: rows per chunk; each host_offsets[s] must be a multiple of it, and each slot
  // padded to a multiple (host_offsets[s + 1] - host_offsets[s] >= its count rounded up).
  int32_t chunk_rows = 0;
  // kChunked: device workspace of device_pointers_size pointers (3 per chunk: the A, B, C
  // arrays cuBLAS reads on the device), filled from the host on the handle's stream.
  void** device_pointers = nullptr;
  int64_t device_pointers_size = 0;
};

// Pointer entries kChunked needs at most for `padded_rows` = host_offsets[num_slots].
inline int64_t ExpertGemmPointerCount(int64_t padded_rows, int32_t chunk_rows) {
  return 3 * (padded_rows / chunk_rows + 1);
}

// Issues the GEMMs on `cublas`'s stream (CUBLAS_COMPUTE_32F: bf16 products are exact in fp32,
// so the fp32 result differs from a sequential fp32 sum only in summation order; a bf16 output
// is that result rounded). CUBLAS_STATUS_INVALID_VALUE for bad sizes, a layout kChunked cannot
// use, missing pointers, a bf16 output of fp32 weights, or too small a pointer workspace;
// cuBLAS's status otherwise (CUBLAS_STATUS_NOT_SUPPORTED: a type combination this cuBLAS lacks).
cublasStatus_t ExpertGemmsCublas(cublasHandle_t cublas, const ExpertGemmCublasParams& params,
                                 ExpertGemmCublasAlgo algo);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_EXPERT_GEMM_CUBLAS_H_
