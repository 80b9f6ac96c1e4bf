#include "tests/testing/subprocess.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace deepinfer::testing {

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         const std::string& log_prefix, absl::Duration timeout) {
  absl::StatusOr<Subprocess> process = Subprocess::Start(argv, log_prefix);
  if (!process.ok()) return process.status();
  absl::StatusOr<int> code = process->Wait(timeout);
  if (!code.ok()) return code.status();
  return CommandResult{*code, process->ReadStdout(), process->ReadStderr()};
}

std::string Runfile(const std::string& path) {
  const char* root = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(root ? root : ".", "/", workspace ? workspace : "deepinfer", "/", path);
}

std::string TempPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp ? tmp : "/tmp", "/", name);
}

int WaitForPortFile(const std::string& path, absl::Duration timeout) {
  int port = 0;
  WaitUntil(
      [&] {
        std::ifstream in(path);
        std::string text;
        return std::getline(in, text) && absl::SimpleAtoi(text, &port) && port > 0;
      },
      timeout);
  return port > 0 ? port : 0;
}

}  // namespace deepinfer::testing
