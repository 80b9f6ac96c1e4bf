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
  const bool chunked = algo == ExpertGemmCublasAlgo::kChunked;
  if (p.num_slots <= 0 || p.n <= 0 || p.k <= 0 || p.host_offsets == nullptr ||
      p.host_weights == nullptr || p.x == nullptr || p.y == nullptr ||
      (p.weight_type != CUDA_R_16BF && p.weight_type != CUDA_R_32F) ||
      (p.output_type != CUDA_R_32F &&
       !(p.output_type == CUDA_R_16BF && p.weight_type == CUDA_R_16BF)) ||
      (chunked && (p.chunk_rows <= 0 || p.device_pointers == nullptr)) || p.host_offsets[0] != 0) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const size_t x_row_bytes = TypeSize(p.weight_type) * static_cast<size_t>(p.k);
  const size_t y_row_bytes = TypeSize(p.output_type) * static_cast<size_t>(p.n);
  const char* x = static_cast<const char*>(p.x);
  char* y = static_cast<char*>(p.y);
  const float alpha = 1.0f, beta = 0.0f;
  // (slot, first row, rows) of each GEMM to issue.
  struct Piece {
    int slot, row, rows;
  };
  std::vector<Piece> pieces;
  for (int s = 0; s < p.num_slots; ++s) {
    const int span = p.host_offsets[s + 1] - p.host_offsets[s];
    const int count = p.host_counts != nullptr ? p.host_counts[s] : span;
    if (span < 0 || count < 0 || count > span) return CUBLAS_STATUS_INVALID_VALUE;
    if (count == 0) continue;
    if (p.host_weights[s] == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    if (!chunked) {
      pieces.push_back({s, p.host_offsets[s], count});
      continue;
    }
    const int chunks = (count + p.chunk_rows - 1) / p.chunk_rows;
    if (p.host_offsets[s] % p.chunk_rows != 0 ||
        static_cast<int64_t>(chunks) * p.chunk_rows > span) {
      return CUBLAS_STATUS_INVALID_VALUE;  // not the padded layout
    }
    for (int c = 0; c < chunks; ++c) {
      pieces.push_back({s, p.host_offsets[s] + c * p.chunk_rows, p.chunk_rows});
    }
  }
  if (pieces.empty()) return CUBLAS_STATUS_SUCCESS;

  if (!chunked) {
    for (const Piece& g : pieces) {
      const cublasStatus_t st = cublasGemmEx(
          cublas, CUBLAS_OP_T, CUBLAS_OP_N, p.n, g.rows, p.k, &alpha, p.host_weights[g.slot],
          p.weight_type, p.k, x + g.row * x_row_bytes, p.weight_type, p.k, &beta,
          y + g.row * y_row_bytes, p.output_type, p.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (st != CUBLAS_STATUS_SUCCESS) return st;
    }
    return CUBLAS_STATUS_SUCCESS;
  }

  const int batch = static_cast<int>(pieces.size());
  if (3 * static_cast<int64_t>(batch) > p.device_pointers_size) return CUBLAS_STATUS_INVALID_VALUE;
  std::vector<const void*> pointers(3 * static_cast<size_t>(batch));  // A | B | C arrays
  for (int j = 0; j < batch; ++j) {
    pointers[j] = p.host_weights[pieces[j].slot];
    pointers[batch + j] = x + pieces[j].row * x_row_bytes;
    pointers[2 * batch + j] = y + pieces[j].row * y_row_bytes;
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
  return cublasGemmBatchedEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, p.n, p.chunk_rows, p.k, &alpha,
                             a_array, p.weight_type, p.k, a_array + batch, p.weight_type, p.k,
                             &beta, p.device_pointers + 2 * batch, p.output_type, p.n, batch,
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

}  // namespace kernels
}  // namespace deepinfer
