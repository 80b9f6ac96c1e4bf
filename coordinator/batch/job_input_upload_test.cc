#include "coordinator/batch/job_input_upload.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;

std::string TempFile(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream b;
  b << in.rdbuf();
  return b.str();
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// Blank lines (only spaces, tabs, CR, VT, FF) are not requests; the last line may lack its
// newline.
constexpr char kInput[] = "{\"a\":1}\n\n  \t\r\n{\"b\":2}\r\n\v\f\n x\n{\"c\":3}";

TEST(JobInputUploadTest, AnyChunkingCountsTheSameLinesAndBytes) {
  const std::string input = kInput;
  for (size_t chunk : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, input.size()}) {
    const std::string path = TempFile(absl::StrCat("in-", chunk));
    auto upload = JobInputUpload::Create(path, static_cast<int64_t>(input.size()));
    ASSERT_TRUE(upload.ok()) << upload.status();
    for (size_t i = 0; i < input.size(); i += chunk) {
      ASSERT_TRUE((*upload)->Append(absl::string_view(input).substr(i, chunk)).ok());
    }
    auto staged = (*upload)->Finish("");
    ASSERT_TRUE(staged.ok()) << staged.status();
    EXPECT_EQ(staged->request_lines, 4) << "chunk " << chunk;
    EXPECT_EQ(staged->bytes, static_cast<int64_t>(input.size()));
    EXPECT_EQ(staged->sha256.size(), 32u);
    upload->reset();  // a finished upload's file stays
    EXPECT_EQ(ReadFile(path), input);
  }
}

TEST(JobInputUploadTest, ChecksTheAnnouncedSizeAndChecksum) {
  Sha256 h;
  h.Update("x\n");
  const std::string digest = h.Finish();
  {
    auto upload = JobInputUpload::Create(TempFile("right"), 2);
    ASSERT_TRUE((*upload)->Append("x\n").ok());
    EXPECT_TRUE((*upload)->Finish(digest).ok());
  }
  {
    auto upload = JobInputUpload::Create(TempFile("long"), 2);
    EXPECT_THAT(std::string((*upload)->Append("x\ny\n").message()),
                HasSubstr("more input than the 2 bytes announced"));
  }
  {
    const std::string path = TempFile("short");
    auto upload = JobInputUpload::Create(path, 5);
    ASSERT_TRUE((*upload)->Append("x\n").ok());
    auto staged = (*upload)->Finish("");
    EXPECT_EQ(staged.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(staged.status().message()), HasSubstr("after 2 of the 5 bytes"));
    upload->reset();
    EXPECT_FALSE(Exists(path));  // an upload that failed leaves nothing behind
  }
  {
    auto upload = JobInputUpload::Create(TempFile("wrong"), -1);
    ASSERT_TRUE((*upload)->Append("y\n").ok());
    EXPECT_THAT(std::string((*upload)->Finish(digest).status().message()),
                HasSubstr("do not have the SHA-256"));
  }
}

TEST(JobInputUploadTest, AFullDiskIsResourceExhausted) {
  // /dev/full answers every write with ENOSPC.
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no writable /dev/full here";
  const std::string path = TempFile("full");
  std::remove(path.c_str());
  ASSERT_EQ(symlink("/dev/full", path.c_str()), 0);
  auto upload = JobInputUpload::Create(path, -1);
  ASSERT_TRUE(upload.ok()) << upload.status();
  absl::Status s = (*upload)->Append("x\n");
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
}

TEST(JobInputUploadTest, AnUnwritablePathIsAClearError) {
  auto upload = JobInputUpload::Create("/proc/deepinfer-no/in.jsonl", -1);
  ASSERT_FALSE(upload.ok());
  EXPECT_THAT(std::string(upload.status().message()), HasSubstr("/proc/deepinfer-no/in.jsonl"));
}

}  // namespace
}  // namespace deepinfer
