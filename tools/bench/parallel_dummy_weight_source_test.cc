// ParallelDummyWeightSource must produce exactly DummyWeightSource's values (the `dummy` load
// format), whatever the thread count.
#include "tools/bench/parallel_dummy_weight_source.h"

#include <vector>

#include "gtest/gtest.h"
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

}  // namespace
}  // namespace deepinfer
