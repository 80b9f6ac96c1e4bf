// ExchangeMeter: a Communicator that forwards every call to another one and measures the
// expert all-to-all that passes through it, for `deepinfer-bench --ranks N`. The expert-parallel
// dispatcher (EpExpertDispatcher) is given the meter instead of the rank's communicator, so the
// meter sees exactly the dispatcher's exchanges: per MoE layer the size exchange
// (AllToAllSizes) and the rows (AllToAllV: one on a host communicator, two on NCCL) of Dispatch,
// and the rows of Combine (AllToAllV).
//
// Always counted (host arithmetic, no device work): calls, and the bytes this rank sends to
// other ranks (its own segment stays on the rank). Timed only with set_timing(true): the backend
// is synchronised before and after each exchange call and the wall time between the two
// synchronisations is added up. On a device communicator (NCCL) AllToAllV only enqueues on the
// stream, so untimed wall clocks would measure nothing useful; the synchronisation makes the
// time the transfer's, at the cost of the overlap a real step could have, which is why the
// benchmark reports step times measured without it too. On a host communicator (TCP) every
// call blocks anyway. The time includes waiting for the slowest peer to reach the exchange
// (load imbalance between ranks shows up here).
//
// Not thread-safe, like the communicator it wraps: one thread at a time calls the collectives (the
// rank's model thread, or with two micro-batches its exchange thread, which the model waits for
// before its step returns) and the model thread reads the counters between steps; Abort() may
// come from any thread.
#ifndef DEEPINFER_TOOLS_BENCH_EXCHANGE_METER_H_
#define DEEPINFER_TOOLS_BENCH_EXCHANGE_METER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/backend/backend.h"
#include "worker/comm/communicator.h"

namespace deepinfer {

struct ExchangeCounts {
  int64_t calls = 0;          // AllToAllSizes + AllToAllV calls
  double bytes_to_peers = 0;  // AllToAllV payload sent to other ranks
  double seconds = 0;         // inside exchange calls, synchronised (timing on only)
};

class ExchangeMeter final : public comm::Communicator {
 public:
  // `inner` and `backend` (the rank's, whose stream the exchange runs on) must outlive it.
  ExchangeMeter(comm::Communicator* inner, Backend* backend);

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  comm::MemoryKind memory_kind() const override { return inner_->memory_kind(); }
  void Abort(const absl::Status& reason) override { inner_->Abort(reason); }
  // The device exchange (EpDeviceDispatcher) moves rows through these windows without calling
  // the communicator, so the meter counts and times none of its traffic.
  absl::StatusOr<comm::SymmetricWindow> RegisterSymmetricWindow(size_t bytes) override {
    return inner_->RegisterSymmetricWindow(bytes);
  }

  void set_timing(bool on) { timing_ = on; }
  // What was counted since the last call, then zero.
  ExchangeCounts Take();

 private:
  absl::Status DoAllToAllV(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                           const std::vector<size_t>& recv_bytes,
                           comm::StreamHandle stream) override;
  absl::StatusOr<std::vector<size_t>> DoAllToAllSizes(
      const std::vector<size_t>& send_bytes) override;
  absl::Status DoAllGather(const void* send, size_t bytes_per_rank, void* recv,
                           comm::StreamHandle stream) override;
  absl::Status DoAllReduce(const void* send, void* recv, size_t count, comm::DataType type,
                           comm::ReduceOp op, comm::StreamHandle stream) override;
  absl::Status DoBarrier(comm::StreamHandle stream) override;

  // Runs `call` (an exchange), counted and, with timing on, between two synchronisations.
  template <typename Call>
  auto Measure(Call call) -> decltype(call());

  comm::Communicator* const inner_;
  Backend* const backend_;
  bool timing_ = false;
  ExchangeCounts counts_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_TOOLS_BENCH_EXCHANGE_METER_H_
