// CudaBackendTest: the fixture of the CUDA backend's tests (cuda_backend*_test.cc): a CudaBackend
// on GPU 0 with bf16 weights, the CPU backends of the references, and device copies of host
// data. Tests using it skip themselves without a GPU.
#ifndef DEEPINFER_WORKER_BACKEND_CUDA_CUDA_BACKEND_TEST_FIXTURE_H_
#define DEEPINFER_WORKER_BACKEND_CUDA_CUDA_BACKEND_TEST_FIXTURE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/cuda/cuda_backend.h"

namespace deepinfer {
namespace testing {

// The call count in an op timing report's line for `op` ("  <op> <calls> calls <ms> ms ..." or
// "    (phase) <op> <calls> calls ..."), or -1 if there is no such line.
inline int64_t CallsOf(const std::string& report, const std::string& op) {
  std::istringstream lines(report);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string name;
    int64_t calls = -1;
    if (!(words >> name)) continue;
    if (name == "(phase)" && !(words >> name)) continue;  // a phase line: "(phase) NAME N calls"
    if (words >> calls && name == op) return calls;
  }
  return -1;
}

// A random top-k routing of T tokens over E experts: token t's K distinct experts in ascending
// order (one shuffle of all E a token) and a weight each, uniform in [0.1, 1), drawn from gen in
// that order.
inline void RandomTopK(int64_t T, int64_t K, int64_t E, std::mt19937* gen,
                       std::vector<int32_t>* ids, std::vector<float>* wts) {
  ids->assign(T * K, 0);
  wts->assign(T * K, 0.0f);
  std::uniform_real_distribution<float> uw(0.1f, 1.0f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all(E);
    for (int64_t e = 0; e < E; ++e) all[e] = static_cast<int32_t>(e);
    std::shuffle(all.begin(), all.end(), *gen);
    std::sort(all.begin(), all.begin() + K);
    for (int64_t k = 0; k < K; ++k) {
      (*ids)[t * K + k] = all[k];
      (*wts)[t * K + k] = uw(*gen);
    }
  }
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DEEPINFER_SKIP_WITHOUT_GPU();
    auto b = CudaBackend::Create(0, WeightDType::kBFloat16);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
  }
  // Device copy of a host vector.
  std::unique_ptr<DeviceBuffer> Upload(const std::vector<float>& v) {
    auto buf = gpu_->Allocate(v.size() * sizeof(float));
    gpu_->CopyToDevice(v.data(), v.size() * sizeof(float), buf->data());
    return buf;
  }
  std::unique_ptr<DeviceBuffer> UploadInts(const std::vector<int32_t>& v) {
    auto buf = gpu_->Allocate(v.size() * sizeof(int32_t));
    gpu_->CopyToDevice(v.data(), v.size() * sizeof(int32_t), buf->data());
    return buf;
  }
  // Device array of host-held device pointers (an expert table).
  std::unique_ptr<DeviceBuffer> UploadPointers(const std::vector<const void*>& v) {
    auto buf = gpu_->Allocate(v.size() * sizeof(void*));
    gpu_->CopyToDevice(v.data(), v.size() * sizeof(void*), buf->data());
    return buf;
  }
  std::vector<float> Download(const DeviceBuffer& buf) {
    std::vector<float> v(buf.size_bytes() / sizeof(float));
    gpu_->CopyToHost(buf.data(), buf.size_bytes(), v.data());
    return v;
  }
  // A buffer filled with NaN, so elements an op fails to write are caught.
  std::unique_ptr<DeviceBuffer> Poisoned(size_t n) {
    return Upload(std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()));
  }

  // Both as bf16 weights: the same rounded values on each side (WeightView of UploadWeight).
  WeightView CpuBf16(const std::vector<float>& w,
                     std::vector<std::unique_ptr<DeviceBuffer>>* keep) {
    keep->push_back(cpu16_.UploadWeight(w.data(), w.size()));
    return WeightView(keep->back()->data(), WeightDType::kBFloat16);
  }
  WeightView GpuBf16(const std::vector<float>& w,
                     std::vector<std::unique_ptr<DeviceBuffer>>* keep) {
    keep->push_back(gpu_->UploadWeight(w.data(), w.size()));
    return WeightView(keep->back()->data(), WeightDType::kBFloat16);
  }

  // Records `op` (a backend op that returns whether it ran) for replay, as the decode graphs
  // record it; null, with a test failure, where recording fails or the op declined.
  std::unique_ptr<CapturedOps> Record(const std::function<bool()>& op) {
    bool taken = false;
    auto ops = gpu_->Capture([&] {
      taken = op();
      return absl::OkStatus();
    });
    EXPECT_TRUE(ops.ok()) << ops.status();
    EXPECT_TRUE(taken) << "the op declined while recording";
    if (!ops.ok() || !taken) return nullptr;
    return *std::move(ops);
  }

  CpuBackend cpu_{2};
  CpuBackend cpu16_{2, WeightDType::kBFloat16};
  std::unique_ptr<CudaBackend> gpu_;
};

}  // namespace testing
}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_CUDA_CUDA_BACKEND_TEST_FIXTURE_H_
