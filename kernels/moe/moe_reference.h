// Host (CPU) reference of the device-side MoE path in kernels/moe: token permutation to local
// expert slots, the weighted combine back to tokens, and the grouped expert GEMM with bf16
// weights. The GPU kernels (moe_permute.h, grouped_gemm.h) are tested against these functions,
// and a CPU backend can call them directly: they follow the same contracts, including the
// deterministic row order and the fp32 summation order of the combine.
#ifndef DEEPINFER_KERNELS_MOE_MOE_REFERENCE_H_
#define DEEPINFER_KERNELS_MOE_MOE_REFERENCE_H_

#include <cstdint>
#include <cstring>
#include <vector>

namespace deepinfer {
namespace kernels {

// bf16 is carried as its 16-bit pattern (the upper half of an IEEE fp32).
inline float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even (NaN stays NaN), as __float2bfloat16_rn and torch do.
inline uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// Result of MoePermuteReference (see MoePermuteParams in moe_permute.h for the contract).
struct MoePermutation {
  std::vector<int32_t> slot_counts;    // [num_slots]
  std::vector<int32_t> slot_offsets;   // [num_slots + 1], exclusive prefix of slot_counts
  std::vector<int32_t> choice_row;     // [num_tokens * top_k]: row of each (token, k), or -1
  std::vector<int32_t> row_token;      // [slot_offsets.back()]: source token of each row
  std::vector<float> permuted_hidden;  // [slot_offsets.back(), hidden_size]
};

// Rows are grouped by slot (ascending) and, within a slot, ordered by (token, k). Choices whose
// expert id is outside [0, num_experts) or maps to slot -1 get no row (choice_row = -1).
MoePermutation MoePermuteReference(int32_t num_tokens, int32_t top_k, int32_t num_experts,
                                   int32_t num_slots, const int32_t* topk_ids,
                                   const int32_t* slot_of_expert, int64_t hidden_size,
                                   const float* hidden);

// out[t, :] += w[t, k] * expert_out[choice_row[t, k], :] for k = 0, 1, ... in that order, each
// step rounded in fp32 (a product, then a sum; no fused multiply-add). Choices with row -1 are
// skipped.
void MoeCombineReference(int32_t num_tokens, int32_t top_k, int64_t hidden_size,
                         const int32_t* choice_row, const float* topk_weights,
                         const float* expert_out, float* out);

// y[r, :] = x[r, :] · W_sᵀ for the rows r of each slot s (slot_offsets[s] <= r <
// slot_offsets[s+1]); weights[s] is bf16 [n, k] row-major (may be null for an empty slot).
// fp32 products and sums in ascending p.
void GroupedGemmBf16Reference(int32_t num_slots, const int32_t* slot_offsets, int32_t n, int32_t k,
                              const float* x, const std::vector<const uint16_t*>& weights,
                              float* y);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_MOE_REFERENCE_H_
