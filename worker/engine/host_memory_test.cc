// HostMemory: MemAvailable parsed from /proc/meminfo text, a file and this machine.
#include "worker/engine/host_memory.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;

constexpr char kMeminfo[] =
    "MemTotal:       24684084 kB\n"
    "MemFree:        16819196 kB\n"
    "MemAvailable:   21612004 kB\n"
    "Buffers:           76280 kB\n";

std::string TempFile(const std::string& name, const std::string& text) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(HostMemoryTest, ParsesMemAvailableInKib) {
  auto bytes = ParseMemAvailable(kMeminfo);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, int64_t{21612004} * 1024);
}

TEST(HostMemoryTest, RefusesTextWithoutAReadableMemAvailable) {
  EXPECT_THAT(std::string(ParseMemAvailable("MemTotal: 1 kB\n").status().message()),
              HasSubstr("no MemAvailable line"));
  for (const char* bad : {"MemAvailable: many kB\n", "MemAvailable: 12 MB\n",
                          "MemAvailable: -3 kB\n", "MemAvailable:\n"}) {
    EXPECT_EQ(ParseMemAvailable(bad).status().code(), absl::StatusCode::kDataLoss) << bad;
  }
}

TEST(HostMemoryTest, ProcMeminfoReadsTheFile) {
  auto bytes = ProcMeminfo(TempFile("meminfo", kMeminfo)).AvailableBytes();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, int64_t{21612004} * 1024);
  auto missing = ProcMeminfo("/nonexistent/meminfo").AvailableBytes();
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  auto empty = ProcMeminfo(TempFile("empty_meminfo", "")).AvailableBytes();
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("empty_meminfo"));
}

TEST(HostMemoryTest, ThisMachineHasSomeMemoryAvailable) {
  auto bytes = ProcMeminfo().AvailableBytes();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_GT(*bytes, 0);
}

}  // namespace
}  // namespace deepinfer
