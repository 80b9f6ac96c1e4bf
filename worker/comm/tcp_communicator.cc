#include "worker/comm/tcp_communicator.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace deepinfer::comm {
namespace {

// Longest abort reason we accept from a peer; longer payloads mean a broken stream.
constexpr uint64_t kMaxAbortText = 64 * 1024;
// How long an accepted connection may take to send its Hello.
constexpr absl::Duration kHelloTimeout = absl::Seconds(5);

std::string ErrnoText(int err) { return std::strerror(err); }

// Sends a length-prefixed handshake message.
absl::Status SendHandshake(int fd, const std::string& framed, absl::Time deadline) {
  return WriteFull(fd, framed.data(), framed.size(), deadline);
}

// Reads a length-prefixed handshake message body.
absl::StatusOr<std::string> ReadHandshake(int fd, absl::Time deadline) {
  uint8_t len_bytes[4];
  if (absl::Status s = ReadFull(fd, len_bytes, 4, deadline); !s.ok()) return s;
  const uint32_t len = static_cast<uint32_t>(len_bytes[0]) | (len_bytes[1] << 8) |
                       (len_bytes[2] << 16) | (static_cast<uint32_t>(len_bytes[3]) << 24);
  if (len > kMaxHandshakeBytes) {
    return absl::FailedPreconditionError("handshake message too long (not a communicator peer?)");
  }
  std::string body(len, '\0');
  if (absl::Status s = ReadFull(fd, body.data(), len, deadline); !s.ok()) return s;
  return body;
}

uint8_t ReduceDetail(DataType type, ReduceOp op) {
  return static_cast<uint8_t>((static_cast<int>(type) << 4) | static_cast<int>(op));
}

std::string DetailText(FrameOp op, uint8_t detail) {
  if (op != FrameOp::kAllReduce) return "";
  const auto type = static_cast<DataType>(detail >> 4);
  const auto reduce = static_cast<ReduceOp>(detail & 0xf);
  return absl::StrCat(" (", DataTypeName(type), " ", ReduceOpName(reduce), ")");
}

void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// The state of one peer's two directions during a collective.
struct PeerIo {
  int rank = -1;
  // Outgoing: header then payload.
  uint8_t header_out[FrameHeader::kSize];
  const uint8_t* payload_out = nullptr;
  size_t payload_out_bytes = 0;
  size_t sent = 0;  // of header + payload
  bool send_done = false;
  // Incoming: header, then payload straight into the caller's buffer.
  uint8_t header_in[FrameHeader::kSize];
  size_t header_got = 0;
  uint8_t* payload_in = nullptr;
  size_t payload_in_bytes = 0;
  size_t got = 0;
  bool recv_done = false;
  // Set when the peer's frame is an abort: its reason is read here instead.
  bool aborting = false;
  std::string abort_text;
};

}  // namespace

TcpCommunicator::TcpCommunicator(const TcpCommunicatorSpec& spec)
    : spec_(spec), peers_(spec.world_size), send_at_boundary_(spec.world_size, true) {}

TcpCommunicator::~TcpCommunicator() = default;  // ScopedFd closes; peers see EOF

absl::StatusOr<TcpCommunicator::RootListener> TcpCommunicator::ListenRoot(
    const std::string& address) {
  absl::StatusOr<HostPort> hp = ParseHostPort(address);
  if (!hp.ok()) return hp.status();
  absl::StatusOr<ScopedFd> fd = ListenTcp(hp->host, hp->port);
  if (!fd.ok()) return fd.status();
  absl::StatusOr<int> port = LocalPort(fd->get());
  if (!port.ok()) return port.status();
  RootListener root;
  root.fd = std::move(*fd);
  root.address = JoinHostPort(hp->host, *port);
  return root;
}

