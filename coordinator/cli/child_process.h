// ChildProcess: a program this process started (the daemons `deepinfer run` starts,
// or the processes of a multi-process test), with its output in log files, and ways
// to signal it and collect its exit.
#ifndef DEEPINFER_COORDINATOR_CLI_CHILD_PROCESS_H_
#define DEEPINFER_COORDINATOR_CLI_CHILD_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace deepinfer {

class ChildProcess {
 public:
  // Starts `argv[0]` with `argv`; output goes to `log_prefix`.stdout / .stderr (both
  // to `log_prefix` itself when `one_log` is set).
  static absl::StatusOr<ChildProcess> Start(const std::vector<std::string>& argv,
                                            const std::string& log_prefix, bool one_log = false);
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ~ChildProcess();  // SIGKILLs and reaps a process still running.

  void Signal(int signal);
  // True while the process runs (reaps it if it has exited; see exit_code()).
  bool Running();
  // The exit code once Running() returned false or Wait() succeeded.
  int exit_code() const { return exit_code_; }
  // Waits for the process to exit; returns its exit code, or 128+signal if a signal
  // ended it. DEADLINE_EXCEEDED if it is still running after `timeout`.
  absl::StatusOr<int> Wait(absl::Duration timeout);

  pid_t pid() const { return pid_; }
  std::string ReadStdout() const;
  std::string ReadStderr() const;

 private:
  ChildProcess(pid_t pid, std::string log_prefix, bool one_log)
      : pid_(pid), log_prefix_(std::move(log_prefix)), one_log_(one_log) {}
  pid_t pid_ = -1;
  std::string log_prefix_;
  bool one_log_ = false;
  int exit_code_ = -1;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_CLI_CHILD_PROCESS_H_
