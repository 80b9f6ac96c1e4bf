// Process plumbing shared by the daemons' main.cc: logging set-up, waiting for
// SIGTERM/SIGINT, and writing the bound port to a file for scripts and tests.
#ifndef DEEPINFER_COMMON_RPC_DAEMON_H_
#define DEEPINFER_COMMON_RPC_DAEMON_H_

#include <iostream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "glog/logging.h"

namespace deepinfer {

// Initialises glog: to stderr, or into `log_dir` when it is non-empty; `verbosity`
// is glog's --v.
void InitDaemonLogging(const char* argv0, const std::string& log_dir, int verbosity);

// Blocks SIGTERM and SIGINT in the calling thread and in every thread it starts
// afterwards, so that only WaitForTerminationSignal() sees them. Call first in main.
void BlockTerminationSignals();

// Waits for SIGTERM or SIGINT; returns the signal number.
int WaitForTerminationSignal();

// Writes `port` to `path` atomically (write to a temporary file, then rename), so a
// reader never sees a half-written number.
absl::Status WritePortFile(const std::string& path, int port);

// The end of a daemon's main: reports a server that failed to start, writes its port to
// `port_file` (if set), serves until SIGTERM/SIGINT, then shuts it down. Returns the exit
// status (1 if it could not start or write the port file). Server: port() and Shutdown().
template <typename Server>
int ServeUntilSignal(const char* daemon, absl::StatusOr<std::unique_ptr<Server>> server,
                     const std::string& port_file) {
  if (!server.ok()) {
    std::cerr << daemon << ": " << server.status().message() << "\n";
    return 1;
  }
  if (!port_file.empty()) {
    if (absl::Status s = WritePortFile(port_file, (*server)->port()); !s.ok()) {
      std::cerr << daemon << ": " << s.message() << "\n";
      return 1;
    }
  }
  const int signal = WaitForTerminationSignal();
  LOG(INFO) << "signal " << signal << " received, shutting down";
  (*server)->Shutdown();
  return 0;
}

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_RPC_DAEMON_H_
