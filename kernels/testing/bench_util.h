// Helpers shared by the GPU micro-benchmarks (kernels/*/*_bench.cc): a benchmark stops at the
// first CUDA or cuBLAS error, naming the call, and allocates plain device buffers it never frees
// before exiting (a benchmark's lifetime is the process's).
#ifndef DEEPINFER_KERNELS_TESTING_BENCH_UTIL_H_
#define DEEPINFER_KERNELS_TESTING_BENCH_UTIL_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
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

// n values in [-1, 1) from a xorshift stream of `seed` (deterministic, no <random> cost).
inline std::vector<float> Uniform(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& f : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    f = static_cast<float>(static_cast<int64_t>(x >> 40) - (1ll << 23)) / (1ll << 23);
  }
  return v;
}

// Median of 20 timed runs of fn() (returns cudaError_t, enqueued on the default stream) in
// milliseconds, CUDA events around each, after 3 untimed warm-ups.
template <typename Fn>
double MedianMs(Fn&& fn) {
  for (int i = 0; i < 3; ++i) BENCH_CUDA(fn());
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  std::vector<float> ms(20);
  for (float& m : ms) {
    BENCH_CUDA(cudaEventRecord(a));
    BENCH_CUDA(fn());
    BENCH_CUDA(cudaEventRecord(b));
    BENCH_CUDA(cudaEventSynchronize(b));
    BENCH_CUDA(cudaEventElapsedTime(&m, a, b));
  }
  std::sort(ms.begin(), ms.end());
  BENCH_CUDA(cudaEventDestroy(a));
  BENCH_CUDA(cudaEventDestroy(b));
  return ms[ms.size() / 2];
}

}  // namespace bench
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_TESTING_BENCH_UTIL_H_
