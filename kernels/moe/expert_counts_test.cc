// AccumulateExpertCounts (CUDA) against CpuBackend::AccumulateExpertCounts: random ids with a
// hot expert (many atomics on one counter), out-of-range ids, accumulation over calls.
#include "kernels/moe/expert_counts.h"

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
    cpu.AccumulateExpertCounts(ids.size(), ids.data(), experts, want.data());
    DeviceArray<int32_t> dids(ids);
    DEEPINFER_CUDA_OK(
        kernels::AccumulateExpertCounts(ids.size(), dids.get(), experts, counts.get(), nullptr));
    std::vector<int64_t> got;
    DEEPINFER_CUDA_OK(counts.Download(&got));
    EXPECT_EQ(got, want) << "after call " << call;
  }
}

TEST(ExpertCountsKernelTest, EmptyInputIsANoOpAndBadSizesAreRefused) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  DeviceArray<int64_t> counts(std::vector<int64_t>(4, 5));
  DEEPINFER_CUDA_OK(kernels::AccumulateExpertCounts(0, nullptr, 4, counts.get(), nullptr));
  std::vector<int64_t> got;
  DEEPINFER_CUDA_OK(counts.Download(&got));
  EXPECT_EQ(got, std::vector<int64_t>(4, 5));
  EXPECT_EQ(kernels::AccumulateExpertCounts(-1, nullptr, 4, counts.get(), nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace deepinfer
