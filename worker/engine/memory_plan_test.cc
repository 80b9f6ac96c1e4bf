// MemoryPlan arithmetic on made-up devices, and the reserve's dependence on the step size.
#include "worker/engine/memory_plan.h"

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// Live fp32 values per token of some model (Architecture::activation_floats_per_token).
constexpr int64_t kFloatsPerToken = 1500;

DeviceMemoryInfo Device(int64_t total, int64_t free) {
  DeviceMemoryInfo d;
  d.total_bytes = static_cast<size_t>(total);
  d.free_bytes = static_cast<size_t>(free);
  return d;
}

TEST(MemoryPlanTest, KvCacheGetsUtilizationMinusInUseMinusReserve) {
  MemoryPlanOptions o;
  o.utilization = 0.9;
  o.block_size = 16;
  // 100 GiB device, 30 GiB in use after loading 28 GiB of weights, 2 GiB reserve:
  // 90 - 30 - 2 = 58 GiB of KV at 1 MiB per token = 59392 tokens = 3712 blocks.
  auto plan = PlanKvCache(Device(100 * kGiB, 70 * kGiB), 28 * kGiB, 2 * kGiB, int64_t{1} << 20, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_blocks, 3712);
  EXPECT_EQ(plan->tokens(), 59392);
  EXPECT_EQ(plan->kv_bytes(), 58 * kGiB);
  EXPECT_NE(plan->ToString(o.utilization).find("3712 blocks x 16 = 59392 tokens (58.00 GiB)"),
            std::string::npos)
      << plan->ToString(o.utilization);
  // Amounts under 1 GiB in MiB (a test model's weights must not read "0.00 GiB").
  auto tiny = PlanKvCache(Device(100 * kGiB, 99 * kGiB), 3 << 20, 2 * kGiB, 576, o);
  ASSERT_TRUE(tiny.ok());
  EXPECT_NE(tiny->ToString(o.utilization).find("weights 3.0 MiB"), std::string::npos)
      << tiny->ToString(o.utilization);
  // Lower utilization: 50 - 30 - 2 = 18 GiB.
  o.utilization = 0.5;
  plan = PlanKvCache(Device(100 * kGiB, 70 * kGiB), 28 * kGiB, 2 * kGiB, int64_t{1} << 20, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->kv_bytes(), 18 * kGiB);
}

TEST(MemoryPlanTest, NoRoomForTheCacheIsAClearError) {
  MemoryPlanOptions o;
  o.utilization = 0.3;
  auto plan = PlanKvCache(Device(100 * kGiB, 70 * kGiB), 28 * kGiB, 2 * kGiB, int64_t{1} << 20, o);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("no room for the KV cache"), std::string::npos)
      << plan.status();
}

TEST(MemoryPlanTest, WeightsThatDoNotFitAreRejectedBeforeLoading) {
  MemoryPlanOptions o;
  o.utilization = 0.9;
  // 90 - 1 in use = 89 GiB available.
  EXPECT_TRUE(CheckWeightsFit(Device(100 * kGiB, 99 * kGiB), 80 * kGiB, 9 * kGiB, o).ok());
  absl::Status st = CheckWeightsFit(Device(100 * kGiB, 99 * kGiB), 85 * kGiB, 5 * kGiB, o);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("the weights do not fit"), std::string::npos) << st;
  EXPECT_NE(st.message().find("85.00 GiB"), std::string::npos) << st;
  o.utilization = 1.5;
  EXPECT_EQ(CheckWeightsFit(Device(100 * kGiB, 99 * kGiB), 1, 1, o).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MemoryPlanTest, ReserveGrowsWithTheStep) {
  const int64_t r1 = ActivationReserveBytes(kFloatsPerToken, 1024);
  const int64_t r2 = ActivationReserveBytes(kFloatsPerToken, 2048);
  EXPECT_GT(r1, int64_t{256} << 20);
  // Linear in the step size above the fixed part, doubled for fragmentation.
  EXPECT_EQ(r2 - r1, r1 - (int64_t{256} << 20));
  EXPECT_EQ(r1 - (int64_t{256} << 20), 2 * 1024 * kFloatsPerToken * 4);
}

