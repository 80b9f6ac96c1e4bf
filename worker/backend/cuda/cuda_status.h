// Turns CUDA runtime and cuBLAS error codes into absl::Status, naming the call that failed, so
// that GPU errors cross API boundaries like every other error in the project.
#ifndef DEEPINFER_WORKER_BACKEND_CUDA_CUDA_STATUS_H_
#define DEEPINFER_WORKER_BACKEND_CUDA_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace deepinfer {

// OK for cudaSuccess; otherwise INTERNAL (RESOURCE_EXHAUSTED for out-of-memory) with
// "<call>: <cuda error name>: <description>".
inline absl::Status CudaStatus(cudaError_t err, absl::string_view call) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string msg = absl::StrCat(call, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

inline absl::Status CublasStatus(cublasStatus_t st, absl::string_view call) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  std::string msg =
      absl::StrCat(call, ": ", cublasGetStatusName(st), ": ", cublasGetStatusString(st));
  if (st == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_CUDA_CUDA_STATUS_H_
