// Communicator: the data-plane collectives that expert parallelism needs (dispatch and
// combine all-to-all with variable sizes, an all-gather of per-step metadata, all-reduce,
// barrier), as one device-neutral interface.
//
// Implementations: TcpCommunicator (host memory, TCP between processes; CI, laptops, and
// the one-rank case) and NcclCommunicator (device memory, enqueued on a CUDA stream).
// docs/communicator.md describes the semantics and how NCCL maps onto them.
//
// Rules every implementation keeps:
//  * All ranks of the group call the same collectives in the same order; a rank with no
//    data still takes part (zero sizes, null buffers are fine when the size is 0).
//  * Errors are absl::Status. A dead peer gives UNAVAILABLE, a peer that gave up ABORTED,
//    a peer that does not show up in time DEADLINE_EXCEEDED, a collective that does not
//    match the other ranks' (other operation, other sizes, other group incarnation)
//    FAILED_PRECONDITION; the message names the peer rank. Nothing blocks forever: each
//    blocking operation has a deadline.
//  * Any error breaks the communicator for good (like an aborted NCCL communicator): later
//    calls return the first error at once, and the peers are told so that they fail fast
//    instead of waiting out their timeout. Recovery is a new group with a new incarnation.
//  * One thread at a time calls the collectives (they are ordered); Abort() may be called
//    from any thread.
#ifndef DEEPINFER_WORKER_COMM_COMMUNICATOR_H_
#define DEEPINFER_WORKER_COMM_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace deepinfer::comm {

// Where the buffers passed to a communicator live.
enum class MemoryKind { kHost, kDevice };

// cudaStream_t for device communicators; must be null for host ones, which complete
// every call before returning.
using StreamHandle = void*;

enum class ReduceOp { kSum, kMax };

// Device memory every rank of a group can load from and store to directly (over NVLink): the
// same size on every rank. peers[r] is rank r's buffer as this rank addresses it; peers[rank()]
// is this rank's own. The communicator owns the memory; it lives as long as the communicator.
struct SymmetricWindow {
  void* local = nullptr;
  size_t bytes = 0;
  std::vector<void*> peers;
};
enum class DataType { kFloat32, kInt64 };

size_t DataTypeSize(DataType type);
const char* ReduceOpName(ReduceOp op);
const char* DataTypeName(DataType type);

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual MemoryKind memory_kind() const = 0;

  // Variable all-to-all. `send` holds world_size() consecutive segments, segment r
  // (send_bytes_per_rank[r] bytes) going to rank r; `recv` receives world_size()
  // consecutive segments, segment r (recv_bytes_per_rank[r] bytes) from rank r. The sizes
  // must agree pairwise (my send_bytes[r] == rank r's recv_bytes[me]); exchange them first
  // with AllToAllSizes when the receiver does not know them. `send` and `recv` must not
  // overlap. Returns when done (host) or once enqueued on `stream` (device).
  absl::Status AllToAllV(const void* send, const std::vector<size_t>& send_bytes_per_rank,
                         void* recv, const std::vector<size_t>& recv_bytes_per_rank,
                         StreamHandle stream = nullptr);

  // The size exchange before an AllToAllV: returns recv_bytes_per_rank given
  // send_bytes_per_rank. Host vectors in and out, and blocking on every implementation
  // (a device one synchronises its stream), because the host must size the receive
  // buffer.
  absl::StatusOr<std::vector<size_t>> AllToAllSizes(const std::vector<size_t>& send_bytes_per_rank);

  // `recv` (world_size() * bytes_per_rank bytes) gets every rank's `send`, in rank order.
  // In place is allowed: send == recv + rank() * bytes_per_rank.
  absl::Status AllGather(const void* send, size_t bytes_per_rank, void* recv,
                         StreamHandle stream = nullptr);

  // Element-wise reduction of `count` elements over all ranks; every rank gets the same
  // result, bit for bit (the order in which floats are summed is the implementation's:
  // rank order for TCP, NCCL's ring or tree order on GPUs). send == recv is allowed.
  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                         StreamHandle stream = nullptr);
  absl::Status AllReduce(const float* send, float* recv, size_t count, ReduceOp op,
                         StreamHandle stream = nullptr) {
    return AllReduce(send, recv, count, DataType::kFloat32, op, stream);
  }
  absl::Status AllReduce(const int64_t* send, int64_t* recv, size_t count, ReduceOp op,
                         StreamHandle stream = nullptr) {
    return AllReduce(send, recv, count, DataType::kInt64, op, stream);
  }

  // Returns once every rank has entered the barrier.
  absl::Status Barrier(StreamHandle stream = nullptr);

  // Breaks the communicator: a collective in flight on another thread and every later
  // one fail with ABORTED carrying `reason`, and the peers are told (best effort). For a
  // rank that must leave the group (shutdown, a local error) without the others waiting
  // out their timeout. Idempotent; the first reason wins.
  virtual void Abort(const absl::Status& reason) = 0;

  // Collective (every rank, the same size, in the same order): allocates a symmetric window of
  // `bytes` (zeroed) on every rank and maps the peers' into this rank. UNIMPLEMENTED where
  // the ranks cannot address each other's memory (host communicators, ranks across hosts):
  // callers then use the collectives above.
  virtual absl::StatusOr<SymmetricWindow> RegisterSymmetricWindow(size_t bytes) {
    return absl::UnimplementedError("this communicator has no symmetric device windows");
  }

 protected:
  Communicator() = default;

  // The public methods check their arguments (a bad call aborts the group, so that the
  // peers do not wait for a rank that will never take part) and then call these.
  virtual absl::Status DoAllToAllV(const void* send, const std::vector<size_t>& send_bytes,
                                   void* recv, const std::vector<size_t>& recv_bytes,
                                   StreamHandle stream) = 0;
  virtual absl::StatusOr<std::vector<size_t>> DoAllToAllSizes(
      const std::vector<size_t>& send_bytes) = 0;
  virtual absl::Status DoAllGather(const void* send, size_t bytes_per_rank, void* recv,
                                   StreamHandle stream) = 0;
  virtual absl::Status DoAllReduce(const void* send, void* recv, size_t count, DataType type,
                                   ReduceOp op, StreamHandle stream) = 0;
  virtual absl::Status DoBarrier(StreamHandle stream) = 0;

 private:
  // Aborts the group with `error` (INVALID_ARGUMENT, naming `what`) and returns it.
  absl::Status RejectCall(const char* what, absl::Status error);
  absl::Status CheckStream(const char* what, StreamHandle stream);
};

// Reduces `src` into `dst` element-wise (dst = dst op src); the host-side kernel shared by
// host implementations.
void ReduceInto(void* dst, const void* src, size_t count, DataType type, ReduceOp op);

}  // namespace deepinfer::comm

#endif  // DEEPINFER_WORKER_COMM_COMMUNICATOR_H_
