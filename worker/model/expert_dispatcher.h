// ExpertDispatcher: the seam between routing and routed-expert computation. Dispatch takes each
// token's hidden state and top-k choice and returns, for every expert hosted on this rank, the
// rows routed to it (grouped, expert by expert); Combine takes the experts' outputs in that same
// order and adds each token's weighted sum into its output row. A single-rank implementation
// (LocalExpertDispatcher) permutes locally; an expert-parallel one exchanges rows with other
// ranks through a communicator (all-to-all) behind the same interface.
#ifndef DEEPINFER_WORKER_MODEL_EXPERT_DISPATCHER_H_
#define DEEPINFER_WORKER_MODEL_EXPERT_DISPATCHER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/eplb/expert_placement.h"
#include "worker/backend/device_buffer.h"

namespace deepinfer {

// A host-staged exchange between a Begin* and its Finish* (ExpertDispatcher::Exchange): the bytes
// this rank sends to and receives from each rank, and the staged segments.
struct StagedExchange {
  std::vector<size_t> send_bytes, recv_bytes;
  std::vector<float> send, recv;
};

// What Dispatch produced and Combine needs. Buffers are device buffers of the backend.
struct DispatchedTokens {
  int64_t num_rows = 0;
  // Rows of `hidden` for local expert i are [group_offsets[i], group_offsets[i+1]).
  std::vector<int64_t> group_offsets;
  std::unique_ptr<DeviceBuffer> hidden;  // [num_rows, hidden_size]
  // Implementation state for Combine (e.g. source token and weight of each row).
  std::unique_ptr<DeviceBuffer> row_token;
  std::unique_ptr<DeviceBuffer> row_weight;
  // Expert-parallel exchange plan (empty for a single-rank dispatcher), host side because the
  // host sizes the exchange: rows this rank sent to each rank (Combine gets as many back), rows
  // it received from each rank, and for each received row, in arrival order, its row in `hidden`.
  std::vector<int64_t> sent_rows_per_rank;
  std::vector<int64_t> received_rows_per_rank;
  std::vector<int64_t> received_row_slot;
  // The sender's rows in the order they were sent (grouped by destination): sent row j is row
  // sent_row_order[j] of the (expert, token) order Combine adds in. Identity without replicas.
  std::vector<int64_t> sent_row_order;
  // The exchange between BeginDispatch and FinishDispatch, BeginCombine and FinishCombine.
  StagedExchange staged;
};

class ExpertDispatcher {
 public:
  virtual ~ExpertDispatcher() = default;
  // Global (logical) ids of the experts this rank computes in MoE layer `moe_layer` (0 = the
  // first MoE layer), in the order of DispatchedTokens groups. With EPLB replicas one expert
  // may appear twice (two slots on this rank).
  virtual const std::vector<int64_t>& local_experts(int64_t moe_layer) const = 0;
  // True when Dispatch/Combine involve no other rank, so the model may compute the routed
  // experts another way (Backend::RoutedExperts) without breaking a collective's order.
  virtual bool single_rank() const { return false; }
  // How rows travel between ranks, for the worker log and `deepinfer-admin status` (e.g.
  // "local", "NCCL all-to-all (host-sized)", "device exchange (low latency, ...)").
  virtual std::string exchange_name() const { return "local"; }

  // Expert parallelism with the exchange on the device: the local slots per rank of the
  // exchange (local_experts(l)[i] in slot i; slots past them stay empty), 0 without one.
  virtual int64_t device_exchange_slots() const { return 0; }
  // experts(rows, hidden, local_slot, out): out[r] = the expert of local slot local_slot[r]
  // applied to hidden[r], for `rows` rows (local_slot -1: padding, any output); false if it
  // cannot run (nothing was enqueued).
  using DeviceExperts =
      std::function<bool(int64_t rows, const float* hidden, const int32_t* local_slot, float* out)>;
  // With device_exchange_slots() > 0: dispatch, `experts` on the received rows and combine into
  // out [num_tokens, hidden] (overwritten), all enqueued on the backend's stream with nothing
  // read back (a decode step may be captured in a CUDA graph). Collective like Dispatch.
  virtual absl::Status RoutedExpertsOnDevice(int64_t moe_layer, int64_t num_tokens,
                                             const float* hidden, const int32_t* topk_ids,
                                             const float* topk_weights, float* out,
                                             const DeviceExperts& experts) {
    return absl::UnimplementedError("this expert dispatcher has no device exchange");
  }
  // hidden [num_tokens, hidden_size]; topk_ids / topk_weights [num_tokens, top_k] (device).
  virtual absl::Status Dispatch(int64_t moe_layer, int64_t num_tokens, int64_t top_k,
                                const float* hidden, const int32_t* topk_ids,
                                const float* topk_weights, DispatchedTokens* out) = 0;
  // expert_out [num_rows, hidden_size] in dispatch order; adds into out [num_tokens, hidden].
  virtual absl::Status Combine(const DispatchedTokens& dispatched, const float* expert_out,
                               float* out) = 0;
  // Dispatch and Combine in two halves around their exchange, so that two micro-batches can
  // overlap one's exchange with the other's compute (MoeBlock's staged forward): Begin* computes
  // and stages, and returns the exchange, which makes only communicator calls and host copies
  // (no backend call), so it may run on another thread while this one computes; after it ran,
  // Finish* completes the call into `out`. `dispatched` (and what it points into) must live until
  // Finish*. Collective: every rank runs its exchanges in the same order. An exchange may be
  // empty (the Begin* call did all of it). The defaults run Dispatch / Combine in Begin*.
  using Exchange = std::function<absl::Status()>;
  virtual absl::StatusOr<Exchange> BeginDispatch(int64_t moe_layer, int64_t num_tokens,
                                                 int64_t top_k, const float* hidden,
                                                 const int32_t* topk_ids, const float* topk_weights,
                                                 DispatchedTokens* out) {
    absl::Status st = Dispatch(moe_layer, num_tokens, top_k, hidden, topk_ids, topk_weights, out);
    if (!st.ok()) return st;
    return Exchange();
  }
  virtual absl::Status FinishDispatch(DispatchedTokens* dispatched) { return absl::OkStatus(); }
  virtual absl::StatusOr<Exchange> BeginCombine(DispatchedTokens* dispatched,
                                                const float* expert_out, float* out) {
    absl::Status st = Combine(*dispatched, expert_out, out);
    if (!st.ok()) return st;
    return Exchange();
  }
  virtual absl::Status FinishCombine(DispatchedTokens* dispatched, float* out) {
    return absl::OkStatus();
  }

  // Switches to an EPLB placement (physical slots spread evenly over the group's ranks; null:
  // back to contiguous experts). Takes effect at the next Dispatch; the caller makes sure the
  // weights of the new local experts are loaded and that every rank switches at the same step.
  // UNIMPLEMENTED for dispatchers without placements (one rank hosting every expert).
  virtual absl::Status SetPlacement(std::shared_ptr<const ExpertPlacement> placement) {
    return absl::UnimplementedError("this expert dispatcher does not take EPLB placements");
  }
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_EXPERT_DISPATCHER_H_