absl::StatusOr<std::unique_ptr<TcpCommunicator>> TcpCommunicator::Create(
    const TcpCommunicatorSpec& spec, std::unique_ptr<RootListener> root) {
  if (spec.world_size < 1 || spec.rank < 0 || spec.rank >= spec.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", spec.rank, " is not in a world of size ", spec.world_size));
  }
  if (spec.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeout must be positive");
  }
  if (root != nullptr && spec.rank != 0) {
    return absl::InvalidArgumentError("only rank 0 takes a root listener");
  }
  std::unique_ptr<TcpCommunicator> comm(new TcpCommunicator(spec));
  if (spec.world_size == 1) return comm;  // no peers, no sockets

  if (spec.group_incarnation == 0) {
    return absl::InvalidArgumentError("group_incarnation must be non-zero");
  }
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) < 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", ErrnoText(errno)));
  }
  comm->wake_read_.reset(pipe_fds[0]);
  comm->wake_write_.reset(pipe_fds[1]);

  const absl::Time deadline = absl::Now() + spec.timeout;
  absl::Status formed;
  if (spec.rank == 0) {
    ScopedFd listener;
    if (root != nullptr) {
      listener = std::move(root->fd);
    } else {
      absl::StatusOr<RootListener> bound = ListenRoot(spec.root_address);
      if (!bound.ok()) return bound.status();
      listener = std::move(bound->fd);
    }
    formed = comm->FormGroupAsRoot(std::move(listener), deadline);
  } else {
    formed = comm->FormGroupAsMember(deadline);
  }
  if (!formed.ok()) {
    return absl::Status(formed.code(), absl::StrCat("rank ", spec.rank, " of ", spec.world_size,
                                                    " joining the group at ", spec.root_address,
                                                    ": ", formed.message()));
  }
  VLOG(1) << "rank " << spec.rank << "/" << spec.world_size << " joined group "
          << spec.group_incarnation;
  return comm;
}

absl::StatusOr<Hello> TcpCommunicator::ReadAndCheckHello(int fd, int min_rank,
                                                         absl::Time deadline) const {
  // A connection that never says hello (a port scanner, a wedged process) must not hold
  // up the rank behind it until the group's deadline; real ranks send it at once.
  const absl::Time hello_deadline = std::min(deadline, absl::Now() + kHelloTimeout);
  absl::StatusOr<std::string> body = ReadHandshake(fd, hello_deadline);
  if (!body.ok()) return body.status();
  absl::StatusOr<Hello> hello = Hello::DecodeBody(*body);
  if (!hello.ok()) return hello.status();
  std::string refusal;
  if (hello->incarnation != spec_.group_incarnation) {
    refusal = absl::StrCat("group incarnation mismatch: rank ", hello->rank, " has ",
                           hello->incarnation, ", rank ", spec_.rank, " has ",
                           spec_.group_incarnation, " (a process from another group?)");
  } else if (hello->world_size != spec_.world_size) {
    refusal = absl::StrCat("world size mismatch: rank ", hello->rank, " says ", hello->world_size,
                           ", rank ", spec_.rank, " says ", spec_.world_size);
  } else if (hello->rank < min_rank || hello->rank >= spec_.world_size) {
    refusal = absl::StrCat("rank ", hello->rank, " may not connect to rank ", spec_.rank);
  } else if (peers_[hello->rank].valid()) {
    refusal = absl::StrCat("rank ", hello->rank, " has already joined");
  }
  if (!refusal.empty()) {
    HelloReply reply;
    reply.error = refusal;
    // Best effort: the refused process may be gone already.
    (void)SendHandshake(fd, reply.Encode(), std::min(deadline, absl::Now() + absl::Seconds(1)));
    return absl::FailedPreconditionError(refusal);
  }
  return hello;
}

