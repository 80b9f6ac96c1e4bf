// Straightforward loops: this is the specification the GPU kernels are checked against, so it is
// written for obviousness, not speed. Built with -ffp-contract=off so no multiply-add is fused.
#include "kernels/moe/moe_reference.h"

namespace deepinfer {
namespace kernels {

MoePermutation MoePermuteReference(int32_t num_tokens, int32_t top_k, int32_t num_experts,
                                   int32_t num_slots, const int32_t* topk_ids,
                                   const int32_t* slot_of_expert, int64_t hidden_size,
                                   const float* hidden) {
  const int64_t choices = int64_t{num_tokens} * top_k;
  auto slot_of_choice = [&](int64_t i) {
    const int32_t e = topk_ids[i];
    if (e < 0 || e >= num_experts) return -1;
    const int32_t s = slot_of_expert[e];
    return s >= 0 && s < num_slots ? s : -1;
  };
  MoePermutation p;
  p.slot_counts.assign(num_slots, 0);
  for (int64_t i = 0; i < choices; ++i) {
    const int32_t s = slot_of_choice(i);
    if (s >= 0) ++p.slot_counts[s];
  }
  p.slot_offsets.assign(num_slots + 1, 0);
  for (int32_t s = 0; s < num_slots; ++s)
    p.slot_offsets[s + 1] = p.slot_offsets[s] + p.slot_counts[s];
  const int32_t rows = p.slot_offsets[num_slots];
  std::vector<int32_t> next(p.slot_offsets.begin(), p.slot_offsets.end() - 1);
  p.choice_row.assign(choices, -1);
  p.row_token.assign(rows, -1);
  p.permuted_hidden.assign(static_cast<size_t>(rows) * hidden_size, 0.0f);
  for (int64_t i = 0; i < choices; ++i) {
    const int32_t s = slot_of_choice(i);
    if (s < 0) continue;
    const int32_t row = next[s]++;
    const int32_t t = static_cast<int32_t>(i / top_k);
    p.choice_row[i] = row;
    p.row_token[row] = t;
    std::memcpy(&p.permuted_hidden[static_cast<size_t>(row) * hidden_size],
                hidden + int64_t{t} * hidden_size, hidden_size * sizeof(float));
  }
  return p;
}

void MoeCombineReference(int32_t num_tokens, int32_t top_k, int64_t hidden_size,
                         const int32_t* choice_row, const float* topk_weights,
                         const float* expert_out, float* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    float* o = out + t * hidden_size;
    for (int64_t k = 0; k < top_k; ++k) {
      const int32_t row = choice_row[t * top_k + k];
      if (row < 0) continue;
      const float w = topk_weights[t * top_k + k];
      const float* y = expert_out + int64_t{row} * hidden_size;
      for (int64_t c = 0; c < hidden_size; ++c) {
        const float product = w * y[c];
        o[c] = o[c] + product;
      }
    }
  }
}

void GroupedGemmBf16Reference(int32_t num_slots, const int32_t* slot_offsets, int32_t n, int32_t k,
                              const float* x, const std::vector<const uint16_t*>& weights,
                              float* y) {
  for (int32_t s = 0; s < num_slots; ++s) {
    for (int64_t r = slot_offsets[s]; r < slot_offsets[s + 1]; ++r) {
      const float* xr = x + r * k;
      for (int64_t j = 0; j < n; ++j) {
        const uint16_t* w = weights[s] + j * k;
        float acc = 0.0f;
        for (int64_t p = 0; p < k; ++p) acc += xr[p] * Bf16ToFloat(w[p]);
        y[r * n + j] = acc;
      }
    }
  }
}

}  // namespace kernels
}  // namespace deepinfer