TEST(MemoryPlanTest, DecodeGraphReserveCoversEveryBucketsTokensOnce) {
  const int64_t f = kFloatsPerToken, fixed = int64_t{256} << 20;
  EXPECT_EQ(DecodeGraphReserveBytes(f, {}), 0);
  // One bucket: half the (doubled) step reserve of that many tokens, without the fixed part.
  EXPECT_EQ(2 * DecodeGraphReserveBytes(f, {64}), ActivationReserveBytes(f, 64) - fixed);
  // Buckets add up: 1 + 2 + 4 tokens' worth.
  EXPECT_EQ(DecodeGraphReserveBytes(f, {1, 2, 4}), 7 * DecodeGraphReserveBytes(f, {1}));
  EXPECT_EQ(DecodeGraphReserveBytes(f, {8}), 8 * f * 4);
}

// DeepSeek-V3's attention shape: 61 layers of a 512-float latent plus a 64-float rope key.
int64_t DeepSeekV3KvBytesPerToken(WeightDType dtype) {
  return 61 * (512 + 64) * static_cast<int64_t>(WeightDTypeSize(dtype));
}

TEST(MemoryPlanTest, HostPlanAddsWeightsAndEveryRanksKvCache) {
  // 61 x (512 + 64) x 4 bytes = 140544 bytes a token; 16384 tokens = 2,302,672,896 bytes a rank.
  HostMemoryPlan plan = PlanHostMemory(2, WeightDType::kFloat32, 10 * kGiB, WeightDType::kFloat32,
                     DeepSeekV3KvBytesPerToken(WeightDType::kFloat32), 16384);
  EXPECT_EQ(plan.kv_cache_bytes, 2 * int64_t{2302672896});
  EXPECT_EQ(plan.needed_bytes(), 10 * kGiB + 2 * int64_t{2302672896});
  // bf16 entries: half.
  plan = PlanHostMemory(2, WeightDType::kFloat32, 10 * kGiB, WeightDType::kBFloat16,
                        DeepSeekV3KvBytesPerToken(WeightDType::kBFloat16), 16384);
  EXPECT_EQ(plan.kv_cache_bytes, int64_t{2302672896});
  plan.available_bytes = plan.needed_bytes();
  EXPECT_TRUE(CheckHostMemoryFits(plan).ok());  // exactly enough
  EXPECT_EQ(plan.ToString(),
            "2 ranks: weights 10.00 GiB (float32) + KV cache 16384 tokens per rank 2.14 GiB "
            "(bfloat16) = 12.14 GiB of 12.14 GiB available");
}

TEST(MemoryPlanTest, HostPlanThatDoesNotFitNamesEveryTerm) {
  // DeepSeek-V3 in fp32 on one rank (2,686,152,497,152 bytes of weights, ModelWeights::
  // DeviceBytes) on a 24 GiB machine.
  HostMemoryPlan plan = PlanHostMemory(1, WeightDType::kFloat32, int64_t{2686152497152}, WeightDType::kFloat32,
                     DeepSeekV3KvBytesPerToken(WeightDType::kFloat32), 16384);
  plan.available_bytes = 24 * kGiB;
  absl::Status st = CheckHostMemoryFits(plan);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(std::string(st.message()),
            "the model does not fit in this machine's memory: 1 rank: weights 2.44 TiB (float32) "
            "+ KV cache 16384 tokens per rank 2.14 GiB (float32) = 2.45 TiB of 24.00 GiB "
            "available, 2.42 TiB short; bf16 weights (--dtype bfloat16) halve the weights; more "
            "workers split the routed experts between them; --kv-cache-tokens sizes the KV "
            "cache; or use a smaller model");
  // One byte short is short; bf16 weights are not suggested again.
  plan.weight_dtype = WeightDType::kBFloat16;
  plan.available_bytes = plan.needed_bytes() - 1;
  st = CheckHostMemoryFits(plan);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(st.message().find("--dtype"), absl::string_view::npos) << st;
}

}  // namespace
}  // namespace deepinfer