absl::Status TcpCommunicator::FormGroupAsRoot(ScopedFd listener, absl::Time deadline) {
  std::vector<std::string> addresses(spec_.world_size);
  addresses[0] = spec_.root_address;
  int joined = 0;
  std::string last_refusal;
  while (joined < spec_.world_size - 1) {
    absl::StatusOr<ScopedFd> fd = AcceptTcp(listener.get(), deadline);
    if (!fd.ok()) {
      std::vector<int> missing;
      for (int r = 1; r < spec_.world_size; ++r) {
        if (!peers_[r].valid()) missing.push_back(r);
      }
      return absl::Status(
          fd.status().code(),
          absl::StrCat(fd.status().message(), "; ranks not joined: ", absl::StrJoin(missing, ", "),
                       last_refusal.empty() ? "" : "; last refused: ", last_refusal));
    }
    absl::StatusOr<Hello> hello = ReadAndCheckHello(fd->get(), 1, deadline);
    if (!hello.ok()) {
      // A stray or stale process must not stop the right one from joining after it.
      LOG(WARNING) << "rank 0 refused a connection: " << hello.status();
      last_refusal = std::string(hello.status().message());
      if (absl::Now() >= deadline) return hello.status();
      continue;
    }
    addresses[hello->rank] = hello->listen_address;
    peers_[hello->rank] = std::move(*fd);
    ++joined;
  }
  HelloReply reply;
  reply.ok = true;
  reply.listen_addresses = addresses;
  const std::string framed = reply.Encode();
  for (int r = 1; r < spec_.world_size; ++r) {
    if (absl::Status s = SendHandshake(peers_[r].get(), framed, deadline); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("sending the rank layout to rank ", r, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status TcpCommunicator::FormGroupAsMember(absl::Time deadline) {
  absl::StatusOr<ScopedFd> listener = ListenTcp(spec_.listen_host, 0);
  if (!listener.ok()) return listener.status();
  absl::StatusOr<int> port = LocalPort(listener->get());
  if (!port.ok()) return port.status();

  // Rank 0 may not be listening yet: retry refused connections until the deadline.
  ScopedFd root;
  while (true) {
    absl::StatusOr<ScopedFd> fd = ConnectTcp(spec_.root_address, deadline);
    if (fd.ok()) {
      root = std::move(*fd);
      break;
    }
    if (!absl::IsUnavailable(fd.status()) || absl::Now() >= deadline) {
      return absl::Status(fd.status().code(), absl::StrCat("rank 0: ", fd.status().message()));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  std::string advertised_host = spec_.listen_host;
  if (IsWildcardHost(advertised_host)) {
    // The address we reach rank 0 from is one the other ranks can reach us at, in the
    // usual single-network case.
    absl::StatusOr<std::string> local = LocalHost(root.get());
    if (!local.ok()) return local.status();
    advertised_host = *local;
  }
  Hello hello;
  hello.incarnation = spec_.group_incarnation;
  hello.world_size = spec_.world_size;
  hello.rank = spec_.rank;
  hello.listen_address = JoinHostPort(advertised_host, *port);

  // Connects to `rank` at `address` and has the Hello accepted; returns the layout when
  // the peer is the root.
  auto join = [&](int rank, ScopedFd fd) -> absl::StatusOr<HelloReply> {
    absl::Status s = SendHandshake(fd.get(), hello.Encode(), deadline);
    absl::StatusOr<std::string> body =
        s.ok() ? ReadHandshake(fd.get(), deadline) : absl::StatusOr<std::string>(s);
    if (!body.ok()) {
      return absl::Status(body.status().code(), absl::StrCat("handshake with rank ", rank, ": ",
                                                             body.status().message()));
    }
    absl::StatusOr<HelloReply> reply = HelloReply::DecodeBody(*body);
    if (!reply.ok()) return reply.status();
    if (!reply->ok) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", rank, " refused this rank: ", reply->error));
    }
    peers_[rank] = std::move(fd);
    return reply;
  };

  absl::StatusOr<HelloReply> layout = join(0, std::move(root));
  if (!layout.ok()) return layout.status();
  if (layout->listen_addresses.size() != static_cast<size_t>(spec_.world_size)) {
    return absl::FailedPreconditionError("rank 0 sent a layout of the wrong size");
  }
  // Lower ranks are already listening (they bound before saying hello to rank 0), so
  // no retry is needed; each accepts its higher ranks only after connecting to its own
  // lower ones, which cannot deadlock because rank 1 has none but rank 0.
  for (int r = 1; r < spec_.rank; ++r) {
    absl::StatusOr<ScopedFd> fd = ConnectTcp(layout->listen_addresses[r], deadline);
    if (!fd.ok()) {
      return absl::Status(fd.status().code(),
                          absl::StrCat("rank ", r, ": ", fd.status().message()));
    }
    if (absl::StatusOr<HelloReply> reply = join(r, std::move(*fd)); !reply.ok()) {
      return reply.status();
    }
  }
  int expected = spec_.world_size - 1 - spec_.rank;
  while (expected > 0) {
    absl::StatusOr<ScopedFd> fd = AcceptTcp(listener->get(), deadline);
    if (!fd.ok()) {
      return absl::Status(fd.status().code(), absl::StrCat(fd.status().message(), " (", expected,
                                                           " higher rank(s) did not connect)"));
    }
    absl::StatusOr<Hello> peer = ReadAndCheckHello(fd->get(), spec_.rank + 1, deadline);
    if (!peer.ok()) {
      LOG(WARNING) << "rank " << spec_.rank << " refused a connection: " << peer.status();
      if (absl::Now() >= deadline) return peer.status();
      continue;
    }
    HelloReply ok;
    ok.ok = true;
    if (absl::Status s = SendHandshake(fd->get(), ok.Encode(), deadline); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("handshake with rank ", peer->rank, ": ", s.message()));
    }
    peers_[peer->rank] = std::move(*fd);
    --expected;
  }
  return absl::OkStatus();
}

uint64_t TcpCommunicator::collectives_run() const {
  absl::MutexLock lock(&op_mu_);
  return sequence_;
}

absl::Status TcpCommunicator::BrokenStatus() const {
  absl::MutexLock lock(&state_mu_);
  return broken_;
}

void TcpCommunicator::Abort(const absl::Status& reason) {
  {
    absl::MutexLock lock(&state_mu_);
    if (!broken_.ok()) return;
    broken_ =
        absl::AbortedError(absl::StrCat("rank ", spec_.rank, " aborted: ", reason.ToString()));
  }
  if (wake_write_.valid()) {
    const char byte = 1;
    // Left unread on purpose: the pipe stays readable, so any poll() sees it.
    (void)!write(wake_write_.get(), &byte, 1);
  }
  // If no collective is running, tell the peers now; otherwise the running one does when
  // it wakes up.
  if (op_mu_.TryLock()) {
    (void)FailLocked(absl::OkStatus());
    op_mu_.Unlock();
  }
}

absl::Status TcpCommunicator::FailLocked(const absl::Status& error) {
  absl::Status first;
  {
    absl::MutexLock lock(&state_mu_);
    if (broken_.ok() && !error.ok()) broken_ = error;
    first = broken_;
  }
  if (peers_told_) return first;
  peers_told_ = true;
  const std::string reason = first.ToString();
  const size_t text_bytes = std::min<size_t>(reason.size(), kMaxAbortText);
  for (int r = 0; r < spec_.world_size; ++r) {
    if (!peers_[r].valid()) continue;
    if (send_at_boundary_[r]) {
      FrameHeader h;
      h.op = FrameOp::kAbort;
      h.incarnation = spec_.group_incarnation;
      h.sequence = sequence_;
      h.payload_bytes = text_bytes;
      uint8_t header[FrameHeader::kSize];
      h.Encode(header);
      iovec iov[2] = {{header, sizeof(header)}, {const_cast<char*>(reason.data()), text_bytes}};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = 2;
      // One non-blocking attempt: a peer that does not read cannot be told anyway.
      (void)sendmsg(peers_[r].get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    // Not close(): the descriptors stay valid for the destructor, and the peers see EOF
    // after any abort frame.
    shutdown(peers_[r].get(), SHUT_RDWR);
  }
  return first;
}

absl::Status TcpCommunicator::Run(FrameOp op, uint8_t detail,
                                  const std::vector<Segment>& segments) {
  absl::MutexLock lock(&op_mu_);
  if (absl::Status broken = BrokenStatus(); !broken.ok()) {
    (void)FailLocked(broken);  // in case Abort() ran while a collective held op_mu_
    return broken;
  }
  ++sequence_;
  if (spec_.world_size == 1) return absl::OkStatus();
  absl::Status s = ExchangeLocked(op, detail, segments);
  if (!s.ok()) return FailLocked(s);
  return absl::OkStatus();
}

absl::Status TcpCommunicator::ExchangeLocked(FrameOp op, uint8_t detail,
                                             const std::vector<Segment>& segments) {
  const int n = spec_.world_size;
  const uint64_t seq = sequence_;
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + spec_.timeout;
  auto where = [&] { return absl::StrCat(FrameOpName(op), " #", seq, " on rank ", spec_.rank); };

  std::vector<PeerIo> io;
  io.reserve(n - 1);
  for (int r = 0; r < n; ++r) {
    if (r == spec_.rank) continue;
    PeerIo& p = io.emplace_back();
    p.rank = r;
    FrameHeader h;
    h.op = op;
    h.detail = detail;
    h.incarnation = spec_.group_incarnation;
    h.sequence = seq;
    h.payload_bytes = segments[r].send_bytes;
    h.Encode(p.header_out);
    p.payload_out = segments[r].send;
    p.payload_out_bytes = segments[r].send_bytes;
    p.payload_in = segments[r].recv;
    p.payload_in_bytes = segments[r].recv_bytes;
  }

  // Checks a complete incoming header against this rank's collective.
  auto check_header = [&](PeerIo& p) -> absl::Status {
    absl::StatusOr<FrameHeader> h = FrameHeader::Decode(p.header_in);
    if (!h.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("from rank ", p.rank, " in ", where(), ": ", h.status().message()));
    }
    if (h->incarnation != spec_.group_incarnation) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", p.rank, " is in group incarnation ", h->incarnation, ", rank ",
                       spec_.rank, " in ", spec_.group_incarnation, " (stale peer)"));
    }
    if (h->op == FrameOp::kAbort) {
      if (h->payload_bytes > kMaxAbortText) {
        return absl::FailedPreconditionError(
            absl::StrCat("rank ", p.rank, " sent an oversized abort frame"));
      }
      p.aborting = true;
      p.abort_text.assign(h->payload_bytes, '\0');
      p.payload_in = reinterpret_cast<uint8_t*>(p.abort_text.data());
      p.payload_in_bytes = h->payload_bytes;
      return absl::OkStatus();
    }
    if (h->op != op || h->sequence != seq || h->detail != detail) {
      return absl::FailedPreconditionError(
          absl::StrCat("collective mismatch: rank ", p.rank, " sent ", FrameOpName(h->op),
                       DetailText(h->op, h->detail), " #", h->sequence, " while rank ", spec_.rank,
                       " runs ", FrameOpName(op), DetailText(op, detail), " #", seq));
    }
    if (h->payload_bytes != p.payload_in_bytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("size mismatch in ", where(), ": rank ", p.rank, " sends ", h->payload_bytes,
                       " bytes, rank ", spec_.rank, " expects ", p.payload_in_bytes));
    }
    return absl::OkStatus();
  };
  auto lost = [&](const PeerIo& p, const std::string& what) {
    // The connection we noticed first may belong to a rank that only gave up because
    // another one died; list every connection already closed, so the log shows the
    // culprit too.
    std::vector<int> also;
    for (int r = 0; r < n; ++r) {
      if (r == p.rank || !peers_[r].valid()) continue;
      pollfd q{peers_[r].get(), POLLRDHUP, 0};
      if (poll(&q, 1, 0) > 0 && (q.revents & (POLLRDHUP | POLLHUP | POLLERR))) also.push_back(r);
    }
    return absl::UnavailableError(absl::StrCat(
        "rank ", p.rank, " ", what, " during ", where(),
        " (the process exited, crashed or lost the network)",
        also.empty() ? "" : "; connections also closed by rank(s) ", absl::StrJoin(also, ", ")));
  };

  // Moves as much as the socket takes; sets send_done at the end of the frame.
  auto do_send = [&](PeerIo& p) -> absl::Status {
    const int fd = peers_[p.rank].get();
    const size_t total = FrameHeader::kSize + p.payload_out_bytes;
    send_at_boundary_[p.rank] = false;
    while (p.sent < total) {
      iovec iov[2];
      int count = 0;
      if (p.sent < FrameHeader::kSize) {
        iov[count++] = {p.header_out + p.sent, FrameHeader::kSize - p.sent};
        if (p.payload_out_bytes > 0) {
          iov[count++] = {const_cast<uint8_t*>(p.payload_out), p.payload_out_bytes};
        }
      } else {
        const size_t off = p.sent - FrameHeader::kSize;
        iov[count++] = {const_cast<uint8_t*>(p.payload_out) + off, p.payload_out_bytes - off};
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = count;
      const ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        p.sent += static_cast<size_t>(w);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return absl::OkStatus();
      return lost(p, absl::StrCat("connection lost (", ErrnoText(errno), ")"));
    }
    p.send_done = true;
    send_at_boundary_[p.rank] = true;
    return absl::OkStatus();
  };

  // Reads as much of the frame as is there, never past its end (the next collective's
  // frame may follow on the stream).
  auto do_recv = [&](PeerIo& p) -> absl::Status {
    const int fd = peers_[p.rank].get();
    while (!p.recv_done) {
      uint8_t* dst;
      size_t want;
      const bool in_header = p.header_got < FrameHeader::kSize;
      if (in_header) {
        dst = p.header_in + p.header_got;
        want = FrameHeader::kSize - p.header_got;
      } else {
        dst = p.payload_in + p.got;
        want = p.payload_in_bytes - p.got;
      }
      ssize_t r = 0;
      if (want > 0) {
        r = recv(fd, dst, want, MSG_DONTWAIT);
        if (r == 0) return lost(p, "closed the connection");
        if (r < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
          return lost(p, absl::StrCat("connection lost (", ErrnoText(errno), ")"));
        }
      }
      if (in_header) {
        p.header_got += static_cast<size_t>(r);
        if (p.header_got == FrameHeader::kSize) {
          if (absl::Status s = check_header(p); !s.ok()) return s;
        } else {
          continue;
        }
      } else {
        p.got += static_cast<size_t>(r);
      }
      if (p.header_got == FrameHeader::kSize && p.got == p.payload_in_bytes) {
        if (p.aborting) {
          return absl::AbortedError(absl::StrCat("rank ", p.rank, " aborted the group (seen in ",
                                                 where(), "): ", p.abort_text));
        }
        p.recv_done = true;
      }
    }
    return absl::OkStatus();
  };

  std::vector<pollfd> fds;
  std::vector<PeerIo*> owners;
  while (true) {
    fds.clear();
    owners.clear();
    for (PeerIo& p : io) {
      short events = 0;
      if (!p.send_done) events |= POLLOUT;
      if (!p.recv_done) events |= POLLIN;
      if (events == 0) continue;
      fds.push_back({peers_[p.rank].get(), events, 0});
      owners.push_back(&p);
    }
    if (fds.empty()) return absl::OkStatus();
    fds.push_back({wake_read_.get(), POLLIN, 0});

    const int ready = poll(fds.data(), fds.size(), PollTimeoutMs(deadline));
    if (ready < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("poll: ", ErrnoText(errno)));
    }
    if (fds.back().revents != 0) {
      absl::Status broken = BrokenStatus();
      if (!broken.ok()) return broken;
    }
    if (ready == 0 && absl::Now() >= deadline) {
      std::vector<int> silent;
      std::vector<int> not_reading;
      for (const PeerIo& p : io) {
        if (!p.recv_done) silent.push_back(p.rank);
        if (!p.send_done) not_reading.push_back(p.rank);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          where(), " timed out after ", absl::FormatDuration(spec_.timeout),
          silent.empty() ? "" : "; still waiting for data from rank(s) ",
          absl::StrJoin(silent, ", "), not_reading.empty() ? "" : "; rank(s) not taking our data: ",
          absl::StrJoin(not_reading, ", "),
          " (a peer stopped, is stuck, or is not running this collective)"));
    }
    for (size_t i = 0; i + 1 < fds.size(); ++i) {
      const short revents = fds[i].revents;
      if (revents == 0) continue;
      PeerIo& p = *owners[i];
      // Receive first: an abort frame or EOF explains a failed send better than EPIPE.
      if (!p.recv_done && (revents & (POLLIN | POLLHUP | POLLERR))) {
        if (absl::Status s = do_recv(p); !s.ok()) return s;
      }
      if (!p.send_done && (revents & (POLLOUT | POLLHUP | POLLERR))) {
        if (absl::Status s = do_send(p); !s.ok()) return s;
      }
    }
  }
}

