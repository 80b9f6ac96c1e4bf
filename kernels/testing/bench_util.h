// Helpers shared by the GPU micro-benchmarks (kernels/*/*_bench.cc): a benchmark stops at the
// first CUDA or cuBLAS error, naming the call, and allocates plain device buffers it never frees
// before exiting (a benchmark's lifetime is the process's).
#ifndef DEEPINFER_KERNELS_TESTING_BENCH_UTIL_H_
#define DEEPINFER_KERNELS_TESTING_BENCH_UTIL_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

// Exits with the file, line, expression and CUDA's error string when `expr` fails.
#define BENCH_CUDA(expr)                                                                         \
  do {                                                                                           \
    cudaError_t e_ = (expr);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

namespace deepinfer {
namespace bench {

// cudaMalloc of `bytes` (at least 1) as T*; exits on failure.
template <typename T>
T* DeviceAlloc(size_t bytes) {
  void* p = nullptr;
  BENCH_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
  return static_cast<T*>(p);
}

// A device copy of `host`; exits on failure.
template <typename T>
T* Upload(const std::vector<T>& host) {
  T* d = DeviceAlloc<T>(host.size() * sizeof(T));
  BENCH_CUDA(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

}  // namespace bench
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_TESTING_BENCH_UTIL_H_
