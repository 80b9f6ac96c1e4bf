#include "worker/comm/tcp_socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace deepinfer::comm {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

absl::Status SetNonBlockingNoDelay(int fd, bool tcp) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return absl::InternalError(absl::StrCat("fcntl(O_NONBLOCK): ", ErrnoText(errno)));
  }
  if (tcp) {
    // Frames are written header and payload together; small collectives (barriers,
    // counts) must not wait for Nagle's timer.
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0) {
      return absl::InternalError(absl::StrCat("setsockopt(TCP_NODELAY): ", ErrnoText(errno)));
    }
  }
  return absl::OkStatus();
}

// Waits until `fd` has one of `events`; DEADLINE_EXCEEDED at `deadline`.
absl::Status WaitFor(int fd, short events, absl::Time deadline, const char* what) {
  while (true) {
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, PollTimeoutMs(deadline));
    if (n > 0) return absl::OkStatus();  // errors show up in the next syscall
    if (n < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", ErrnoText(errno)));
    }
    if (n == 0 && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("timed out waiting to ", what));
    }
  }
}

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};

absl::StatusOr<std::unique_ptr<addrinfo, AddrInfoDeleter>> Resolve(const std::string& host,
                                                                   int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* result = nullptr;
  const std::string service = absl::StrCat(port);
  const int rc = getaddrinfo(IsWildcardHost(host) && passive ? nullptr : host.c_str(),
                             service.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  return std::unique_ptr<addrinfo, AddrInfoDeleter>(result);
}

}  // namespace

ScopedFd& ScopedFd::operator=(ScopedFd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

void ScopedFd::reset(int fd) {
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not HOST:PORT"));
  }
  HostPort hp;
  absl::string_view host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  hp.host = std::string(host);
  if (!absl::SimpleAtoi(address.substr(colon + 1), &hp.port) || hp.port < 0 || hp.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' has no valid port"));
  }
  return hp;
}

std::string JoinHostPort(absl::string_view host, int port) {
  if (host.find(':') != absl::string_view::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

bool IsWildcardHost(absl::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::";
}

int PollTimeoutMs(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), 1 << 30));
}

absl::StatusOr<ScopedFd> ListenTcp(const std::string& host, int port) {
  auto addrs = Resolve(host, port, /*passive=*/true);
  if (!addrs.ok()) return addrs.status();
  std::string errors;
  for (addrinfo* a = addrs->get(); a != nullptr; a = a->ai_next) {
    ScopedFd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) continue;
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd.get(), a->ai_addr, a->ai_addrlen) < 0 || listen(fd.get(), 128) < 0) {
      absl::StrAppend(&errors, " ", ErrnoText(errno));
      continue;
    }
    if (absl::Status s = SetNonBlockingNoDelay(fd.get(), /*tcp=*/false); !s.ok()) return s;
    return fd;
  }
  return absl::UnavailableError(
      absl::StrCat("cannot listen on ", JoinHostPort(host, port), ":", errors));
}

absl::StatusOr<int> LocalPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) < 0) {
    return absl::InternalError(absl::StrCat("getsockname: ", ErrnoText(errno)));
  }
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
}

absl::StatusOr<std::string> LocalHost(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) < 0) {
    return absl::InternalError(absl::StrCat("getsockname: ", ErrnoText(errno)));
  }
  char text[INET6_ADDRSTRLEN] = {};
  const void* src =
      addr.ss_family == AF_INET
          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&addr)->sin_addr)
          : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr);
  if (inet_ntop(addr.ss_family, src, text, sizeof(text)) == nullptr) {
    return absl::InternalError(absl::StrCat("inet_ntop: ", ErrnoText(errno)));
  }
  return std::string(text);
}

absl::StatusOr<ScopedFd> ConnectTcp(const std::string& address, absl::Time deadline) {
  absl::StatusOr<HostPort> hp = ParseHostPort(address);
  if (!hp.ok()) return hp.status();
  auto addrs = Resolve(hp->host, hp->port, /*passive=*/false);
  if (!addrs.ok()) return addrs.status();
  std::string errors;
  for (addrinfo* a = addrs->get(); a != nullptr; a = a->ai_next) {
    ScopedFd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) continue;
    if (absl::Status s = SetNonBlockingNoDelay(fd.get(), /*tcp=*/true); !s.ok()) return s;
    // Non-blocking connect, so that an unreachable host costs at most the deadline rather
    // than the kernel's SYN retry time.
    if (connect(fd.get(), a->ai_addr, a->ai_addrlen) < 0) {
      if (errno != EINPROGRESS) {
        absl::StrAppend(&errors, " ", ErrnoText(errno));
        continue;
      }
      if (absl::Status s = WaitFor(fd.get(), POLLOUT, deadline, "connect"); !s.ok()) {
        return absl::DeadlineExceededError(absl::StrCat("connecting to ", address, ": timed out"));
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        absl::StrAppend(&errors, " ", ErrnoText(err));
        continue;
      }
    }
    return fd;
  }
  return absl::UnavailableError(absl::StrCat("cannot connect to ", address, ":", errors));
}

absl::StatusOr<ScopedFd> AcceptTcp(int listen_fd, absl::Time deadline) {
  while (true) {
    ScopedFd fd(accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (fd.valid()) {
      if (absl::Status s = SetNonBlockingNoDelay(fd.get(), /*tcp=*/true); !s.ok()) return s;
      return fd;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::InternalError(absl::StrCat("accept: ", ErrnoText(errno)));
    }
    if (absl::Status s = WaitFor(listen_fd, POLLIN, deadline, "accept a connection"); !s.ok()) {
      return s;
    }
  }
}

absl::Status WriteFull(int fd, const void* data, size_t n, absl::Time deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (absl::Status s = WaitFor(fd, POLLOUT, deadline, "send"); !s.ok()) return s;
      continue;
    }
    return absl::UnavailableError(absl::StrCat("connection lost: ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

absl::Status ReadFull(int fd, void* data, size_t n, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return absl::UnavailableError("connection closed by the peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (absl::Status s = WaitFor(fd, POLLIN, deadline, "receive"); !s.ok()) return s;
      continue;
    }
    return absl::UnavailableError(absl::StrCat("connection lost: ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

}  // namespace deepinfer::comm
