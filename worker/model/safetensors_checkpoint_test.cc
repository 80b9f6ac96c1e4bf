// Tests for SafetensorsCheckpoint: index resolution, errors naming file/tensor, FP8 block dequant
// with float32 and E8M0 scales, MXFP4 experts.
#include "worker/model/safetensors_checkpoint.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
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

// FP8 with UE8M0 block scales: the same 130 x 3 weight, scales as E8M0 exponent bytes
// 2^(b - 127), stored as F8_E8M0 or as U8.
TEST(SafetensorsCheckpointTest, Fp8WithE8M0Scales) {
  const int rows = 130, cols = 3;
  std::vector<uint8_t> q(rows * cols, 0x38);  // all 1.0
  q[0] = 0x40;                                // 2.0
  q[129 * cols + 2] = 0xC0;                   // -2.0
  for (DType scale_dtype : {DType::kF8E8M0, DType::kU8}) {
    const std::string dir = TmpDir(std::string("fp8_e8m0_") + DTypeName(scale_dtype));
    SafetensorsWriter w;
    w.Add("l.weight", DType::kF8E4M3, {rows, cols}, q);
    w.Add("l.weight_scale_inv", scale_dtype, {2, 1}, {126, 129});  // 0.5, 4.0
    ASSERT_TRUE(w.Write(dir + "/model.safetensors").ok());
    auto ck = SafetensorsCheckpoint::Open(dir);
    ASSERT_TRUE(ck.ok());
    std::vector<float> out(rows * cols);
    ASSERT_TRUE((*ck)->ReadFloat32("l.weight", {rows, cols}, out.data()).ok());
    EXPECT_EQ(out[0], 1.0f);
    EXPECT_EQ(out[1], 0.5f);
    EXPECT_EQ(out[127 * cols + 2], 0.5f);
    EXPECT_EQ(out[128 * cols], 4.0f);
    EXPECT_EQ(out[129 * cols + 2], -8.0f);
    auto storage = (*ck)->Storage("l.weight");
    ASSERT_TRUE(storage.ok()) << storage.status();
    EXPECT_EQ(storage->kind, WeightStorageKind::kFp8Block);
    EXPECT_EQ(storage->scale_dtype, scale_dtype);
    EXPECT_EQ(storage->scale_shape, (std::vector<int64_t>{2, 1}));
    EXPECT_EQ(storage->stored_bytes, rows * cols);
    EXPECT_EQ(storage->scale_bytes, 2);
  }
}

// A scale grid that does not fit the weight is refused naming both tensors and the grid.
TEST(SafetensorsCheckpointTest, Fp8ScaleGridMismatchNamesTensors) {
  const std::string dir = TmpDir("fp8_grid");
  SafetensorsWriter w;
  w.Add("a.weight", DType::kF8E4M3, {130, 3}, std::vector<uint8_t>(390, 0x38));
  w.Add("a.weight_scale_inv", DType::kF8E8M0, {1, 1}, {127});
  ASSERT_TRUE(w.Write(dir + "/model.safetensors").ok());
  auto ck = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(ck.ok());
  std::vector<float> out(390);
  absl::Status st = (*ck)->ReadFloat32("a.weight", {130, 3}, out.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'a.weight_scale_inv' has shape [1,1]"), std::string::npos) << st;
  EXPECT_NE(st.message().find("'a.weight' of shape [130,3]"), std::string::npos) << st;
  EXPECT_NE(st.message().find("needs [2,1]"), std::string::npos) << st;
  EXPECT_EQ((*ck)->Storage("a.weight").status().code(), absl::StatusCode::kInvalidArgument);
}

// Fused experts [E, out, in]: the scale carries the expert dimension.
TEST(SafetensorsCheckpointTest, Fp8BatchedOverLeadingDims) {
  const std::string dir = TmpDir("fp8_batched");
  SafetensorsWriter w;
  w.Add("e.gate_up_proj", DType::kF8E4M3, {2, 2, 3}, std::vector<uint8_t>(12, 0x38));  // 1.0
  w.AddFloat32("e.gate_up_proj_scale_inv", {2, 1, 1}, {0.25f, 8.0f});
  ASSERT_TRUE(w.Write(dir + "/model.safetensors").ok());
  auto ck = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(ck.ok());
  auto v = ReadDequantized(ck->get(), "e.gate_up_proj", {2, 2, 3});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, (std::vector<float>{0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 8, 8, 8, 8, 8, 8}));
}

