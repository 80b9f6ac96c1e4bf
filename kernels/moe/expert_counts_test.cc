// AccumulateExpertCounts (CUDA) against CpuBackend::AccumulateExpertCounts: random ids with a
// hot expert (many atomics on one counter), out-of-range ids, accumulation over calls, and a
// count limit read from device memory (the padding rows of a replayed decode graph).
#include "kernels/moe/expert_counts.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

using testing::DeviceArray;

TEST(ExpertCountsKernelTest, MatchesCpuBackendOverSeveralCalls) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int64_t experts = 256;
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> any(-3, experts + 3);
  CpuBackend cpu(1);
  std::vector<int64_t> want(experts, 0);
  DeviceArray<int64_t> counts(std::vector<int64_t>(experts, 0));
  for (int call = 0; call < 3; ++call) {
    std::vector<int32_t> ids(4096 * 8 + call);
    // Half the pairs on expert 7: a contended counter.
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = (i % 2 == 0) ? 7 : any(gen);
    cpu.AccumulateExpertCounts(ids.size(), ids.data(), experts, nullptr, want.data());
    DeviceArray<int32_t> dids(ids);
    DEEPINFER_CUDA_OK(kernels::AccumulateExpertCounts(ids.size(), dids.get(), experts, nullptr,
                                                      counts.get(), nullptr));
    std::vector<int64_t> got;
    DEEPINFER_CUDA_OK(counts.Download(&got));
    EXPECT_EQ(got, want) << "after call " << call;
  }
}

TEST(ExpertCountsKernelTest, EmptyInputIsANoOpAndBadSizesAreRefused) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  DeviceArray<int64_t> counts(std::vector<int64_t>(4, 5));
  DEEPINFER_CUDA_OK(kernels::AccumulateExpertCounts(0, nullptr, 4, nullptr, counts.get(), nullptr));
  std::vector<int64_t> got;
  DEEPINFER_CUDA_OK(counts.Download(&got));
  EXPECT_EQ(got, std::vector<int64_t>(4, 5));
  EXPECT_EQ(kernels::AccumulateExpertCounts(-1, nullptr, 4, nullptr, counts.get(), nullptr),
            cudaErrorInvalidValue);
}

TEST(ExpertCountsKernelTest, CountLimitInDeviceMemoryLeavesOutTheRest) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const int64_t experts = 16;
  std::vector<int32_t> ids(1000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7) % experts);
  DeviceArray<int32_t> dids(ids);
  CpuBackend cpu(1);
  for (int32_t limit : {0, 1, 333, 1000, 5000}) {
    SCOPED_TRACE(::testing::Message() << "limit " << limit);
    std::vector<int64_t> want(experts, 0);
    cpu.AccumulateExpertCounts(ids.size(), ids.data(), experts, &limit, want.data());
    int64_t total = 0;
    for (int64_t c : want) total += c;
    EXPECT_EQ(total, std::min<int64_t>(limit, ids.size()));
    DeviceArray<int32_t> dlimit(std::vector<int32_t>{limit});
    DeviceArray<int64_t> counts(std::vector<int64_t>(experts, 0));
    DEEPINFER_CUDA_OK(kernels::AccumulateExpertCounts(ids.size(), dids.get(), experts, dlimit.get(),
                                                      counts.get(), nullptr));
    std::vector<int64_t> got;
    DEEPINFER_CUDA_OK(counts.Download(&got));
    EXPECT_EQ(got, want);
  }
}

}  // namespace
}  // namespace deepinfer
