// ExchangeMeter implementation.
#include "tools/bench/exchange_meter.h"

#include <chrono>
#include <utility>

namespace deepinfer {

ExchangeMeter::ExchangeMeter(comm::Communicator* inner, Backend* backend)
    : inner_(inner), backend_(backend) {}

ExchangeCounts ExchangeMeter::Take() { return std::exchange(counts_, ExchangeCounts{}); }

template <typename Call>
auto ExchangeMeter::Measure(Call call) -> decltype(call()) {
  ++counts_.calls;
  if (!timing_) return call();
  backend_->Synchronize();
  const auto start = std::chrono::steady_clock::now();
  auto result = call();
  backend_->Synchronize();
  counts_.seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

absl::Status ExchangeMeter::DoAllToAllV(const void* send, const std::vector<size_t>& send_bytes,
                                        void* recv, const std::vector<size_t>& recv_bytes,
                                        comm::StreamHandle stream) {
  for (size_t r = 0; r < send_bytes.size(); ++r) {
    if (static_cast<int>(r) != rank()) counts_.bytes_to_peers += static_cast<double>(send_bytes[r]);
  }
  return Measure([&] { return inner_->AllToAllV(send, send_bytes, recv, recv_bytes, stream); });
}

absl::StatusOr<std::vector<size_t>> ExchangeMeter::DoAllToAllSizes(
    const std::vector<size_t>& send_bytes) {
  return Measure([&] { return inner_->AllToAllSizes(send_bytes); });
}

absl::Status ExchangeMeter::DoAllGather(const void* send, size_t bytes_per_rank, void* recv,
                                        comm::StreamHandle stream) {
  return inner_->AllGather(send, bytes_per_rank, recv, stream);
}

absl::Status ExchangeMeter::DoAllReduce(const void* send, void* recv, size_t count,
                                        comm::DataType type, comm::ReduceOp op,
                                        comm::StreamHandle stream) {
  return inner_->AllReduce(send, recv, count, type, op, stream);
}

absl::Status ExchangeMeter::DoBarrier(comm::StreamHandle stream) { return inner_->Barrier(stream); }

}  // namespace deepinfer
