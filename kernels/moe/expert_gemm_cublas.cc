// Row-major y_s[rows_s, n] = x_s[rows_s, k] · W_s[n, k]ᵀ is column-major y_sᵀ = W_s · x_sᵀ with
// W_s read as the column-major [k, n] matrix it is in memory (op T) and x_s as column-major
// [k, rows_s] (op N): the "TN" layout cuBLAS's tensor-core kernels prefer.
#include "kernels/moe/expert_gemm_cublas.h"

#include <vector>

namespace deepinfer {
namespace kernels {
namespace {

size_t TypeSize(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

}  // namespace

cublasStatus_t ExpertGemmsCublas(cublasHandle_t cublas, const ExpertGemmCublasParams& p,
                                 ExpertGemmCublasAlgo algo) {
  if (p.num_slots <= 0 || p.n <= 0 || p.k <= 0 || p.host_offsets == nullptr ||
      p.host_weights == nullptr || p.x == nullptr || p.y == nullptr ||
      (p.weight_type != CUDA_R_16BF && p.weight_type != CUDA_R_32F) ||
      (algo == ExpertGemmCublasAlgo::kGroupedBatched && p.device_pointers == nullptr)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const size_t x_row_bytes = TypeSize(p.weight_type) * static_cast<size_t>(p.k);
  const char* x = static_cast<const char*>(p.x);
  // The non-empty slots, in slot order.
  std::vector<int> slots;
  for (int s = 0; s < p.num_slots; ++s) {
    if (p.host_offsets[s + 1] < p.host_offsets[s] || p.host_offsets[0] != 0) {
      return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (p.host_offsets[s + 1] > p.host_offsets[s]) {
      if (p.host_weights[s] == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
      slots.push_back(s);
    }
  }
  if (slots.empty()) return CUBLAS_STATUS_SUCCESS;
  const float alpha = 1.0f, beta = 0.0f;

  if (algo == ExpertGemmCublasAlgo::kPerExpert) {
    for (int s : slots) {
      const int rows = p.host_offsets[s + 1] - p.host_offsets[s];
      const cublasStatus_t st = cublasGemmEx(
          cublas, CUBLAS_OP_T, CUBLAS_OP_N, p.n, rows, p.k, &alpha, p.host_weights[s],
          p.weight_type, p.k, x + p.host_offsets[s] * x_row_bytes, p.weight_type, p.k, &beta,
          p.y + static_cast<int64_t>(p.host_offsets[s]) * p.n, CUDA_R_32F, p.n,
          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (st != CUBLAS_STATUS_SUCCESS) return st;
    }
    return CUBLAS_STATUS_SUCCESS;
  }

  // One group per slot (its own row count), one problem per group.
  const int count = static_cast<int>(slots.size());
  std::vector<const void*> pointers(3 * static_cast<size_t>(count));  // A | B | C arrays
  std::vector<int> m_array(count, p.n), n_array(count), k_array(count, p.k);
  std::vector<int> lda(count, p.k), ldb(count, p.k), ldc(count, p.n), group_size(count, 1);
  std::vector<float> alphas(count, alpha), betas(count, beta);
  std::vector<cublasOperation_t> trans_a(count, CUBLAS_OP_T), trans_b(count, CUBLAS_OP_N);
  for (int j = 0; j < count; ++j) {
    const int s = slots[j];
    n_array[j] = p.host_offsets[s + 1] - p.host_offsets[s];
    pointers[j] = p.host_weights[s];
    pointers[count + j] = x + p.host_offsets[s] * x_row_bytes;
    pointers[2 * count + j] = p.y + static_cast<int64_t>(p.host_offsets[s]) * p.n;
  }
  cudaStream_t stream = nullptr;
  cublasStatus_t st = cublasGetStream(cublas, &stream);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  // From pageable memory: staged before the call returns, so `pointers` may go out of scope.
  if (cudaMemcpyAsync(p.device_pointers, pointers.data(), pointers.size() * sizeof(void*),
                      cudaMemcpyHostToDevice, stream) != cudaSuccess) {
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  const void* const* a_array = p.device_pointers;
  return cublasGemmGroupedBatchedEx(
      cublas, trans_a.data(), trans_b.data(), m_array.data(), n_array.data(), k_array.data(),
      alphas.data(), a_array, p.weight_type, lda.data(), a_array + count, p.weight_type,
      ldb.data(), betas.data(), p.device_pointers + 2 * count, CUDA_R_32F, ldc.data(), count,
      group_size.data(), CUBLAS_COMPUTE_32F);
}

}  // namespace kernels
}  // namespace deepinfer
