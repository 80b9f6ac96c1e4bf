#include "common/rpc/daemon.h"

#include <signal.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace deepinfer {
namespace {

sigset_t TerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

void InitDaemonLogging(const char* argv0, const std::string& log_dir, int verbosity) {
  if (log_dir.empty()) {
    FLAGS_logtostderr = true;
  } else {
    FLAGS_log_dir = log_dir;
    FLAGS_alsologtostderr = false;
  }
  FLAGS_v = verbosity;
  google::InitGoogleLogging(argv0);
}

void BlockTerminationSignals() {
  sigset_t set = TerminationSignals();
  CHECK_EQ(pthread_sigmask(SIG_BLOCK, &set, nullptr), 0);
}

int WaitForTerminationSignal() {
  sigset_t set = TerminationSignals();
  int signal = 0;
  CHECK_EQ(sigwait(&set, &signal), 0);
  return signal;
}

absl::Status WritePortFile(const std::string& path, int port) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << port << "\n";
    if (!out.good()) return absl::InternalError(absl::StrCat("cannot write port file '", tmp, "'"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename '", tmp, "' to '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace deepinfer
