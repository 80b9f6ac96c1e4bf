// GpuSetsPerWorker: the CUDA_VISIBLE_DEVICES each worker of `deepinfer run --split-gpus` gets.
#include "coordinator/cli/job_commands.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(GpuSetsPerWorkerTest, NothingVisibleMeansGpusFromZero) {
  auto sets = GpuSetsPerWorker(nullptr, 2, 1);
  ASSERT_TRUE(sets.ok()) << sets.status();
  EXPECT_THAT(*sets, ElementsAre("0", "1"));
  sets = GpuSetsPerWorker("", 2, 2);
  ASSERT_TRUE(sets.ok()) << sets.status();
  EXPECT_THAT(*sets, ElementsAre("0,1", "2,3"));
}

TEST(GpuSetsPerWorkerTest, SlicesTheVisibleList) {
  auto sets = GpuSetsPerWorker("3,5,6,7,2", 2, 2);
  ASSERT_TRUE(sets.ok()) << sets.status();
  EXPECT_THAT(*sets, ElementsAre("3,5", "6,7"));
}

TEST(GpuSetsPerWorkerTest, TooFewGpusIsAnError) {
  auto sets = GpuSetsPerWorker("0", 2, 1);
  EXPECT_TRUE(absl::IsInvalidArgument(sets.status())) << sets.status();
  EXPECT_THAT(std::string(sets.status().message()), HasSubstr("need 2 GPUs"));
}

}  // namespace
}  // namespace deepinfer
