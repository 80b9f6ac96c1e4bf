// Mxfp4DequantGroupExperts / Mxfp4DequantScratchBytes (backend.h): whole experts within the
// bound, at least one, at most all of them.
#include <cstdint>

#include "gtest/gtest.h"
#include "worker/backend/backend.h"

namespace deepinfer {
namespace {

TEST(Mxfp4DequantGroupsTest, ModelShapes) {
  // Moonlight: hidden 2048, moe_intermediate_size 1408, 64 experts of 3 * 2048 * 1408 * 2 =
  // 17301504 bf16 bytes: 62 in 1 GiB (2 groups).
  EXPECT_EQ(Mxfp4DequantExpertBytes(2048, 1408), 17301504);
  EXPECT_EQ(Mxfp4DequantGroupExperts(64, 2048, 1408), 62);
  EXPECT_EQ(Mxfp4DequantScratchBytes(64, 2048, 1408), 62 * int64_t{17301504});
  EXPECT_LE(Mxfp4DequantScratchBytes(64, 2048, 1408), kMxfp4DequantScratchBoundBytes);
  // DeepSeek-V3: hidden 7168, 2048, 256 experts of 88080384 bytes: 12 in 1 GiB.
  EXPECT_EQ(Mxfp4DequantGroupExperts(256, 7168, 2048), 12);
}

TEST(Mxfp4DequantGroupsTest, AtLeastOneAtMostAll) {
  EXPECT_EQ(Mxfp4DequantGroupExperts(16, 256, 96), 16);  // all fit
  const int64_t expert = Mxfp4DequantExpertBytes(256, 96);
  EXPECT_EQ(Mxfp4DequantGroupExperts(16, 256, 96, 5 * expert + 4096), 5);
  EXPECT_EQ(Mxfp4DequantGroupExperts(16, 256, 96, expert - 1), 1);  // one beyond the bound
  EXPECT_EQ(Mxfp4DequantScratchBytes(16, 256, 96, expert - 1), expert);
}

}  // namespace
}  // namespace deepinfer
