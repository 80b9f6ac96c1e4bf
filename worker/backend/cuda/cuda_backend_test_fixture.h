// CudaBackendTest: the fixture of the CUDA backend's tests (cuda_backend*_test.cc): a CudaBackend
// on GPU 0 with bf16 weights, the CPU backends of the references, and device copies of host
// data. Tests using it skip themselves without a GPU.
#ifndef DEEPINFER_WORKER_BACKEND_CUDA_CUDA_BACKEND_TEST_FIXTURE_H_
#define DEEPINFER_WORKER_BACKEND_CUDA_CUDA_BACKEND_TEST_FIXTURE_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
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
