// FindBenchBinary: where `deepinfer bench` looks for deepinfer-bench, and the error when it is
// nowhere.
#include "coordinator/cli/bench_command.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

std::string TempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(tmp ? tmp : "/tmp") + "/" + name;
  mkdir(dir.c_str(), 0755);
  return dir;
}

void MakeFile(const std::string& path, mode_t mode) {
  std::ofstream(path) << "#!/bin/sh\n";
  chmod(path.c_str(), mode);
}

TEST(FindBenchBinaryTest, NextToTheCliBinary) {
  unsetenv("DEEPINFER_BENCH");
  const std::string bin = TempDir("bin");
  MakeFile(bin + "/deepinfer-bench", 0755);
  EXPECT_EQ(FindBenchBinary(bin).value(), bin + "/deepinfer-bench");
}

TEST(FindBenchBinaryTest, InTheBazelTree) {
  unsetenv("DEEPINFER_BENCH");
  const std::string root = TempDir("tree");
  for (const char* d : {"/coordinator", "/coordinator/cli", "/tools", "/tools/bench"}) {
    mkdir((root + d).c_str(), 0755);
  }
  MakeFile(root + "/tools/bench/deepinfer-bench", 0755);
  EXPECT_EQ(FindBenchBinary(root + "/coordinator/cli").value(),
            root + "/coordinator/cli/../../tools/bench/deepinfer-bench");
}

TEST(FindBenchBinaryTest, NotExecutableOrMissingIsNotFound) {
  unsetenv("DEEPINFER_BENCH");
  const std::string dir = TempDir("noexec");
  MakeFile(dir + "/deepinfer-bench", 0644);
  auto found = FindBenchBinary(dir);
  EXPECT_EQ(found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(found.status().message()), testing::HasSubstr(dir + "/deepinfer-bench"));
}

TEST(FindBenchBinaryTest, EnvironmentOverride) {
  const std::string dir = TempDir("env");
  MakeFile(dir + "/my-bench", 0755);
  setenv("DEEPINFER_BENCH", (dir + "/my-bench").c_str(), 1);
  EXPECT_EQ(FindBenchBinary("/nonexistent").value(), dir + "/my-bench");
  setenv("DEEPINFER_BENCH", (dir + "/missing").c_str(), 1);
  EXPECT_EQ(FindBenchBinary("/nonexistent").status().code(), absl::StatusCode::kNotFound);
  unsetenv("DEEPINFER_BENCH");
}

}  // namespace
}  // namespace deepinfer
