// Tests for DummyWeightSource: deterministic per (seed, name), scaled by fan-in, unit norms.
#include "worker/model/dummy_weight_source.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

TEST(DummyWeightSourceTest, DeterministicAndScaled) {
  DummyWeightSource a(7), b(7), c(8);
  std::vector<float> x(64 * 256), y(64 * 256), z(64 * 256);
  ASSERT_TRUE(a.ReadFloat32("model.layers.0.mlp.down_proj.weight", {64, 256}, x.data()).ok());
  ASSERT_TRUE(b.ReadFloat32("model.layers.0.mlp.down_proj.weight", {64, 256}, y.data()).ok());
  ASSERT_TRUE(c.ReadFloat32("model.layers.0.mlp.down_proj.weight", {64, 256}, z.data()).ok());
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
  ASSERT_TRUE(a.ReadFloat32("model.layers.0.mlp.up_proj.weight", {64, 256}, z.data()).ok());
  EXPECT_NE(x, z);  // keyed by name too
  double var = 0;
  for (float v : x) var += v * v;
  var /= x.size();
  EXPECT_NEAR(var, 1.0 / 256, 0.1 / 256);
  std::vector<float> norm(8);
  ASSERT_TRUE(a.ReadFloat32("model.norm.weight", {8}, norm.data()).ok());
  EXPECT_EQ(norm, std::vector<float>(8, 1.0f));
  EXPECT_TRUE(a.Contains("anything"));
}

}  // namespace
}  // namespace deepinfer
