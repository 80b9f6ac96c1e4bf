// Expert-parallel dispatch and combine on the device, with no host in the loop: every rank
// writes rows straight into its peers' exchange windows (load/store over NVLink, the pointers of
// an NCCL symmetric window, or plain buffers of one GPU in tests) and raises a per-source
// signal; receivers wait for the signals on the device. Nothing is sized on the host and no
// call synchronises the stream, so a whole step can be captured in a CUDA graph.
// docs/communicator.md ("Device exchange") describes the protocol, buffers and failures.
//
// Two modes share one window:
//   low latency (decode): one phase. Each receiver has a fixed region of `ll_capacity` rows per
//     source rank; a sender packs its rows for a destination there, ordered by (local slot,
//     token), with its per-slot counts. The receiver groups the rows by local slot.
//   throughput (prefill): two phases. Every rank first sends its per-slot counts to every rank
//     (an all-gather of counts on the device); then each sender knows the exact grouped row of
//     every row it sends and writes it there, so a receiver's rows need no regrouping and its
//     buffer is sized by the total it receives (`tp_capacity`), not per source.
// Combine is the same for both: each receiver writes each expert output row back into the
// source's combine window at the row's send position, and the source adds, for each token, its
// choices' weighted rows in ascending logical expert id (fmaf(w, row, acc), the order and
// arithmetic of ScatterAddRowsF32 over rows sorted by (expert, token)), so the result is bit
// identical to one rank that hosts every expert.
//
// Capacity: rows beyond a receiver's capacity are not sent; the sender and the receiver set
// kEpErrorOverflow in their error word (EpErrorWord), which the caller reads after the step and
// turns into an error. Combine skips the dropped rows; nothing is lost silently. A wait for a
// peer that does not signal within kEpWaitTimeoutNs sets kEpErrorTimeout and goes on.
//
// Each exchange is a sequence of phases, each an asynchronous launch on the caller's stream:
//   EpDispatchSend, EpDispatchRows, EpDispatchRecv, (experts), EpCombineSend, EpCombineRecv.
// A phase never waits for a peer's later phase, so ranks simulated on one GPU (tests) can run
// the phases rank by rank on one stream; on real ranks each calls all of them in order.
// Reuse of a window is safe without extra barriers because each rank's dispatch of step s+1
// comes after its combine of step s, which needs every peer's combine send of step s, which
// follows that peer's use of its dispatch rows of step s.
#ifndef DEEPINFER_KERNELS_MOE_EP_EXCHANGE_H_
#define DEEPINFER_KERNELS_MOE_EP_EXCHANGE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// Ranks one exchange addresses (one NVLink domain).
constexpr int kMaxEpRanks = 8;
// Physical expert slots over all ranks (the plan keeps one counter per slot in shared memory).
constexpr int kMaxEpSlots = 1024;
// Bits of the error word.
constexpr int32_t kEpErrorOverflow = 1;  // rows beyond a capacity were dropped
constexpr int32_t kEpErrorTimeout = 2;   // a peer did not signal in time
constexpr int32_t kEpErrorBadId = 4;     // an expert / slot id out of range (row dropped)
constexpr int64_t kEpWaitTimeoutNs = 20'000'000'000;  // 20 s

enum class EpMode { kLowLatency, kThroughput };

struct EpExchangeConfig {
  int32_t world = 1;           // ranks, 1..kMaxEpRanks
  int32_t slots_per_rank = 0;  // physical expert slots per rank; world * it <= kMaxEpSlots
  int32_t top_k = 0;
  int32_t max_tokens = 0;  // tokens one rank sends in one exchange, at most
  int32_t hidden = 0;      // floats per row, a positive multiple of 4
  // Low latency: rows a receiver takes from one source (1..max_tokens * top_k).
  int32_t ll_capacity = 0;
  // Throughput: rows a receiver takes from all sources together (>= 1).
  int32_t tp_capacity = 0;
};

// Byte offsets of the buffers; EpLayoutOf computes them. The window is the part peers write
// (the same size and layout on every rank: a symmetric window); the scratch is rank-local.
struct EpLayout {
  // Window.
  int64_t sig_counts = 0;  // int32 [world]: throughput counts phase, epoch of each source
  int64_t sig_rows = 0;    // int32 [world]: dispatch rows
  int64_t sig_comb = 0;    // int32 [world]: combine rows
  int64_t ll_counts = 0;   // int32 [world][slots_per_rank]: per source, rows per local slot
  int64_t ll_start = 0;    // int32 [world]: per source, its send position of its first row here
  int64_t all_counts = 0;  // int32 [world][world * slots_per_rank]: every rank's slot counts
  int64_t tp_origin = 0;   // int32 [tp_capacity]: source << 24 | send position
  int64_t disp_rows = 0;   // f32 [max(world * ll_capacity, tp_capacity)][hidden]
  int64_t comb_rows = 0;   // f32 [max_tokens * top_k][hidden], indexed by send position
  int64_t window_bytes = 0;
  // Scratch.
  int64_t control = 0;       // int32 [16]: epochs, error word, tickets, received rows
  int64_t pair_slot = 0;     // int32 [max_tokens * top_k]: global slot of each (token, k)
  int64_t pair_sp = 0;       // int32 [max_tokens * top_k]: send position, -1 if not sent
  int64_t slot_count = 0;    // int32 [world * slots_per_rank]: this rank's rows per slot
  int64_t slot_excl = 0;     // int32 [world * slots_per_rank]: exclusive prefix of slot_count
  int64_t tp_base = 0;       // int32 [world * slots_per_rank]: row of a slot's first row at its
                             // receiver (throughput)
  int64_t src_off = 0;       // int32 [world][slots_per_rank + 1]: low latency regrouping
  int64_t grp_base = 0;      // int32 [world][slots_per_rank]
  int64_t slot_offsets = 0;  // int32 [slots_per_rank + 1]: received rows per local slot, prefix
  int64_t recv_origin = 0;   // int32 [max received rows]
  int64_t grouped = 0;       // f32 [world * ll_capacity][hidden]: low latency grouped rows
  int64_t scratch_bytes = 0;
  int64_t max_received = 0;  // rows: max(world * ll_capacity, tp_capacity)
};