// FP8 kept as stored (ReadFp8, for the FP8 GEMMs): the e4m3 bytes untouched and the block
// scales as float multipliers, from a float32 `_scale_inv` or from UE8M0 bytes (F8_E8M0 or U8,
// under DeepSeek's `.scale` name too) as 2^(b - 127).
TEST(SafetensorsCheckpointTest, ReadFp8KeepsBytesWithFloatOrE8M0Scales) {
  const int rows = 130, cols = 3;
  std::vector<uint8_t> q(rows * cols, 0x38);
  q[0] = 0x40;
  q[129 * cols + 2] = 0xC0;
  struct Case {
    const char* dir;
    DType scale_dtype;
    const char* scale_name;
  } cases[] = {{"keep_f32", DType::kF32, "l.weight_scale_inv"},
               {"keep_e8m0", DType::kF8E8M0, "l.weight_scale_inv"},
               {"keep_u8", DType::kU8, "l.scale"}};
  for (const Case& c : cases) {
    const std::string dir = TmpDir(c.dir);
    SafetensorsWriter w;
    w.Add("l.weight", DType::kF8E4M3, {rows, cols}, q);
    if (c.scale_dtype == DType::kF32) {
      w.AddFloat32(c.scale_name, {2, 1}, {0.5f, 4.0f});
    } else {
      w.Add(c.scale_name, c.scale_dtype, {2, 1}, {126, 129});  // 0.5, 4.0
    }
    w.AddBf16("n.weight", {2}, {1, 2});
    ASSERT_TRUE(w.Write(dir + "/model.safetensors").ok());
    auto ck = SafetensorsCheckpoint::Open(dir);
    ASSERT_TRUE(ck.ok());
    EXPECT_TRUE((*ck)->StoresFp8("l.weight")) << c.dir;
    EXPECT_FALSE((*ck)->StoresFp8("n.weight"));
    EXPECT_FALSE((*ck)->StoresFp8("absent.weight"));
    auto t = (*ck)->ReadFp8("l.weight", {rows, cols});
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE(t->has_value()) << c.dir;
    EXPECT_EQ((*t)->data, q);
    EXPECT_EQ((*t)->scales, (std::vector<float>{0.5f, 4.0f})) << c.dir;
    auto none = (*ck)->ReadFp8("n.weight", {2});
    ASSERT_TRUE(none.ok());
    EXPECT_FALSE(none->has_value());
    EXPECT_EQ((*ck)->ReadFp8("l.weight", {cols, rows}).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// Storage the FP8 GEMMs do not take is left to ReadFloat32: F8_E5M2, blocks other than
// 128 x 128, batched [E, out, in] tensors. A NaN E8M0 scale is refused naming the element.
TEST(SafetensorsCheckpointTest, ReadFp8DeclinesOtherStorage) {
  const std::string dir = TmpDir("keep_other");
  SafetensorsWriter w;
  w.Add("e5.weight", DType::kF8E5M2, {2, 3}, std::vector<uint8_t>(6, 0x3C));
  w.AddFloat32("e5.weight_scale_inv", {1, 1}, {1.0f});
  w.Add("b.weight", DType::kF8E4M3, {2, 2, 3}, std::vector<uint8_t>(12, 0x38));
  w.AddFloat32("b.weight_scale_inv", {2, 1, 1}, {1.0f, 2.0f});
  w.Add("nan.weight", DType::kF8E4M3, {2, 3}, std::vector<uint8_t>(6, 0x38));
  w.Add("nan.weight_scale_inv", DType::kF8E8M0, {1, 1}, {0xFF});
  ASSERT_TRUE(w.Write(dir + "/model.safetensors").ok());
  auto ck = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(ck.ok());
  for (const char* name : {"e5.weight", "b.weight"}) {
    EXPECT_FALSE((*ck)->StoresFp8(name)) << name;
  }
  auto e5 = (*ck)->ReadFp8("e5.weight", {2, 3});
  ASSERT_TRUE(e5.ok());
  EXPECT_FALSE(e5->has_value());
  auto nan = (*ck)->ReadFp8("nan.weight", {2, 3});
  EXPECT_EQ(nan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(nan.status().message().find("element 0"), std::string::npos) << nan.status();
  auto small_blocks = SafetensorsCheckpoint::Open(dir, 1, 3);
  ASSERT_TRUE(small_blocks.ok());
  // With 1 x 3 blocks the scale grid [1,1] does not fit [2,3]: not keepable either way.
  EXPECT_FALSE((*small_blocks)->StoresFp8("nan.weight"));
}

// MXFP4 (OCP Microscaling v1.0, FP4 E2M1 elements, k = 32, E8M0 scale). Expected values are
// decoded by hand from the spec: element = (-1)^s * 2^(e-1) * (1 + m/2) (e > 0) or
// (-1)^s * m/2 (e = 0); value = 2^(scale byte - 127) * element; two elements per byte, the even
// input column in the low nibble.
struct Mxfp4Case {
  std::vector<uint8_t> packed = std::vector<uint8_t>(2 * 32, 0);  // [2, 32] bytes = [2, 64]
  std::vector<uint8_t> scale = {127, 129, 0, 254};                // [2, 2]: 1, 4; 2^-127, 2^127
  Mxfp4Case() {
    packed[0] = 0x72;        // row 0, cols 0, 1: code 2 = 1.0, code 7 = 6.0 (the maximum)
    packed[1] = 0x8F;        // cols 2, 3: code F = -6.0, code 8 = -0.0
    packed[16] = 0x53;       // cols 32, 33 (second block, scale 4): 1.5, 3.0
    packed[32 + 0] = 0x07;   // row 1, col 0 (scale 2^-127): 6.0; col 1: 0
    packed[32 + 16] = 0x01;  // col 32 (scale 2^127): 0.5
    packed[32 + 31] = 0xA2;  // cols 62, 63: 1.0, code A = -1.0
  }
  void Check(const std::vector<float>& v) const {
    ASSERT_EQ(v.size(), 128u);
    EXPECT_EQ(v[0], 1.0f);
    EXPECT_EQ(v[1], 6.0f);
    EXPECT_EQ(v[2], -6.0f);
    EXPECT_EQ(v[3], 0.0f);
    EXPECT_TRUE(std::signbit(v[3]));  // negative zero stays negative
    EXPECT_EQ(v[31], 0.0f);
    EXPECT_EQ(v[32], 6.0f);
    EXPECT_EQ(v[33], 12.0f);
    EXPECT_EQ(v[64], std::ldexp(6.0f, -127));
    EXPECT_EQ(v[65], 0.0f);
    EXPECT_EQ(v[64 + 32], std::ldexp(1.0f, 126));
    EXPECT_EQ(v[64 + 62], std::ldexp(1.0f, 127));
    EXPECT_EQ(v[64 + 63], -std::ldexp(1.0f, 127));
    int nonzero = 0;
    for (float x : v) nonzero += x != 0.0f;
    EXPECT_EQ(nonzero, 9);  // the nine values above; -0 and the rest are zero
  }
};

TEST(SafetensorsCheckpointTest, Mxfp4PackedExpertsAgainstHandDecodedValues) {
  const Mxfp4Case c;
  const std::string name = "model.layers.3.mlp.experts.5.down_proj.weight";
  int variant = 0;
  for (DType weight_dtype : {DType::kU8, DType::kI8}) {
    for (DType scale_dtype : {DType::kU8, DType::kF8E8M0}) {
      const std::string dir = TmpDir(absl::StrCat("mxfp4_", variant++));
      SafetensorsWriter w;
      w.Add(name, weight_dtype, {2, 32}, c.packed);
      w.Add("model.layers.3.mlp.experts.5.down_proj.weight_scale", scale_dtype, {2, 2}, c.scale);
      ASSERT_TRUE(w.Write(dir + "/model.safetensors").ok());
      auto ck = SafetensorsCheckpoint::Open(dir);
      ASSERT_TRUE(ck.ok());
      auto v = ReadDequantized(ck->get(), name, {2, 64});
      ASSERT_TRUE(v.ok()) << v.status();
      c.Check(*v);
      auto storage = (*ck)->Storage(name);
      ASSERT_TRUE(storage.ok()) << storage.status();
      EXPECT_EQ(storage->kind, WeightStorageKind::kMxfp4);
      EXPECT_EQ(storage->shape, (std::vector<int64_t>{2, 64}));
      EXPECT_EQ(storage->stored_shape, (std::vector<int64_t>{2, 32}));
      EXPECT_EQ(storage->block_cols, 32);
      EXPECT_EQ(storage->ToString(),
                absl::StrCat("mxfp4 ", DTypeName(weight_dtype), " [2,32] -> [2,64], scale '", name,
                             "_scale' ", DTypeName(scale_dtype), " [2,2] per 1x32"));
      // The packed shape is not the shape a caller asks for.
      absl::Status st = (*ck)->ReadFloat32(name, {2, 32}, v->data());
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(st.message().find("stored packed as"), std::string::npos) << st;
    }
  }
}

// The same values as safetensors F4 (shape in values, not bytes), under DeepSeek's own scale
// name `P.scale`.
TEST(SafetensorsCheckpointTest, Mxfp4AsF4WithDeepSeekScaleName) {
  const Mxfp4Case c;
  const std::string dir = TmpDir("mxfp4_f4");
  SafetensorsWriter w;
  w.Add("layers.0.ffn.experts.0.w2.weight", DType::kF4, {2, 64}, c.packed);
  w.Add("layers.0.ffn.experts.0.w2.scale", DType::kF8E8M0, {2, 2}, c.scale);
  ASSERT_TRUE(w.Write(dir + "/model.safetensors").ok());
  auto ck = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  auto v = ReadDequantized(ck->get(), "layers.0.ffn.experts.0.w2.weight", {2, 64});
  ASSERT_TRUE(v.ok()) << v.status();
  c.Check(*v);
}

TEST(SafetensorsCheckpointTest, Mxfp4Errors) {
  const Mxfp4Case c;
  const std::string dir = TmpDir("mxfp4_bad");
  SafetensorsWriter w;
  std::vector<uint8_t> nan_scale = c.scale;
  nan_scale[3] = 0xFF;  // E8M0 NaN
  w.Add("nan.weight", DType::kU8, {2, 32}, c.packed);
  w.Add("nan.weight_scale", DType::kU8, {2, 2}, nan_scale);
  w.Add("grid.weight", DType::kU8, {2, 32}, c.packed);
  w.Add("grid.weight_scale", DType::kU8, {2, 4}, std::vector<uint8_t>(8, 127));
  w.Add("noscale.weight", DType::kU8, {2, 32}, c.packed);
  w.Add("two.weight", DType::kU8, {2, 32}, c.packed);
  w.Add("two.weight_scale", DType::kU8, {2, 2}, c.scale);
  w.Add("two.weight_scale_inv", DType::kU8, {2, 2}, c.scale);
  w.Add("int.weight", DType::kI32, {2}, std::vector<uint8_t>(8, 0));
  w.Add("badscale.weight", DType::kU8, {2, 32}, c.packed);
  w.Add("badscale.weight_scale", DType::kI16, {2, 2}, std::vector<uint8_t>(8, 0));
  ASSERT_TRUE(w.Write(dir + "/model.safetensors").ok());
  auto ck = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(ck.ok());
  std::vector<float> out(128);
  absl::Status st = (*ck)->ReadFloat32("nan.weight", {2, 64}, out.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'nan.weight_scale'"), std::string::npos) << st;
  EXPECT_NE(st.message().find("element 3"), std::string::npos) << st;
  EXPECT_NE(st.message().find("0xff"), std::string::npos) << st;

  st = (*ck)->ReadFloat32("grid.weight", {2, 64}, out.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'grid.weight_scale' has shape [2,4]"), std::string::npos) << st;
  EXPECT_NE(st.message().find("needs [2,2]"), std::string::npos) << st;

  st = (*ck)->ReadFloat32("noscale.weight", {2, 64}, out.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(st.message().find("'noscale.weight' of dtype U8 has no scale"), std::string::npos)
      << st;
  EXPECT_NE(st.message().find("MXFP4"), std::string::npos) << st;

  st = (*ck)->ReadFloat32("two.weight", {2, 64}, out.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("two scale tensors"), std::string::npos) << st;

  st = (*ck)->ReadFloat32("int.weight", {2}, out.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'int.weight' has dtype I32"), std::string::npos) << st;

  st = (*ck)->ReadFloat32("badscale.weight", {2, 64}, out.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'badscale.weight_scale'"), std::string::npos) << st;
  EXPECT_NE(st.message().find("I16"), std::string::npos) << st;
}

// Storage of plain tensors, and of a missing one.
TEST(SafetensorsCheckpointTest, StorageOfFloatTensors) {
  const std::string dir = TmpDir("storage_float");
  SafetensorsWriter w;
  w.AddBf16("n.weight", {4}, {1, 2, 3, 4});
  ASSERT_TRUE(w.Write(dir + "/model.safetensors").ok());
  auto ck = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(ck.ok());
  auto s = (*ck)->Storage("n.weight");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->kind, WeightStorageKind::kFloat);
  EXPECT_EQ(s->dtype, DType::kBF16);
  EXPECT_EQ(s->stored_bytes, 8);
  EXPECT_FALSE(s->scaled());
  EXPECT_EQ(s->ToString(), "float BF16 [4]");
  EXPECT_EQ((*ck)->Storage("m.weight").status().code(), absl::StatusCode::kNotFound);
}

// Integer tables (the V4 hash router's token -> experts), little-endian, range-checked.
TEST(SafetensorsCheckpointTest, ReadIndices) {
  const std::string dir = TmpDir("indices");
  SafetensorsWriter w;
  // I64 [2, 2] = {3, 0, 255, 1}; I32 with -1; U8 {7, 8}; a float tensor.
  w.Add("t.tid2eid", DType::kI64, {2, 2}, {3,   0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                           255, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0});
  w.Add("neg", DType::kI32, {2}, {5, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF});
  w.Add("small", DType::kU8, {2}, {7, 8});
  w.AddFloat32("f", {1}, {1.0f});
  ASSERT_TRUE(w.Write(dir + "/model.safetensors").ok());
  auto ck = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(ck.ok());
  int32_t out[4];
  ASSERT_TRUE((*ck)->ReadIndices("t.tid2eid", {2, 2}, 256, out).ok());
  EXPECT_EQ(out[0], 3);
  EXPECT_EQ(out[1], 0);
  EXPECT_EQ(out[2], 255);
  EXPECT_EQ(out[3], 1);
  absl::Status st = (*ck)->ReadIndices("t.tid2eid", {2, 2}, 255, out);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("element 2 is 255, outside [0, 255)"), std::string::npos) << st;
  st = (*ck)->ReadIndices("neg", {2}, 8, out);
  EXPECT_NE(st.message().find("element 1 is -1"), std::string::npos) << st;
  ASSERT_TRUE((*ck)->ReadIndices("small", {2}, 9, out).ok());
  EXPECT_EQ(out[1], 8);
  st = (*ck)->ReadIndices("f", {1}, 9, out);
  EXPECT_NE(st.message().find("has dtype F32"), std::string::npos) << st;
  EXPECT_EQ((*ck)->ReadIndices("small", {3}, 9, out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*ck)->ReadIndices("none", {3}, 9, out).code(), absl::StatusCode::kNotFound);
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
