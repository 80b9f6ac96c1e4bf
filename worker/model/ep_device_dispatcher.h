// EpDeviceDispatcher: expert parallelism with the exchange on the device (kernels/moe/
// ep_exchange.h). Rows go straight into the peers' symmetric windows over NVLink (registered once
// per group, Communicator::RegisterSymmetricWindow) and each receiver waits for device signals:
// no size exchange, no collective call and no host staging per layer. Experts are placed as
// with EpExpertDispatcher (contiguous ranges, or EPLB slots with replicas chosen by
// ChooseReplica on the device), and the combine adds each token's choices in ascending expert
// id with the arithmetic of ScatterAddRows, so the logits are bit-identical to
// EpExpertDispatcher's and to one rank hosting every expert (docs/communicator.md, "Device
// exchange").
//
// Two ways to use it:
//  * Dispatch / Combine (the ExpertDispatcher interface): the grouped rows' offsets are copied
//    to the host once per layer for the grouped GEMM (one stream synchronisation, no exchange);
//  * RoutedExpertsOnDevice: dispatch, the local experts (MoeBlock: Backend::RoutedExperts) on
//    every row the window can hold (rows past the received count are padding that no expert
//    takes) and combine, all enqueued with nothing read back: a decode step can be captured in
//    a CUDA graph.
// The exchange's error word (capacity overflow, a peer that did not signal in time, a bad
// expert id) is read at the next synchronisation (Dispatch, CheckErrors); an error aborts the
// communicator so the peers fail too.
// Every rank must use the same mode and sizes: Create takes them from options every rank has.
// Not thread-safe: the model's engine thread calls it.
#ifndef DEEPINFER_WORKER_MODEL_EP_DEVICE_DISPATCHER_H_
#define DEEPINFER_WORKER_MODEL_EP_DEVICE_DISPATCHER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/moe/ep_exchange.h"
#include "worker/backend/backend.h"
#include "worker/comm/communicator.h"
#include "worker/model/expert_dispatcher.h"

namespace deepinfer {

struct EpDeviceOptions {
  // Tokens one rank sends in one layer, at most (the engine's step budget, or the largest decode
  // graph bucket if larger): Dispatch refuses more.
  int32_t max_tokens = 0;
  int32_t top_k = 0;
  kernels::EpMode mode = kernels::EpMode::kLowLatency;
  // Rows a receiver takes: per source (low latency) / in all (throughput); 0: the worst case
  // (max_tokens * top_k per source), which never overflows.
  int32_t ll_capacity = 0;
  int32_t tp_capacity = 0;
};

class EpDeviceDispatcher : public ExpertDispatcher {
 public:
  // Collective (registers the window on every rank). UNIMPLEMENTED when the communicator has no
  // symmetric windows (the caller falls back to EpExpertDispatcher); INVALID_ARGUMENT for sizes
  // outside kernels::EpConfigValid, experts that do not divide over the ranks, or a backend
  // without a stream.
  static absl::StatusOr<std::unique_ptr<EpDeviceDispatcher>> Create(
      comm::Communicator* comm, Backend* backend, int64_t num_experts, int64_t hidden_size,
      const EpDeviceOptions& options, std::shared_ptr<const ExpertPlacement> placement = nullptr);

  const std::vector<int64_t>& local_experts(int64_t moe_layer) const override;
  absl::Status Dispatch(int64_t moe_layer, int64_t num_tokens, int64_t top_k, const float* hidden,
                        const int32_t* topk_ids, const float* topk_weights,
                        DispatchedTokens* out) override;
  absl::Status Combine(const DispatchedTokens& dispatched, const float* expert_out,
                       float* out) override;
  absl::Status SetPlacement(std::shared_ptr<const ExpertPlacement> placement) override;

  int64_t device_exchange_slots() const override { return cfg_.slots_per_rank; }
  // See ExpertDispatcher. If `experts` cannot run, the exchange is finished with zero outputs
  // (the peers are not left waiting) and the error aborts the communicator.
  absl::Status RoutedExpertsOnDevice(int64_t moe_layer, int64_t num_tokens, const float* hidden,
                                     const int32_t* topk_ids, const float* topk_weights, float* out,
                                     const DeviceExperts& experts) override;

  // Reads the error word (synchronises the stream): OK, or the exchange's error (and the
  // communicator is aborted).
  absl::Status CheckErrors();
  // "device exchange (low latency, NVLink windows, N MiB)": what the worker logs and reports.
  std::string Describe() const;
  std::string exchange_name() const override { return Describe(); }
  const kernels::EpExchangeConfig& config() const { return cfg_; }

 private:
  EpDeviceDispatcher(comm::Communicator* comm, Backend* backend, int64_t num_experts,
                     int64_t hidden_size, const EpDeviceOptions& options);
  absl::Status Fail(absl::Status error);
  // Phases 1-3 of the exchange for `num_tokens` tokens (slots chosen first with a placement).
  absl::Status DispatchOnDevice(int64_t moe_layer, int64_t num_tokens, const float* hidden,
                                const int32_t* topk_ids);
  // Phases 4-5 into `out` (zeroed first: Combine adds into out).
  absl::Status CombineOnDevice(const float* expert_out, float* out, bool zero_out);

  comm::Communicator* const comm_;
  Backend* const backend_;
  const int64_t num_experts_;
  const int64_t hidden_size_;
  const EpDeviceOptions options_;
  kernels::EpExchangeConfig cfg_;
  kernels::EpLayout layout_;
  comm::SymmetricWindow window_;
  std::unique_ptr<DeviceBuffer> scratch_;
  kernels::EpRankView view_;
  std::vector<int64_t> contiguous_experts_;
  std::shared_ptr<const ExpertPlacement> placement_;
  std::vector<std::vector<int64_t>> placed_experts_;
  // With a placement, per MoE layer: replica_start [E + 1] then replicas (device).
  std::vector<std::unique_ptr<DeviceBuffer>> replica_tables_;
  // Without one, when the window has more slots per rank than E / W: the same table form.
  std::unique_ptr<DeviceBuffer> contiguous_table_;
  std::unique_ptr<DeviceBuffer> topk_slots_;  // [max_tokens * top_k]
  // Per slot row of the window: its local slot, or -1 past the received rows (device).
  std::unique_ptr<DeviceBuffer> row_slot_;
  std::unique_ptr<DeviceBuffer> expert_out_;  // [max received rows, hidden]
  // The exchange in flight, between Dispatch and Combine.
  int64_t tokens_ = -1;
  const int32_t* topk_ids_ = nullptr;
  const float* topk_weights_ = nullptr;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_EP_DEVICE_DISPATCHER_H_
