#include "common/rpc/auth.h"

#include <cstdio>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;

std::string WriteTemp(const std::string& name, const std::string& content) {
  std::string path = std::string(getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path) << content;
  return path;
}

TEST(ReadAuthTokenFileTest, StripsWhitespace) {
  auto token = ReadAuthTokenFile(WriteTemp("t1", "  s3cret \n"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cret");
}

TEST(ReadAuthTokenFileTest, ErrorsNameThePath) {
  auto missing = ReadAuthTokenFile("/nonexistent/token");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("/nonexistent/token"));
  auto empty = ReadAuthTokenFile(WriteTemp("t2", "\n \n"));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("is empty"));
  auto two_lines = ReadAuthTokenFile(WriteTemp("t3", "a\nb\n"));
  EXPECT_EQ(two_lines.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StatusConversionTest, RoundTrips) {
  absl::Status s = absl::UnauthenticatedError("no");
  grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ToAbslStatus(g), s);
}

}  // namespace
}  // namespace deepinfer
