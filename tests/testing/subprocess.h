// Subprocess: starts one of our binaries for a multi-process test, with its stdout
// and stderr going to files, and lets the test signal it and collect its exit.
#ifndef DEEPINFER_TESTS_TESTING_SUBPROCESS_H_
#define DEEPINFER_TESTS_TESTING_SUBPROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace deepinfer::testing {

class Subprocess {
 public:
  // Starts `argv[0]` with `argv`; output goes to `log_prefix`.stdout / .stderr.
  static absl::StatusOr<Subprocess> Start(const std::vector<std::string>& argv,
                                          const std::string& log_prefix);
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  ~Subprocess();  // SIGKILLs and reaps a process still running.

  void Signal(int signal);
  // Waits for the process to exit; returns its exit code, or 128+signal if a signal
  // ended it. DEADLINE_EXCEEDED if it is still running after `timeout`.
  absl::StatusOr<int> Wait(absl::Duration timeout);

  pid_t pid() const { return pid_; }
  std::string ReadStdout() const;
  std::string ReadStderr() const;

 private:
  Subprocess(pid_t pid, std::string log_prefix) : pid_(pid), log_prefix_(std::move(log_prefix)) {}
  pid_t pid_ = -1;
  std::string log_prefix_;
};

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

}  // namespace deepinfer::testing

#endif  // DEEPINFER_TESTS_TESTING_SUBPROCESS_H_