absl::Status TcpCommunicator::DoAllToAllV(const void* send, const std::vector<size_t>& send_bytes,
                                          void* recv, const std::vector<size_t>& recv_bytes,
                                          StreamHandle stream) {
  const int n = spec_.world_size;
  const int me = spec_.rank;
  if (send_bytes[me] != recv_bytes[me]) {
    absl::Status s = absl::InvalidArgumentError(
        absl::StrCat("AllToAllV on rank ", me, ": sends ", send_bytes[me],
                     " bytes to itself but expects ", recv_bytes[me]));
    Abort(s);
    return s;
  }
  std::vector<Segment> segments(n);
  size_t send_off = 0;
  size_t recv_off = 0;
  for (int r = 0; r < n; ++r) {
    segments[r].send = static_cast<const uint8_t*>(send) + send_off;
    segments[r].send_bytes = send_bytes[r];
    segments[r].recv = static_cast<uint8_t*>(recv) + recv_off;
    segments[r].recv_bytes = recv_bytes[r];
    send_off += send_bytes[r];
    recv_off += recv_bytes[r];
  }
  if (send_bytes[me] > 0) {
    std::memcpy(segments[me].recv, segments[me].send, send_bytes[me]);
  }
  return Run(FrameOp::kAllToAllV, 0, segments);
}

