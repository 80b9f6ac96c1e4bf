// Process plumbing shared by the daemons' main.cc: logging set-up, waiting for
// SIGTERM/SIGINT, and writing the bound port to a file for scripts and tests.
#ifndef DEEPINFER_COORDINATOR_RPC_DAEMON_H_
#define DEEPINFER_COORDINATOR_RPC_DAEMON_H_

#include <string>

#include "absl/status/status.h"

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

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_RPC_DAEMON_H_
