// EpExpertDispatcher: the expert-parallel ExpertDispatcher. Without a placement the routed
// experts are split over the ranks of a communicator group in contiguous ranges (rank r hosts
// experts [r*E/W, (r+1)*E/W)); with an EPLB placement (SetPlacement) each MoE layer has P
// physical slots, P/W per rank in order, and slot p hosts logical expert phy2log[layer][p], so
// a rank may host replicas of hot experts. Dispatch sends the hidden row of every
// (token, choice) to the rank hosting the chosen replica (ChooseReplica: a function of the
// token's row, this rank and the expert) and groups what arrives by local slot; Combine sends
// the expert outputs back to the token's rank and adds each token's weighted contributions in
// ascending expert id, the order LocalExpertDispatcher uses, so a group of ranks computes
// bit-identical logits to one rank that hosts every expert, with or without replicas
// (docs/model.md, "Expert parallelism"; docs/eplb.md).
//
// Collectives per MoE layer, on every rank, also on a rank without tokens (zero-size segments):
//   Dispatch: AllToAllSizes (bytes per destination), AllToAllV (rows + their local expert ids);
//   Combine:  AllToAllV (output rows; sizes known from Dispatch).
// With a host communicator (TCP) the exchange is staged through host memory
// (Backend::CopyToHost / CopyToDevice), so it is correct on a device backend too; with a device
// communicator (NCCL) device buffers go straight to the collectives, enqueued on the backend's
// stream (Backend::native_stream). Only the routing plan (ids, counts) visits the host.
// The host path can run in halves (BeginDispatch / exchange / FinishDispatch, the same for
// Combine) so that two micro-batches overlap one's exchange with the other's compute; the
// exchange may run on another thread. Otherwise not thread-safe: the model's one engine thread
// calls Dispatch and Combine in turn.
#ifndef DEEPINFER_WORKER_MODEL_EP_EXPERT_DISPATCHER_H_
#define DEEPINFER_WORKER_MODEL_EP_EXPERT_DISPATCHER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/comm/communicator.h"
#include "worker/model/expert_dispatcher.h"

namespace deepinfer {

class EpExpertDispatcher : public ExpertDispatcher {
 public:
  // `comm` and `backend` must outlive the dispatcher. INVALID_ARGUMENT if num_experts is not a
  // positive multiple of comm->world_size() (every rank must host the same number of experts
  // so that each can compute any expert's owner), or for a device-memory communicator with a
  // backend that has no stream (the CPU). With `placement`, starts with it (see SetPlacement;
  // its errors too).
  static absl::StatusOr<std::unique_ptr<EpExpertDispatcher>> Create(
      comm::Communicator* comm, Backend* backend, int64_t num_experts, int64_t hidden_size,
      std::shared_ptr<const ExpertPlacement> placement = nullptr);

  // This rank's experts in MoE layer `moe_layer`: without a placement [rank * E / W,
  // (rank + 1) * E / W), ascending; with one, the logical experts of its slots in slot order.
  const std::vector<int64_t>& local_experts(int64_t moe_layer) const override;

  // Collective: every rank of the group must call it, in the same layer order. On an error
  // (a token routed outside [0, E), a failed or inconsistent exchange) the communicator is
  // aborted, so that the peers fail at once instead of waiting for this rank.
  absl::Status Dispatch(int64_t moe_layer, int64_t num_tokens, int64_t top_k, const float* hidden,
                        const int32_t* topk_ids, const float* topk_weights,
                        DispatchedTokens* out) override;
  // Collective, like Dispatch; `dispatched` must come from this dispatcher's last Dispatch.
  absl::Status Combine(const DispatchedTokens& dispatched, const float* expert_out,
                       float* out) override;
  // See ExpertDispatcher. With a host communicator the exchange is the size exchange and the
  // all-to-all of the staged segments (dispatch), the all-to-all of the output rows (combine);
  // with a device one Begin* does everything and the exchange is empty.
  absl::StatusOr<Exchange> BeginDispatch(int64_t moe_layer, int64_t num_tokens, int64_t top_k,
                                         const float* hidden, const int32_t* topk_ids,
                                         const float* topk_weights, DispatchedTokens* out) override;
  absl::Status FinishDispatch(DispatchedTokens* dispatched) override;
  absl::StatusOr<Exchange> BeginCombine(DispatchedTokens* dispatched, const float* expert_out,
                                        float* out) override;
  absl::Status FinishCombine(DispatchedTokens* dispatched, float* out) override;
  // INVALID_ARGUMENT (and no change) unless the placement has E logical experts and its slots
  // divide over the W ranks. Its layer count is checked at Dispatch (FAILED_PRECONDITION for a
  // layer it does not have). Not collective: every rank must switch between the same two steps.
  absl::Status SetPlacement(std::shared_ptr<const ExpertPlacement> placement) override;
  std::string exchange_name() const override {
    return device_exchange_ ? "NCCL all-to-all (sizes on the host)" : "TCP (staged on the host)";
  }

  // The logical experts global rank `rank` of `world_size` hosts in each layer of `placement`
  // (its slots' experts, in slot order). The placement must divide over world_size.
  static std::vector<std::vector<int64_t>> ExpertsOfRank(const ExpertPlacement& placement,
                                                         int world_size, int rank);

 private:
  EpExpertDispatcher(comm::Communicator* comm, Backend* backend, int64_t num_experts,
                     int64_t hidden_size);
  // Aborts the communicator with `error` (this rank leaves the lock-step) and returns it.
  absl::Status Fail(absl::Status error);
  // Slots per rank: E / W without a placement (slot = expert), P / W with one.
  int64_t SlotsPerRank() const {
    return placement_ == nullptr ? experts_per_rank_
                                 : placement_->num_physical() / comm_->world_size();
  }
  // Bytes of one dispatched row in the size exchange: the row and its int32 local slot id.
  size_t RowBytes() const { return (hidden_size_ + 1) * sizeof(float); }
  // FAILED_PRECONDITION unless every rank sends whole rows.
  absl::Status CheckWholeRows(const std::vector<size_t>& recv_bytes) const;
  // The device communicator's dispatch after the send rows are gathered: sizes, rows and ids,
  // grouping.
  absl::Status DispatchOnDevice(DeviceBuffer* send_rows, const std::vector<int32_t>& local_ids,
                                DispatchedTokens* out);
  // Checks the received rows' local slots and groups them (group_offsets, received_row_slot,
  // num_rows; allocates hidden).
  absl::Status GroupArrivals(const std::vector<int32_t>& arrival_expert, DispatchedTokens* out);
  // Combine's halves, staging in *x.
  absl::StatusOr<Exchange> BeginCombineInto(const DispatchedTokens& d, const float* expert_out,
                                            float* out, StagedExchange* x);
  absl::Status FinishCombineFrom(const DispatchedTokens& d, StagedExchange* x, float* out);
  // The returned rows (each source's in the order it sent them) into (expert, token) order, then
  // added into out with the routing weights.
  void AddCombinedRows(const DispatchedTokens& d, std::unique_ptr<DeviceBuffer> rows, float* out);

  comm::Communicator* const comm_;
  Backend* const backend_;
  const int64_t num_experts_;
  const int64_t hidden_size_;
  const int64_t experts_per_rank_;
  // The communicator moves device memory: no host staging.
  const bool device_exchange_;
  std::vector<int64_t> contiguous_experts_;  // without a placement, every layer
  std::shared_ptr<const ExpertPlacement> placement_;
  std::vector<std::vector<int64_t>> placed_experts_;  // per layer, with a placement
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_EP_EXPERT_DISPATCHER_H_
