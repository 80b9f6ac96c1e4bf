// Device-side MoE token permutation: from each token's top-k expert ids to rows grouped by local
// expert slot (counts and offsets left in device memory, so the grouped expert GEMM can read
// them without a host round trip), and the weighted combine of the experts' outputs back into
// token order. The CPU reference is kernels/moe/moe_reference.h.
#ifndef DEEPINFER_KERNELS_MOE_MOE_PERMUTE_H_
#define DEEPINFER_KERNELS_MOE_MOE_PERMUTE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// Local slots one permutation can address (DeepSeek-V3: 256 experts, Kimi-K2: 384, plus
// redundant EPLB replicas on one rank).
constexpr int32_t kMaxMoeSlots = 512;

// All pointers are device pointers. "choices" are the num_tokens * top_k (token, k) pairs.
struct MoePermuteParams {
  int32_t num_tokens = 0;
  int32_t top_k = 0;
  int32_t num_experts = 0;                  // global expert ids are < num_experts
  int32_t num_slots = 0;                    // local slots, 1..kMaxMoeSlots
  const int32_t* topk_ids = nullptr;        // [num_tokens, top_k - shared_slots]
  const int32_t* slot_of_expert = nullptr;  // [num_experts]: local slot, or -1 (not hosted)
  // The last shared_slots (>= 0) of a token's top_k choices are not read from topk_ids: choice
  // top_k - shared_slots + j goes to slot num_slots - shared_slots + j (a shared expert run as
  // a group of its own that every token takes); the routed choices take the slots below those
  // (slot_of_expert values from num_slots - shared_slots on count as not hosted).
  int32_t shared_slots = 0;
  int64_t hidden_size = 0;        // 0: the plan only (counts, offsets, choice_row, row_token)
  const float* hidden = nullptr;  // [num_tokens, hidden_size]
  // Outputs.
  int32_t* slot_counts = nullptr;    // [num_slots]
  int32_t* slot_offsets = nullptr;   // [num_slots + 1]: exclusive prefix; [num_slots] = rows
  int32_t* choice_row = nullptr;     // [num_tokens, top_k]: row of the choice, or -1
  int32_t* row_token = nullptr;      // [num_tokens * top_k]: source token of each row
  float* permuted_hidden = nullptr;  // [num_tokens * top_k, hidden_size]
  // If set, the gathered rows are written here instead, rounded to bf16 (nearest even; the
  // operand of a bf16 GEMM), and permuted_hidden is not used (may be null).
  uint16_t* permuted_hidden_bf16 = nullptr;  // [num_tokens * top_k, hidden_size]
  // Every slot starts at a multiple of row_align (>= 1): slot s owns rows [slot_offsets[s],
  // slot_offsets[s] + slot_counts[s]), then padding rows up to the next multiple, which no
  // choice maps to and nothing writes (row_token / permuted rows there stay as they were).
  // slot_offsets[num_slots] is the padded total, at most num_tokens * top_k +
  // num_slots * (row_align - 1): size the row buffers for that. Lets a GEMM take each slot in
  // whole tiles of row_align rows (kernels::ExpertGemmsCublas kChunked).
  int32_t row_align = 1;
  // Device scratch of MoePermutePlanWorkspaceBytes(num_tokens, top_k, num_slots) bytes (may be
  // null when that is 0): lets a large permutation plan with many blocks instead of one (see
  // MoePermuteF32). Null: the one-block plan at any size.
  void* plan_workspace = nullptr;
};

// From this many choices (num_tokens * top_k) on, MoePermuteF32 plans with many blocks when given a
// workspace, and gathers one block per token (each hidden row read once, written top_k times;
// hidden_size % 4 == 0 and aligned pointers) instead of one block per row or choice; below it
// (decode batches), the one-block plan and the gather by row or choice. All give the same outputs
// bit for bit.
constexpr int64_t kMoeMultiBlockPlanChoices = 4096;

// Bytes of MoePermuteParams::plan_workspace for these sizes: 0 below kMoeMultiBlockPlanChoices,
// else per-block slot counts.
int64_t MoePermutePlanWorkspaceBytes(int32_t num_tokens, int32_t top_k, int32_t num_slots);

// Upper bound of slot_offsets[num_slots] (the row buffers' size) for these sizes.
inline int64_t MoePermutedRowsBound(int32_t num_tokens, int32_t top_k, int32_t num_slots,
                                    int32_t row_align) {
  return int64_t{num_tokens} * top_k + int64_t{num_slots} * (row_align - 1);
}

// Rows are grouped by slot in ascending slot order and, inside a slot, ordered by (token, k):
// the result is deterministic and equals MoePermuteReference. A choice whose expert id is out
// of [0, num_experts) or whose slot is -1 (or >= num_slots) gets no row (choice_row = -1);
// rows = slot_offsets[num_slots] <= num_tokens * top_k, and row_token / permuted_hidden
// entries at or beyond rows are left untouched. Two launches on `stream` (plan: one block;
// gather: one block per possible row, those beyond `rows` exit, or per choice with row_align
// > 1), or from kMoeMultiBlockPlanChoices choices with a plan_workspace four (per-block slot
// counts, their prefix over blocks and slots, the ranks, then the gather one block per token).
// cudaErrorInvalidValue for num_slots outside 1..kMaxMoeSlots, negative sizes, row_align < 1,
// shared_slots outside 0..min(top_k, num_slots - 1), or a row bound >= 2^31.
cudaError_t MoePermuteF32(const MoePermuteParams& params, cudaStream_t stream);

struct MoeCombineParams {
  int32_t num_tokens = 0;
  int32_t top_k = 0;
  int64_t hidden_size = 0;
  const int32_t* choice_row = nullptr;  // [num_tokens, top_k] from MoePermuteF32
  const float* topk_weights = nullptr;  // [num_tokens, top_k - shared_slots]
  // The last shared_slots (>= 0) choices of each token (MoePermuteParams::shared_slots) weigh
  // exactly 1 (not read from topk_weights).
  int32_t shared_slots = 0;
  const float* expert_out = nullptr;  // [rows, hidden_size], rows in permuted order
  // If set, the expert outputs are read from here as bf16 bits instead (a bf16-output expert
  // GEMM: half the bytes of this pass), widened exactly to fp32; expert_out is not used.
  const uint16_t* expert_out_bf16 = nullptr;  // [rows, hidden_size]
  float* out = nullptr;                       // [num_tokens, hidden_size]
  // true: the sum is added into out; false: out is overwritten (it is not read, so the caller
  // needs no memset; the result equals adding into zeros, bit for bit).
  bool accumulate = true;
};

// out[t, :] (+)= w[t, k] * expert_out[choice_row[t, k], :] summed over k = 0, 1, ... in order
// (w 1 for the shared choices), each step an fp32 product then an fp32 sum (never fused),
// skipping choice_row -1: bit for bit MoeCombineReference (into zeros when !accumulate). With
// ids ascending within a token (as the noaux_tc router emits them) and slots ascending in expert
// id, this is also LocalExpertDispatcher::Combine's order.
cudaError_t MoeCombineF32(const MoeCombineParams& params, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_MOE_PERMUTE_H_
