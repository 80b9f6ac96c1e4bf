// NcclCommunicator: the device-memory Communicator, on NCCL. Buffers are device pointers of
// the rank's GPU and collectives are enqueued on a CUDA stream (the caller's, or the default
// stream given in the spec); AllToAllSizes and Barrier also wait for the stream, with a
// deadline. docs/communicator.md ("NCCL") says how each collective maps onto NCCL.
//
// Forming a group: every rank is given the same NCCL unique id (NewUniqueId() on rank 0,
// handed to the others over an existing channel: ShareFromRankZero in data_plane.h sends it
// over the TCP group), its rank, the world size and its GPU. The communicator is created
// non-blocking (ncclConfig_t::blocking = 0), so init and every enqueue can be timed out.
//
// Nothing blocks forever: a watchdog thread polls ncclCommGetAsyncError and the completion of
// the last enqueued collective (a CUDA event); when NCCL reports an error, or the collective
// has not completed within spec.timeout, it aborts the communicator (ncclCommAbort, which
// also ends kernels stuck waiting for a peer) and stores the error. The first error sticks,
// as the interface requires. NCCL checks nothing on the wire, so unlike TcpCommunicator a
// rank running another collective or other sizes is not diagnosed: it hangs until the
// timeout (DEADLINE_EXCEEDED) or corrupts data. NCCL cannot say which peer is missing, so
// errors name this rank, the collective and its sequence number instead of a peer.
//
// NVLink multicast (NVLS) is forced off (NCCL_NVLS_ENABLE=0, set in the environment before
// NCCL's first use) because it must stay off on our GPU machines.
#ifndef DEEPINFER_WORKER_COMM_NCCL_COMMUNICATOR_H_
#define DEEPINFER_WORKER_COMM_NCCL_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"

struct ncclComm;           // nccl.h: typedef struct ncclComm* ncclComm_t
struct ncclWindow_vidmem;  // nccl.h: typedef struct ncclWindow_vidmem* ncclWindow_t

namespace deepinfer::comm {

struct NcclCommunicatorSpec {
  int rank = 0;
  int world_size = 1;
  // NcclCommunicator::NewUniqueId() of rank 0, the same bytes on every rank.
  std::string unique_id;
  // CUDA device ordinal of this rank (one rank per GPU: NCCL refuses two ranks of one group
  // on the same GPU).
  int device = 0;
  // cudaStream_t used by calls that pass no stream (and by AllToAllSizes, which takes none).
  // Null: the communicator creates its own. Pass the backend's stream so that every
  // collective is ordered with the model's kernels. Must outlive the communicator.
  StreamHandle default_stream = nullptr;
  // Bound on forming the group and on each collective's completion.
  absl::Duration timeout = absl::Seconds(60);
};

class NcclCommunicator final : public Communicator {
 public:
  // A fresh NCCL unique id (ncclGetUniqueId: NCCL_UNIQUE_ID_BYTES bytes), on rank 0.
  static absl::StatusOr<std::string> NewUniqueId();
  static size_t UniqueIdBytes();

  // Joins the group; returns once all ranks have joined. INVALID_ARGUMENT for a bad spec,
  // FAILED_PRECONDITION when the GPU does not exist, DEADLINE_EXCEEDED when the group is not
  // complete within spec.timeout, INTERNAL for other CUDA / NCCL errors.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(const NcclCommunicatorSpec& spec);
  ~NcclCommunicator() override;

  int rank() const override { return spec_.rank; }
  int world_size() const override { return spec_.world_size; }
  MemoryKind memory_kind() const override { return MemoryKind::kDevice; }
  void Abort(const absl::Status& reason) override;
  // ncclMemAlloc + ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC) and the window's LSA
  // (NVLink) pointer of every rank (nccl_device.h, resolved once by a kernel), checked before
  // use: the handle must be device memory (NCCL gives a host or null one where the communicator
  // has no symmetric memory; no kernel reads it then) and every rank reads each rank's check
  // word through the pointers. UNIMPLEMENTED, on every rank alike and with the communicator
  // usable for collectives, when the NCCL library predates the device API, the group is not
  // one LSA team (ranks on several hosts), NCCL gives any rank no device window, or a check
  // fails; the error of the NCCL call when registering fails (the communicator is then broken).
  absl::StatusOr<SymmetricWindow> RegisterSymmetricWindow(size_t bytes) override;

