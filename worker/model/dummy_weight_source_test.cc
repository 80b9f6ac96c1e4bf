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
  // Router correction biases stay small (within 0.05), by HF's name and the V4 release's.
  for (const char* bias :
       {"model.layers.3.mlp.gate.e_score_correction_bias", "mtp.0.ffn.gate.bias"}) {
    std::vector<float> v(4);
    ASSERT_TRUE(a.ReadFloat32(bias, {4}, v.data()).ok());
    for (float b : v) EXPECT_LE(std::abs(b), 0.05f) << bias;
  }
}

// Index tables: in [0, bound), distinct within a row, the same for the same seed.
TEST(DummyWeightSourceTest, IndicesInRangeAndDistinctPerRow) {
  DummyWeightSource a(7), b(7);
  std::vector<int32_t> x(100 * 6), y(100 * 6);
  ASSERT_TRUE(a.ReadIndices("model.layers.0.mlp.gate.tid2eid", {100, 6}, 8, x.data()).ok());
  ASSERT_TRUE(b.ReadIndices("model.layers.0.mlp.gate.tid2eid", {100, 6}, 8, y.data()).ok());
  EXPECT_EQ(x, y);
  std::vector<int> seen(8, 0);
  for (int r = 0; r < 100; ++r) {
    std::vector<bool> in_row(8, false);
    for (int j = 0; j < 6; ++j) {
      const int32_t e = x[r * 6 + j];
      ASSERT_GE(e, 0);
      ASSERT_LT(e, 8);
      EXPECT_FALSE(in_row[e]) << "row " << r;
      in_row[e] = true;
      ++seen[e];
    }
  }
  for (int e = 0; e < 8; ++e) EXPECT_GT(seen[e], 0) << e;  // every expert used
  EXPECT_FALSE(a.ReadIndices("t", {2}, 0, x.data()).ok());
}

}  // namespace
}  // namespace deepinfer
