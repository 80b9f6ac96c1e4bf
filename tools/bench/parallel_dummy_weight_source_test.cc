// ParallelDummyWeightSource must produce exactly DummyWeightSource's values (the `dummy` load
// format), whatever the thread count; its FP8 form must be those values quantised per block.
#include "tools/bench/parallel_dummy_weight_source.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/dtype_conversion.h"
#include "worker/model/dummy_weight_source.h"

namespace deepinfer {
namespace {

TEST(ParallelDummyWeightSourceTest, IdenticalToDummyWeightSource) {
  DummyWeightSource ref(42);
  for (int threads : {1, 3, 8}) {
    ParallelDummyWeightSource src(42, threads);
    for (const char* name : {"model.layers.0.mlp.experts.3.down_proj.weight",
                             "model.embed_tokens.weight", "model.layers.1.input_layernorm.weight",
                             "model.layers.1.mlp.gate.e_score_correction_bias"}) {
      const std::vector<int64_t> shape = {257, 1031};
      std::vector<float> want(257 * 1031), got(257 * 1031, -7.0f);
      ASSERT_TRUE(ref.ReadFloat32(name, shape, want.data()).ok());
      ASSERT_TRUE(src.ReadFloat32(name, shape, got.data()).ok());
      EXPECT_EQ(got, want) << name << " threads " << threads;
    }
  }
}

TEST(ParallelDummyWeightSourceTest, IndicesAsTheSerialSource) {
  ParallelDummyWeightSource parallel(5, 4);
  DummyWeightSource serial(5);
  std::vector<int32_t> a(64 * 6), b(64 * 6);
  ASSERT_TRUE(parallel.ReadIndices("model.layers.1.mlp.gate.tid2eid", {64, 6}, 16, a.data()).ok());
  ASSERT_TRUE(serial.ReadIndices("model.layers.1.mlp.gate.tid2eid", {64, 6}, 16, b.data()).ok());
  EXPECT_EQ(a, b);
}

// The FP8 matrices dequantise to the dummy values within half an e4m3 step (3 mantissa bits:
// 2^-4 relative) of each value's magnitude, or half the smallest subnormal step times the
// block's scale near zero; each block's largest magnitude maps to 448.
TEST(ParallelDummyWeightSourceTest, Fp8MatricesAreTheValuesQuantisedPerBlock) {
  ParallelDummyWeightSource plain(42, 2);
  ParallelDummyWeightSource src(42, 3, /*fp8_matrices=*/true);
  const std::string name = "model.layers.0.mlp.experts.3.down_proj.weight";
  const std::vector<int64_t> shape = {200, 300};
  EXPECT_FALSE(plain.StoresFp8(name));
  EXPECT_TRUE(src.StoresFp8(name));
  for (const char* other : {"model.layers.0.self_attn.kv_b_proj.weight", "lm_head.weight",
                            "model.embed_tokens.weight", "model.layers.1.mlp.gate.weight"}) {
    EXPECT_FALSE(src.StoresFp8(other)) << other;
    auto none = src.ReadFp8(other, shape);
    ASSERT_TRUE(none.ok());
    EXPECT_FALSE(none->has_value()) << other;
  }
  for (const char* fp8 : {"model.layers.0.self_attn.q_a_proj.weight",
                          "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
                          "model.layers.0.self_attn.o_proj.weight",
                          "model.layers.3.mlp.shared_experts.gate_proj.weight"}) {
    EXPECT_TRUE(src.StoresFp8(fp8)) << fp8;
  }
  std::vector<float> want(200 * 300);
  ASSERT_TRUE(src.ReadFloat32(name, shape, want.data()).ok());
  auto t = src.ReadFp8(name, shape);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->has_value());
  ASSERT_EQ((*t)->data.size(), want.size());
  ASSERT_EQ((*t)->scales.size(), 2u * 3u);  // ceil(200 / 128) x ceil(300 / 128)
  std::vector<float> block_max(6, 0.0f);
  for (int64_t r = 0; r < 200; ++r) {
    for (int64_t c = 0; c < 300; ++c) {
      const int64_t b = (r / 128) * 3 + c / 128;
      const float s = (*t)->scales[b];
      const float got = F8E4M3ToFloat((*t)->data[r * 300 + c]) * s;
      const float x = want[r * 300 + c];
      ASSERT_LE(std::fabs(got - x), std::ldexp(std::fabs(x), -4) + std::ldexp(s, -10))
          << "element (" << r << ", " << c << ")";
      block_max[b] = std::max(block_max[b], std::fabs(F8E4M3ToFloat((*t)->data[r * 300 + c])));
    }
  }
  for (float m : block_max) EXPECT_EQ(m, 448.0f);
}

// Bit for bit: each block's scale is its largest magnitude / 448 (1 for an all-zero block) and
// each code FloatToF8E4M3(value / scale), at shapes with partial blocks and one wide row strip.
TEST(ParallelDummyWeightSourceTest, Fp8CodesAndScalesExactly) {
  for (int threads : {1, 3}) {
    ParallelDummyWeightSource src(7, threads, /*fp8_matrices=*/true);
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{300, 200}, {128, 2048}, {1, 129}, {257, 1031}}) {
      const std::string name = "model.layers.2.self_attn.o_proj.weight";
      const int64_t rows = shape[0], cols = shape[1];
      std::vector<float> v(rows * cols);
      ASSERT_TRUE(src.ReadFloat32(name, shape, v.data()).ok());
      auto t = src.ReadFp8(name, shape);
      ASSERT_TRUE(t.ok()) << t.status();
      ASSERT_TRUE(t->has_value());
      const int64_t bcols = (cols + 127) / 128;
      ASSERT_EQ((*t)->scales.size(), static_cast<size_t>((rows + 127) / 128 * bcols));
      for (int64_t br = 0; br * 128 < rows; ++br) {
        for (int64_t bc = 0; bc < bcols; ++bc) {
          float amax = 0.0f;
          for (int64_t r = br * 128; r < std::min(rows, br * 128 + 128); ++r) {
            for (int64_t c = bc * 128; c < std::min(cols, bc * 128 + 128); ++c) {
              amax = std::max(amax, std::fabs(v[r * cols + c]));
            }
          }
          const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
          ASSERT_EQ((*t)->scales[br * bcols + bc], scale) << "block " << br << ", " << bc;
          for (int64_t r = br * 128; r < std::min(rows, br * 128 + 128); ++r) {
            for (int64_t c = bc * 128; c < std::min(cols, bc * 128 + 128); ++c) {
              ASSERT_EQ((*t)->data[r * cols + c], FloatToF8E4M3(v[r * cols + c] / scale))
                  << "element (" << r << ", " << c << ") of " << rows << " x " << cols;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer
