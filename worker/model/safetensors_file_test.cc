// Tests for SafetensorsFile: parsing with each dtype, and corrupt/truncated files.
#include "worker/model/safetensors_file.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "gtest/gtest.h"
#include "worker/model/safetensors_writer.h"

namespace deepinfer {
namespace {

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

TEST(SafetensorsFileTest, ReadsMixedDtypes) {
  SafetensorsWriter w;
  w.AddFloat32("a", {2, 2}, {1, 2, 3, 4});
  w.AddBf16("b", {3}, {1.5f, -2.0f, 0.25f});
  w.Add("c", DType::kF16, {2}, {0x00, 0x3E, 0x00, 0xC0});  // 1.5, -2 (little endian)
  w.Add("d", DType::kF8E4M3, {2}, {0x38, 0x7E});
  const std::string path = TmpPath("mixed.safetensors");
  ASSERT_TRUE(w.Write(path).ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->tensors().size(), 4u);
  const SafetensorsTensor* b = (*f)->Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{3}));
  float out[4];
  ASSERT_TRUE(ConvertToFloat32(b->dtype, b->data, 3, out).ok());
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 0.25f);
  const SafetensorsTensor* c = (*f)->Find("c");
  ASSERT_TRUE(ConvertToFloat32(c->dtype, c->data, 2, out).ok());
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -2.0f);
  const SafetensorsTensor* d = (*f)->Find("d");
  ASSERT_TRUE(ConvertToFloat32(d->dtype, d->data, 2, out).ok());
  EXPECT_EQ(out[1], 448.0f);
  const SafetensorsTensor* a = (*f)->Find("a");
  ASSERT_TRUE(ConvertToFloat32(a->dtype, a->data, 4, out).ok());
  EXPECT_EQ(out[3], 4.0f);
  EXPECT_EQ((*f)->Find("zzz"), nullptr);
}

TEST(SafetensorsFileTest, TruncatedFileNamesFileAndTensor) {
  SafetensorsWriter w;
  w.AddFloat32("model.layers.0.w", {64}, std::vector<float>(64, 1.0f));
  const std::string path = TmpPath("trunc.safetensors");
  ASSERT_TRUE(w.Write(path).ok());
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string cut = TmpPath("cut.safetensors");
  std::ofstream(cut, std::ios::binary).write(bytes.data(), bytes.size() - 10);
  auto f = SafetensorsFile::Open(cut);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find(cut), std::string::npos) << f.status();
  EXPECT_NE(f.status().message().find("model.layers.0.w"), std::string::npos) << f.status();
  // Cut inside the header.
  std::ofstream(cut, std::ios::binary).write(bytes.data(), 20);
  f = SafetensorsFile::Open(cut);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("truncated"), std::string::npos) << f.status();
  std::ofstream(cut, std::ios::binary).write(bytes.data(), 4);
  EXPECT_FALSE(SafetensorsFile::Open(cut).ok());
  EXPECT_EQ(SafetensorsFile::Open(TmpPath("nope")).status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsFileTest, CorruptHeader) {
  const std::string path = TmpPath("bad.safetensors");
  std::string header = "{\"x\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}";
  uint64_t len = header.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << header << std::string(8, '\0');
  out.close();
  auto f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok());  // 3 floats need 12 bytes, offsets say 8
  EXPECT_NE(f.status().message().find("'x'"), std::string::npos) << f.status();
  std::ofstream bad(path, std::ios::binary);
  len = 5;
  bad.write(reinterpret_cast<const char*>(&len), 8);
  bad << "{oops";
  bad.close();
  EXPECT_FALSE(SafetensorsFile::Open(path).ok());
}

// The MX dtypes: F4 shapes count values (two a byte), F8_E8M0 one a byte.
TEST(SafetensorsFileTest, SubByteAndScaleDtypes) {
  SafetensorsWriter w;
  w.Add("w", DType::kF4, {2, 4}, {0x72, 0x9F, 0x00, 0x01});  // 8 values in 4 bytes
  w.Add("s", DType::kF8E8M0, {2}, {127, 0});
  w.Add("e", DType::kF8E5M2, {1}, {0x3C});
  w.Add("c", DType::kC64, {1}, std::vector<uint8_t>(8, 0));
  const std::string path = TmpPath("mx.safetensors");
  ASSERT_TRUE(w.Write(path).ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const SafetensorsTensor* t = (*f)->Find("w");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->nbytes, 4u);
  float out[8];
  ASSERT_TRUE(ConvertToFloat32(t->dtype, t->data, 8, out).ok());
  EXPECT_EQ(out[1], 6.0f);
  EXPECT_EQ(out[2], -6.0f);
  EXPECT_EQ(out[6], 0.5f);
  const SafetensorsTensor* s = (*f)->Find("s");
  ASSERT_TRUE(ConvertToFloat32(s->dtype, s->data, 2, out).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], std::ldexp(1.0f, -127));
  const SafetensorsTensor* e = (*f)->Find("e");
  ASSERT_TRUE(ConvertToFloat32(e->dtype, e->data, 1, out).ok());
  EXPECT_EQ(out[0], 1.0f);
  const SafetensorsTensor* c = (*f)->Find("c");
  EXPECT_EQ(ConvertToFloat32(c->dtype, c->data, 1, out).code(), absl::StatusCode::kInvalidArgument);
}

void WriteRaw(const std::string& path, const std::string& header, size_t data_bytes) {
  uint64_t len = header.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << header << std::string(data_bytes, '\0');
}

TEST(SafetensorsFileTest, OddF4CountAndHugeShapesRefused) {
  const std::string path = TmpPath("odd.safetensors");
  WriteRaw(path, R"({"w": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}})", 2);
  auto f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("'w'"), std::string::npos) << f.status();
  EXPECT_NE(f.status().message().find("whole bytes"), std::string::npos) << f.status();
  // 2^32 x 2^32 elements would wrap a 64-bit count to 0 and match empty data.
  WriteRaw(path,
           R"({"h": {"dtype": "U8", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})",
           0);
  f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("'h'"), std::string::npos) << f.status();
  EXPECT_NE(f.status().message().find("more elements than"), std::string::npos) << f.status();
}

}  // namespace
}  // namespace deepinfer
