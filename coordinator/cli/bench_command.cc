// BenchCommand implementation.
#include "coordinator/cli/bench_command.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace deepinfer {
namespace {

std::string SelfDir() {
  char path[4096] = {0};
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  const std::string self = n > 0 ? std::string(path, n) : std::string(".");
  return self.substr(0, self.find_last_of('/'));
}

bool IsExecutable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

}  // namespace

absl::StatusOr<std::string> FindBenchBinary(const std::string& self_dir) {
  if (const char* env = std::getenv("DEEPINFER_BENCH"); env != nullptr && *env != '\0') {
    if (IsExecutable(env)) return std::string(env);
    return absl::NotFoundError(
        absl::StrCat("DEEPINFER_BENCH='", env, "' is not an executable file"));
  }
  const std::vector<std::string> tried = {self_dir + "/deepinfer-bench",
                                          self_dir + "/../../tools/bench/deepinfer-bench"};
  for (const std::string& path : tried) {
    if (IsExecutable(path)) return path;
  }
  return absl::NotFoundError(absl::StrCat("cannot find deepinfer-bench (tried ",
                                          absl::StrJoin(tried, ", "),
                                          "); build it (tools/setup.sh) or set DEEPINFER_BENCH"));
}

int BenchCommand(const std::vector<std::string>& args) {
  auto path = FindBenchBinary(SelfDir());
  if (!path.ok()) {
    std::cerr << "deepinfer bench: " << path.status().message() << "\n";
    return 1;
  }
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(path->c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execv(path->c_str(), argv.data());
  std::cerr << "deepinfer bench: cannot run " << *path << ": " << std::strerror(errno) << "\n";
  return 127;
}

}  // namespace deepinfer
