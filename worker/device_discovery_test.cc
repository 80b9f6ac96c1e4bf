#include "worker/device_discovery.h"

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

TEST(DeviceDiscoveryTest, ParsesSelections) {
  EXPECT_EQ(*ParseDeviceSelection("auto"), DeviceSelection::kAuto);
  EXPECT_EQ(*ParseDeviceSelection("cpu"), DeviceSelection::kCpu);
  EXPECT_EQ(*ParseDeviceSelection("cuda"), DeviceSelection::kCuda);
  EXPECT_EQ(ParseDeviceSelection("gpu").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeviceDiscoveryTest, CpuDeviceDescribesThisMachine) {
  Device cpu = CpuDevice();
  EXPECT_EQ(cpu.kind(), Device::CPU);
  EXPECT_FALSE(cpu.name().empty());
  EXPECT_GT(cpu.total_memory_bytes(), 0u);
}

TEST(DeviceDiscoveryTest, AutoFallsBackToCpuAndCudaSaysWhyNot) {
  std::string why_none;
  std::vector<Device> gpus = FindCudaDevices(&why_none);
  auto found = FindDevices(DeviceSelection::kAuto);
  ASSERT_TRUE(found.ok());
  auto cuda = FindDevices(DeviceSelection::kCuda);
  if (gpus.empty()) {
    EXPECT_FALSE(why_none.empty());
    ASSERT_EQ(found->size(), 1u);
    EXPECT_EQ((*found)[0].kind(), Device::CPU);
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
  } else {
    EXPECT_EQ(found->size(), gpus.size());
    EXPECT_EQ((*found)[0].kind(), Device::CUDA);
    EXPECT_TRUE(cuda.ok());
  }
}

}  // namespace
}  // namespace deepinfer
