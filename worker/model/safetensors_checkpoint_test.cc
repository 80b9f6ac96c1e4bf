// Tests for SafetensorsCheckpoint: index resolution, errors naming file/tensor, FP8 block dequant.
#include "worker/model/safetensors_checkpoint.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "gtest/gtest.h"
#include "worker/model/safetensors_writer.h"

namespace deepinfer {
namespace {

std::string TmpDir(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string d = std::string(dir ? dir : "/tmp") + "/" + name;
  ::mkdir(d.c_str(), 0755);
  return d;
}

TEST(SafetensorsCheckpointTest, ShardedIndexAndErrors) {
  const std::string dir = TmpDir("sharded");
  SafetensorsWriter a, b;
  a.AddFloat32("x", {2}, {1, 2});
  b.AddBf16("y", {2, 2}, {1, 2, 3, 4});
  ASSERT_TRUE(a.Write(dir + "/part-a.safetensors").ok());
  ASSERT_TRUE(b.Write(dir + "/part-b.safetensors").ok());
  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"metadata": {}, "weight_map": {"x": "part-a.safetensors",
             "y": "part-b.safetensors", "ghost": "part-a.safetensors"}})";
  auto ck = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  std::vector<float> out(4);
  ASSERT_TRUE((*ck)->ReadFloat32("y", {2, 2}, out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 4}));
  auto missing = (*ck)->ReadFloat32("z", {1}, out.data());
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("'z'"), std::string::npos);
  EXPECT_NE(missing.message().find(dir), std::string::npos);
  auto ghost = (*ck)->ReadFloat32("ghost", {1}, out.data());
  EXPECT_NE(ghost.message().find("part-a.safetensors"), std::string::npos) << ghost;
  auto shape = (*ck)->ReadFloat32("x", {3}, out.data());
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shape.message().find("part-a.safetensors"), std::string::npos) << shape;
  EXPECT_NE(shape.message().find("'x'"), std::string::npos) << shape;
  EXPECT_FALSE(SafetensorsCheckpoint::Open(TmpDir("empty")).ok());
}

TEST(SafetensorsCheckpointTest, Fp8BlockScalesIncludingPartialBlocks) {
  const std::string dir = TmpDir("fp8");
  // 130 x 3 weight, blocks of 128 x 128: scale shape [2, 1]; row 129 uses the second scale.
  const int rows = 130, cols = 3;
  std::vector<uint8_t> q(rows * cols, 0x38);  // all 1.0
  q[0] = 0x40;                                // 2.0
  q[129 * cols + 2] = 0xC0;                   // -2.0
  SafetensorsWriter w;
  w.Add("l.weight", DType::kF8E4M3, {rows, cols}, q);
  w.AddFloat32("l.weight_scale_inv", {2, 1}, {0.5f, 3.0f});
  ASSERT_TRUE(w.Write(dir + "/model.safetensors").ok());
  auto ck = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(ck.ok());
  std::vector<float> out(rows * cols);
  ASSERT_TRUE((*ck)->ReadFloat32("l.weight", {rows, cols}, out.data()).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 0.5f);
  EXPECT_EQ(out[127 * cols], 0.5f);
  EXPECT_EQ(out[128 * cols], 3.0f);
  EXPECT_EQ(out[129 * cols + 2], -6.0f);
  // Small blocks from the config are honoured too.
  auto ck2 = SafetensorsCheckpoint::Open(dir, 64, 128);
  ASSERT_TRUE(ck2.ok());
  auto st = (*ck2)->ReadFloat32("l.weight", {rows, cols}, out.data());
  EXPECT_FALSE(st.ok());  // scale shape [2,1] != [3,1]
  EXPECT_NE(st.message().find("l.weight_scale_inv"), std::string::npos) << st;
}

TEST(SafetensorsCheckpointTest, TruncatedShardNamesFile) {
  const std::string dir = TmpDir("trunc");
  SafetensorsWriter w;
  w.AddFloat32("t", {100}, std::vector<float>(100, 1));
  ASSERT_TRUE(w.Write(dir + "/model.safetensors").ok());
  ::truncate((dir + "/model.safetensors").c_str(), 200);
  auto ck = SafetensorsCheckpoint::Open(dir);
  ASSERT_FALSE(ck.ok());
  EXPECT_NE(ck.status().message().find(dir + "/model.safetensors"), std::string::npos);
  EXPECT_NE(ck.status().message().find("'t'"), std::string::npos);
}

}  // namespace
}  // namespace deepinfer
