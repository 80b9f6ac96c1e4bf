// Helpers for multi-process tests: Subprocess (a ChildProcess), runfile paths,
// scratch paths, running a command to completion, polling.
#ifndef DEEPINFER_TESTS_TESTING_SUBPROCESS_H_
#define DEEPINFER_TESTS_TESTING_SUBPROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/cli/child_process.h"

namespace deepinfer::testing {

using Subprocess = ::deepinfer::ChildProcess;

// Runs a command to completion (up to `timeout`), returning exit code and output.
struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         const std::string& log_prefix,
                                         absl::Duration timeout = absl::Seconds(60));

// Path of a binary of this workspace inside the test's runfiles,
// e.g. Runfile("coordinator/deepinfer-coordinator").
std::string Runfile(const std::string& path);

// A fresh scratch directory path under TEST_TMPDIR.
std::string TempPath(const std::string& name);

// Polls `done` every 20 ms until it returns true or `timeout` passes.
template <typename F>
bool WaitUntil(F done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return done();
}

// Waits until `path` holds a port number (> 0) on its first line, as the daemons' --port-file
// writes it; returns it, or 0 once `timeout` passed without one.
int WaitForPortFile(const std::string& path, absl::Duration timeout);

}  // namespace deepinfer::testing

#endif  // DEEPINFER_TESTS_TESTING_SUBPROCESS_H_