  int device() const { return spec_.device; }
  // Collectives enqueued so far.
  uint64_t collectives_run() const;

 private:
  explicit NcclCommunicator(const NcclCommunicatorSpec& spec);

  absl::Status DoAllToAllV(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                           const std::vector<size_t>& recv_bytes, StreamHandle stream) override;
  absl::StatusOr<std::vector<size_t>> DoAllToAllSizes(
      const std::vector<size_t>& send_bytes) override;
  absl::Status DoAllGather(const void* send, size_t bytes_per_rank, void* recv,
                           StreamHandle stream) override;
  absl::Status DoAllReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                           StreamHandle stream) override;
  absl::Status DoBarrier(StreamHandle stream) override;

  // Forming (Create).
  absl::Status Init();
  // RegisterSymmetricWindow's checks of a registered window (collective): the handle, the
  // peers' pointers into *peers, the check words after the first `bytes` of each window.
  absl::Status CheckWindow(const std::string& what, ncclWindow_vidmem* window, void* memory,
                           size_t bytes, std::vector<void*>* peers);
  // Collective: OK when every rank's `code` is kWindowOk, else UNIMPLEMENTED with this rank's
  // `detail` or the first failing rank's reason.
  absl::Status AgreeOnWindow(const std::string& what, size_t code, const std::string& detail);
  // Numbers a collective and enqueues it: `issue` makes the NCCL calls (inside one
  // ncclGroupStart/End) on `stream`; then records the completion event the watchdog watches.
  // On failure breaks the communicator. `what` names the collective in errors.
  // `issue(ncclComm*, cudaStream_t, const std::string& name)` returns an absl::Status.
  template <typename Issue>
  absl::Status Enqueue(const char* what, void* stream, Issue issue);
  // Waits (polling, with the deadline) until `stream` has done everything enqueued so far.
  absl::Status WaitStream(const std::string& what, void* stream);
  // Polls ncclCommGetAsyncError until the comm's state leaves ncclInProgress (a non-blocking
  // communicator's init or group end). Requires op_mu_.
  absl::Status AwaitNotInProgressLocked(const std::string& what, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  void* StreamOrDefault(StreamHandle stream) const;
  // Records `error` as the first error (unless one is already there) and aborts the NCCL
  // communicator; returns the first error.
  absl::Status Fail(const absl::Status& error);
  absl::Status BrokenStatus() const;
  void Watchdog();

  const NcclCommunicatorSpec spec_;
  void* own_stream_ = nullptr;       // cudaStream_t we created (null if the spec gave one)
  void* default_stream_ = nullptr;   // spec's or own
  void* done_event_ = nullptr;       // cudaEvent_t after the last enqueued collective
  int64_t* sizes_device_ = nullptr;  // [2 * world]: AllToAllSizes send then receive
  int64_t* sizes_host_ = nullptr;    // pinned, the same layout
  int32_t* barrier_device_ = nullptr;
  // Registered symmetric windows (ncclWindow_t, the ncclMemAlloc memory), released before the
  // communicator is destroyed.
  std::vector<std::pair<void*, void*>> windows_ ABSL_GUARDED_BY(op_mu_);

  // Serialises enqueues and guards the NCCL handle (Abort frees it).
  mutable absl::Mutex op_mu_;
  ncclComm* comm_ ABSL_GUARDED_BY(op_mu_) = nullptr;
  uint64_t sequence_ ABSL_GUARDED_BY(op_mu_) = 0;
  // What the watchdog watches: the last enqueued collective, since when.
  std::string pending_what_ ABSL_GUARDED_BY(op_mu_);
  absl::Time pending_since_ ABSL_GUARDED_BY(op_mu_) = absl::InfinitePast();
  bool pending_ ABSL_GUARDED_BY(op_mu_) = false;

  // The first error; separate from op_mu_ so that a waiting thread and Abort() can read and
  // set it while an enqueue holds op_mu_.
  mutable absl::Mutex state_mu_;
  absl::Status broken_ ABSL_GUARDED_BY(state_mu_);
  bool stop_watchdog_ ABSL_GUARDED_BY(state_mu_) = false;
  std::thread watchdog_;
};

}  // namespace deepinfer::comm

#endif  // DEEPINFER_WORKER_COMM_NCCL_COMMUNICATOR_H_