absl::StatusOr<std::vector<size_t>> TcpCommunicator::DoAllToAllSizes(
    const std::vector<size_t>& send_bytes) {
  const int n = spec_.world_size;
  std::vector<uint8_t> out(8 * n);
  std::vector<uint8_t> in(8 * n);
  std::vector<Segment> segments(n);
  for (int r = 0; r < n; ++r) {
    PutU64(&out[8 * r], send_bytes[r]);
    segments[r] = {&out[8 * r], 8, &in[8 * r], 8};
  }
  std::memcpy(&in[8 * spec_.rank], &out[8 * spec_.rank], 8);
  if (absl::Status s = Run(FrameOp::kAllToAllSizes, 0, segments); !s.ok()) return s;
  std::vector<size_t> recv_bytes(n);
  for (int r = 0; r < n; ++r) recv_bytes[r] = static_cast<size_t>(GetU64(&in[8 * r]));
  return recv_bytes;
}

absl::Status TcpCommunicator::DoAllGather(const void* send, size_t bytes_per_rank, void* recv,
                                          StreamHandle stream) {
  const int n = spec_.world_size;
  uint8_t* out = static_cast<uint8_t*>(recv);
  std::vector<Segment> segments(n);
  for (int r = 0; r < n; ++r) {
    segments[r] = {static_cast<const uint8_t*>(send), bytes_per_rank, out + r * bytes_per_rank,
                   bytes_per_rank};
  }
  if (bytes_per_rank > 0) {
    // memmove: in place (send is our own slot of recv) is allowed.
    std::memmove(out + spec_.rank * bytes_per_rank, send, bytes_per_rank);
  }
  return Run(FrameOp::kAllGather, 0, segments);
}

