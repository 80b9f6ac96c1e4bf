#include "worker/comm/tcp_frame.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer::comm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(FrameHeaderTest, RoundTripsAndIsLittleEndian) {
  FrameHeader h;
  h.op = FrameOp::kAllReduce;
  h.detail = 0x12;
  h.incarnation = 0x0102030405060708ull;
  h.sequence = 42;
  h.payload_bytes = (1ull << 40) + 3;
  uint8_t wire[FrameHeader::kSize];
  h.Encode(wire);
  EXPECT_EQ(wire[0], 'D');
  EXPECT_EQ(wire[3], 'M');
  EXPECT_EQ(wire[8], 0x08);  // incarnation, least significant byte first
  EXPECT_EQ(wire[15], 0x01);
  absl::StatusOr<FrameHeader> back = FrameHeader::Decode(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->op, FrameOp::kAllReduce);
  EXPECT_EQ(back->detail, 0x12);
  EXPECT_EQ(back->incarnation, h.incarnation);
  EXPECT_EQ(back->sequence, 42u);
  EXPECT_EQ(back->payload_bytes, h.payload_bytes);
}

TEST(FrameHeaderTest, RejectsGarbageVersionAndOp) {
  FrameHeader h;
  uint8_t wire[FrameHeader::kSize];
  h.Encode(wire);
  uint8_t bad[FrameHeader::kSize];
  std::copy(wire, wire + FrameHeader::kSize, bad);
  bad[0] ^= 0xff;
  EXPECT_THAT(FrameHeader::Decode(bad).status().message(), HasSubstr("magic"));
  std::copy(wire, wire + FrameHeader::kSize, bad);
  bad[4] = 9;
  EXPECT_THAT(FrameHeader::Decode(bad).status().message(), HasSubstr("version 9"));
  std::copy(wire, wire + FrameHeader::kSize, bad);
  bad[6] = 77;
  EXPECT_THAT(FrameHeader::Decode(bad).status().message(), HasSubstr("unknown frame op"));
}

TEST(HelloTest, RoundTrips) {
  Hello h;
  h.incarnation = 99;
  h.world_size = 4;
  h.rank = 3;
  h.listen_address = "127.0.0.1:4242";
  const std::string wire = h.Encode();
  ASSERT_GT(wire.size(), 4u);
  absl::StatusOr<Hello> back = Hello::DecodeBody(wire.substr(4));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->incarnation, 99u);
  EXPECT_EQ(back->world_size, 4);
  EXPECT_EQ(back->rank, 3);
  EXPECT_EQ(back->listen_address, "127.0.0.1:4242");
  // Truncated or padded bodies are refused, not half-read.
  EXPECT_FALSE(Hello::DecodeBody(wire.substr(4, wire.size() - 5)).ok());
  EXPECT_FALSE(Hello::DecodeBody(wire.substr(4) + "x").ok());
  EXPECT_FALSE(Hello::DecodeBody("GET / HTTP/1.1\r\n").ok());
}

TEST(HelloReplyTest, RoundTrips) {
  HelloReply r;
  r.ok = true;
  r.listen_addresses = {"", "a:1", "[::1]:2"};
  absl::StatusOr<HelloReply> back = HelloReply::DecodeBody(r.Encode().substr(4));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->ok);
  EXPECT_THAT(back->listen_addresses, ElementsAre("", "a:1", "[::1]:2"));

  HelloReply refusal;
  refusal.error = "go away";
  back = HelloReply::DecodeBody(refusal.Encode().substr(4));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->ok);
  EXPECT_EQ(back->error, "go away");
}

}  // namespace
}  // namespace deepinfer::comm
