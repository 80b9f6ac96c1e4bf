// TcpCommunicator: the host-memory Communicator, over a full mesh of TCP connections
// between the ranks' processes (or threads, in tests). The CPU stand-in for NCCL, so that
// multi-process expert parallelism runs on machines without GPUs.
//
// Forming a group mirrors NCCL's ncclGetUniqueId + ncclCommInitRank: every rank is given
// the same root address (rank 0's rendezvous socket: the group's "unique id"), the group
// incarnation, its rank and the world size. Rank 0 collects every rank's listening address
// and hands out the table; then each rank connects to the lower ranks. Every connection
// opens with a Hello checked against the group (incarnation, world size, rank), and every
// data frame carries the incarnation, the collective and its sequence number, so that a
// stale process or a rank running a different collective is reported instead of being
// read as data. Protocol: docs/communicator.md.
//
// world_size == 1 opens no sockets at all: every collective is a local copy.
#ifndef DEEPINFER_WORKER_COMM_TCP_COMMUNICATOR_H_
#define DEEPINFER_WORKER_COMM_TCP_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/tcp_frame.h"
#include "worker/comm/tcp_socket.h"

namespace deepinfer::comm {

// What a rank needs to join its group; the coordinator will hand this out.
struct TcpCommunicatorSpec {
  int rank = 0;
  int world_size = 1;
  // "host:port" of rank 0's rendezvous socket. Rank 0 listens there (unless it is given a
  // listener bound beforehand, see TcpCommunicator::ListenRoot); the others connect to
  // it. Unused when world_size == 1.
  std::string root_address;
  // Identifies this instance of the group; non-zero. A process from an earlier group (a
  // rank that was restarted, a group re-formed after a failure) is refused.
  uint64_t group_incarnation = 0;
  // Where ranks other than 0 accept their peers' connections (a free port is picked).
  // 127.0.0.1 by default; 0.0.0.0 listens everywhere and advertises the address this
  // rank reaches rank 0 from.
  std::string listen_host = "127.0.0.1";
  // Bound on every blocking step: forming the group, and each collective.
  absl::Duration timeout = absl::Seconds(60);
};

class TcpCommunicator final : public Communicator {
 public:
  // Rank 0's rendezvous socket bound ahead of Create, e.g. on port 0, so that its real
  // address can be given to the other ranks first.
  struct RootListener {
    ScopedFd fd;
    std::string address;  // "host:port" with the bound port
  };
  static absl::StatusOr<RootListener> ListenRoot(const std::string& address);

  // Joins the group; returns once all world_size ranks are connected to each other.
  // INVALID_ARGUMENT for a bad spec; FAILED_PRECONDITION when rank 0 or a peer refuses
  // this rank (other incarnation or world size, rank taken); DEADLINE_EXCEEDED when the
  // group is not complete within spec.timeout (naming the missing ranks on rank 0);
  // UNAVAILABLE when a peer cannot be reached or drops out. `root` is only for rank 0.
  static absl::StatusOr<std::unique_ptr<TcpCommunicator>> Create(
      const TcpCommunicatorSpec& spec, std::unique_ptr<RootListener> root = nullptr);

  ~TcpCommunicator() override;

  int rank() const override { return spec_.rank; }
  int world_size() const override { return spec_.world_size; }
  MemoryKind memory_kind() const override { return MemoryKind::kHost; }
  void Abort(const absl::Status& reason) override;

  // Number of collectives run so far (the sequence number of the last one).
  uint64_t collectives_run() const;

 private:
  explicit TcpCommunicator(const TcpCommunicatorSpec& spec);

  absl::Status DoAllToAllV(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                           const std::vector<size_t>& recv_bytes, StreamHandle stream) override;
  absl::StatusOr<std::vector<size_t>> DoAllToAllSizes(
      const std::vector<size_t>& send_bytes) override;
  absl::Status DoAllGather(const void* send, size_t bytes_per_rank, void* recv,
                           StreamHandle stream) override;
  absl::Status DoAllReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                           StreamHandle stream) override;
  absl::Status DoBarrier(StreamHandle stream) override;

  // What one collective sends to and expects from each rank (the own rank's entry is
  // ignored: callers copy that part locally).
  struct Segment {
    const uint8_t* send = nullptr;
    size_t send_bytes = 0;
    uint8_t* recv = nullptr;
    size_t recv_bytes = 0;
  };
  // Runs one collective: checks the communicator is healthy, numbers the collective, and
  // sends and receives every segment concurrently; on failure breaks the communicator.
  absl::Status Run(FrameOp op, uint8_t detail, const std::vector<Segment>& segments);
  absl::Status ExchangeLocked(FrameOp op, uint8_t detail, const std::vector<Segment>& segments)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  // Records the first error, tells the peers (an abort frame where our side of the stream
  // is between frames) and shuts the connections down. Returns the first error.
  absl::Status FailLocked(const absl::Status& error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  absl::Status BrokenStatus() const;

  // Rendezvous steps (Create).
  absl::Status FormGroupAsRoot(ScopedFd listener, absl::Time deadline);
  absl::Status FormGroupAsMember(absl::Time deadline);
  // Reads one connecting rank's Hello and answers a refusal itself (returning the
  // reason as FAILED_PRECONDITION); on OK the caller still owes the reply.
  absl::StatusOr<Hello> ReadAndCheckHello(int fd, int min_rank, absl::Time deadline) const;

  const TcpCommunicatorSpec spec_;
  // Connection to each rank, indexed by rank; empty for our own rank.
  std::vector<ScopedFd> peers_;
  // Abort() wakes a collective blocked in poll() through this pipe.
  ScopedFd wake_read_;
  ScopedFd wake_write_;

  // Serialises collectives (they are ordered by sequence number) and guards the streams.
  mutable absl::Mutex op_mu_;
  uint64_t sequence_ ABSL_GUARDED_BY(op_mu_) = 0;
  // Per rank: whether our outgoing stream is between frames, so an abort frame would be
  // read as one.
  std::vector<bool> send_at_boundary_ ABSL_GUARDED_BY(op_mu_);
  bool peers_told_ ABSL_GUARDED_BY(op_mu_) = false;

  // The first error; the communicator is unusable once set. Separate from op_mu_ so that
  // Abort() can set it while a collective is running.
  mutable absl::Mutex state_mu_;
  absl::Status broken_ ABSL_GUARDED_BY(state_mu_);
};

}  // namespace deepinfer::comm

#endif  // DEEPINFER_WORKER_COMM_TCP_COMMUNICATOR_H_
