// Helpers for kernel tests that compare a CUDA kernel with the CPU backend: device arrays that
// are poisoned before each run (so elements a kernel fails to write are caught), fresh random
// inputs with the seed printed for reproduction, and a skip when the machine has no GPU.
#ifndef DEEPINFER_KERNELS_TESTING_GPU_TEST_UTIL_H_
#define DEEPINFER_KERNELS_TESTING_GPU_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer {
namespace testing {

// True if a CUDA device is usable; tests call GTEST_SKIP() otherwise, so `bazel test //...` on
// a CI machine without a GPU passes while still building every kernel.
inline bool HasCudaDevice() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define DEEPINFER_SKIP_WITHOUT_GPU()                                              \
  do {                                                                            \
    if (!::deepinfer::testing::HasCudaDevice()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

#define DEEPINFER_CUDA_OK(expr)                                                                    \
  do {                                                                                             \
    cudaError_t deepinfer_err_ = (expr);                                                           \
    ASSERT_EQ(deepinfer_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(deepinfer_err_); \
  } while (0)

// Bit patterns of the first `count` elements equal (so -0 differs from +0 and NaN from all):
// the check of kernels that promise the same bits across tiles, splits or batches.
inline ::testing::AssertionResult SameBits(const float* x, const float* y, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    uint32_t a, b;
    std::memcpy(&a, &x[i], 4);
    std::memcpy(&b, &y[i], 4);
    if (a != b) {
      return ::testing::AssertionFailure() << "element " << i << ": " << x[i] << " vs " << y[i];
    }
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult SameBits(const std::vector<float>& x,
                                           const std::vector<float>& y, size_t count) {
  if (x.size() < count || y.size() < count) {
    return ::testing::AssertionFailure() << "fewer than " << count << " elements";
  }
  return SameBits(x.data(), y.data(), count);
}

// A device copy of a host vector. Poison() fills it with 0xFF bytes: NaN as float, -1 as int32.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    if (cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<size_t>(n, 1) * sizeof(T)) !=
        cudaSuccess)
      ptr_ = nullptr;
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { Upload(host); }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() { return ptr_; }
  const T* get() const { return ptr_; }
  bool ok() const { return ptr_ != nullptr; }
  size_t size() const { return n_; }
  void Upload(const std::vector<T>& host) {
    cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  void Poison() { cudaMemset(ptr_, 0xFF, n_ * sizeof(T)); }
  // Waits for the device, so a kernel's asynchronous error shows up in the returned status.
  cudaError_t Download(std::vector<T>* host) const {
    host->resize(n_);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) return e;
    return cudaMemcpy(host->data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

// A fresh seed per call (tests run on new random data each time); callers print it on failure.
// DEEPINFER_TEST_SEED=N replays a printed seed: every call returns N.
inline uint32_t FreshSeed() {
  if (const char* fixed = std::getenv("DEEPINFER_TEST_SEED"); fixed != nullptr && *fixed != 0) {
    return static_cast<uint32_t>(std::strtoul(fixed, nullptr, 10));
  }
  return std::random_device{}();
}

inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// Checks |got - want| <= atol + rtol * |want| element-wise; NaN (an unwritten poisoned element)
// always fails. Reports the first few mismatches and their count.
inline ::testing::AssertionResult AllClose(const std::vector<float>& got,
                                           const std::vector<float>& want, double atol,
                                           double rtol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " != expected " << want.size();
  }
  size_t bad = 0;
  std::string first;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(diff <= atol + rtol * std::abs(static_cast<double>(want[i])))) {
      if (bad < 5) {
        first += " [" + std::to_string(i) + "] got " + std::to_string(got[i]) + " want " +
                 std::to_string(want[i]) + ";";
      }
      ++bad;
    }
    if (diff > worst || std::isnan(diff)) worst = diff;
  }
  if (bad > 0) {
    return ::testing::AssertionFailure() << bad << " of " << got.size() << " mismatches:" << first;
  }
  return ::testing::AssertionSuccess() << "max abs diff " << worst;
}

}  // namespace testing
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_TESTING_GPU_TEST_UTIL_H_
