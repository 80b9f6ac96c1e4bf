// TCP plumbing for TcpCommunicator: an owned descriptor, host:port parsing, and listen /
// connect / accept / read / write that all take a deadline, so that no step of the
// rendezvous can block forever. Sockets are non-blocking; waiting is done with poll().
#ifndef DEEPINFER_WORKER_COMM_TCP_SOCKET_H_
#define DEEPINFER_WORKER_COMM_TCP_SOCKET_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace deepinfer::comm {

// Owns a file descriptor; closes it on destruction.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.release()) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;
  int port = 0;
};
// "host:port" or "[v6addr]:port"; INVALID_ARGUMENT otherwise.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address);
// The inverse; brackets an IPv6 literal.
std::string JoinHostPort(absl::string_view host, int port);

// A listening, non-blocking socket on host:port (port 0 picks a free one).
absl::StatusOr<ScopedFd> ListenTcp(const std::string& host, int port);
// The port / numeric host of a socket's local end.
absl::StatusOr<int> LocalPort(int fd);
absl::StatusOr<std::string> LocalHost(int fd);
// Whether `host` means "every interface" (0.0.0.0, ::, or empty).
bool IsWildcardHost(absl::string_view host);

// Connects to `address` ("host:port"); the socket is non-blocking with TCP_NODELAY.
// UNAVAILABLE when refused or unreachable (the caller may retry: the listener may not be
// up yet), DEADLINE_EXCEEDED when `deadline` passes first.
absl::StatusOr<ScopedFd> ConnectTcp(const std::string& address, absl::Time deadline);
// Accepts one connection (non-blocking, TCP_NODELAY); DEADLINE_EXCEEDED at `deadline`.
absl::StatusOr<ScopedFd> AcceptTcp(int listen_fd, absl::Time deadline);

// Write / read exactly `n` bytes. UNAVAILABLE when the peer closes or resets the
// connection, DEADLINE_EXCEEDED at `deadline`.
absl::Status WriteFull(int fd, const void* data, size_t n, absl::Time deadline);
absl::Status ReadFull(int fd, void* data, size_t n, absl::Time deadline);

// Milliseconds until `deadline` for poll(): >= 0, rounded up, capped to fit an int.
int PollTimeoutMs(absl::Time deadline);

}  // namespace deepinfer::comm

#endif  // DEEPINFER_WORKER_COMM_TCP_SOCKET_H_