absl::Status TcpCommunicator::DoAllReduce(const void* send, void* recv, size_t count, DataType type,
                                          ReduceOp op, StreamHandle stream) {
  // Every rank gathers every contribution and reduces them in rank order, so that float
  // sums are identical everywhere. Traffic is world_size * bytes per rank, which is fine
  // for the small vectors the engine reduces (step metadata, not activations).
  const int n = spec_.world_size;
  const size_t bytes = count * DataTypeSize(type);
  std::vector<uint8_t> gathered(bytes * n);
  std::vector<Segment> segments(n);
  for (int r = 0; r < n; ++r) {
    segments[r] = {static_cast<const uint8_t*>(send), bytes, gathered.data() + r * bytes, bytes};
  }
  if (bytes > 0) std::memcpy(gathered.data() + spec_.rank * bytes, send, bytes);
  if (absl::Status s = Run(FrameOp::kAllReduce, ReduceDetail(type, op), segments); !s.ok()) {
    return s;
  }
  if (bytes == 0) return absl::OkStatus();
  for (int r = 1; r < n; ++r)
    ReduceInto(gathered.data(), gathered.data() + r * bytes, count, type, op);
  std::memcpy(recv, gathered.data(), bytes);
  return absl::OkStatus();
}

absl::Status TcpCommunicator::DoBarrier(StreamHandle stream) {
  return Run(FrameOp::kBarrier, 0, std::vector<Segment>(spec_.world_size));
}

}  // namespace deepinfer::comm