// INVALID (returns false, `why` says what) for a config outside the bounds above.
bool EpConfigValid(const EpExchangeConfig& cfg, const char** why);
EpLayout EpLayoutOf(const EpExchangeConfig& cfg);

// One rank's view: `window[r]` is rank r's window as this rank addresses it (window[rank] is its
// own), `scratch` its scratch. Both zeroed (EpInitBuffers) before the first exchange of any rank.
struct EpRankView {
  int32_t rank = 0;
  char* window[kMaxEpRanks] = {};
  char* scratch = nullptr;
};

// Zeroes this rank's window and scratch on `stream`. Every rank must finish this before any
// rank starts an exchange (a barrier outside).
cudaError_t EpInitBuffers(const EpExchangeConfig& cfg, const EpRankView& view, cudaStream_t stream);

// Phase 1. Plans this rank's rows: topk_ids [num_tokens, top_k] are logical expert ids (the
// combine order); topk_slots, if not null, the physical slot of each choice (an EPLB replica),
// else slot = expert id. The slot's rank is slot / slots_per_rank. Low latency: sends the rows
// and counts and signals. Throughput: sends the slot counts and signals.
// num_tokens must be in [0, max_tokens] (cudaErrorInvalidValue otherwise).
cudaError_t EpDispatchSend(const EpExchangeConfig& cfg, EpMode mode, const EpRankView& view,
                           int32_t num_tokens, const float* hidden, const int32_t* topk_ids,
                           const int32_t* topk_slots, cudaStream_t stream);
// Phase 2. Throughput: waits for every rank's counts, then sends the rows to their grouped rows
// and signals. Low latency: nothing.
cudaError_t EpDispatchRows(const EpExchangeConfig& cfg, EpMode mode, const EpRankView& view,
                           int32_t num_tokens, const float* hidden, cudaStream_t stream);
// Phase 3. Waits for every rank's rows; afterwards EpReceivedRows(...) holds the received rows
// grouped by local slot (slot l: rows [offsets[l], offsets[l+1]) of EpSlotOffsets, with
// offsets[slots_per_rank] the number received), all on the device.
cudaError_t EpDispatchRecv(const EpExchangeConfig& cfg, EpMode mode, const EpRankView& view,
                           cudaStream_t stream);
// Phase 4. expert_out [received rows, hidden] in the grouped order: sends each row back to
// its source and signals every rank.
cudaError_t EpCombineSend(const EpExchangeConfig& cfg, const EpRankView& view,
                          const float* expert_out, cudaStream_t stream);
// Phase 5. Waits for every rank's combine rows and adds, into out [num_tokens, hidden], each
// token's sent choices weighted by topk_weights, in ascending topk_ids. Same num_tokens and
// topk_ids as this exchange's EpDispatchSend.
cudaError_t EpCombineRecv(const EpExchangeConfig& cfg, const EpRankView& view, int32_t num_tokens,
                          const int32_t* topk_ids, const float* topk_weights, float* out,
                          cudaStream_t stream);

// EPLB replicas: the physical slot of each choice, replica (t + rank + e) % n of expert e's n
// replicas (worker/model/replica_choice.h), for topk_slots above. replica_start [num_experts + 1]
// and replicas [replica_start[num_experts]] list each logical expert's slots (device). An id
// outside [0, num_experts) gets slot -1 (dropped by the plan, kEpErrorBadId).
cudaError_t EpChooseSlots(int32_t num_tokens, int32_t top_k, int32_t num_experts, int32_t rank,
                          const int32_t* topk_ids, const int32_t* replica_start,
                          const int32_t* replicas, int32_t* topk_slots, cudaStream_t stream);

// row_slot[g] for g in [0, EpLayout::max_received): the local slot of received row g, or -1 past
// the received rows (valid after EpDispatchRecv on the stream).
cudaError_t EpRowSlots(const EpExchangeConfig& cfg, const EpRankView& view, int32_t* row_slot,
                       cudaStream_t stream);

// Device pointers into a rank's buffers (valid after EpDispatchRecv on the stream).
const float* EpReceivedRows(const EpExchangeConfig& cfg, EpMode mode, const EpRankView& view);
const int32_t* EpSlotOffsets(const EpExchangeConfig& cfg, const EpRankView& view);
// The error word (kEpError* bits, or 0); sticky until the caller clears it (EpClearError).
int32_t* EpErrorWord(const EpExchangeConfig& cfg, const EpRankView& view);
cudaError_t EpClearError(const EpExchangeConfig& cfg, const EpRankView& view, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_EP_EXCHANGE_H_
