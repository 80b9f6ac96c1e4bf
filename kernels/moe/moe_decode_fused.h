// A whole MoE block (routed experts + shared experts) for 1-2 decode tokens in two launches,
// straight from the router's outputs on the device: no permutation plan, no gather, no
// separate SiLU-mul, combine or shared-expert GEMMs.
//
//   1. gate_up: each (expert or shared part, row j) streams the gate row j and the up row j
//      once for every token that chose the expert and writes act[token, part, j] =
//      silu(gate) * up (fp32).
//   2. down: out[t, f] = sum over k of topk_weights[t, k] * (act[t, k] . down_e[f]) + sum over
//      shared parts s of (act[t, K + s] . shared_down[f, s*inter:(s+1)*inter]).
//
// gate_up is grid-strided over the (part, row) pairs with its load round trips overlapped; down
// at one token keeps each thread's activations in registers for the whole kernel (where a
// thread's chunks fit, kMaxStatChunks), else it is grid-strided over the output features like
// gate_up (the fastest pair measured at every width, H200, docs/kernels/moe-decode.md).
//
// The shared MLP of intermediate size shared_parts * inter is exactly the sum of shared_parts
// MLPs of intermediate inter over consecutive slices of its gate / up rows and down columns
// (weight 1.0 each), so it is read in place. With top_k == 0 the block is that MLP alone: a
// dense MLP layer (no routing; the routed-expert fields are not read). Deterministic (no atomics, a
// fixed order per output). CPU reference: the backend's Gemm / SiluMul / combine
// (moe_decode_fused_test). Contracts and H200 numbers: docs/kernels/moe-decode.md.
#ifndef DEEPINFER_KERNELS_MOE_MOE_DECODE_FUSED_H_
#define DEEPINFER_KERNELS_MOE_MOE_DECODE_FUSED_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// Most tokens and parts (top_k + shared_parts) per token the fused block handles.
inline constexpr int32_t kMoeDecodeFusedMaxTokens = 2;
inline constexpr int32_t kMoeDecodeFusedMaxParts = 32;

// All pointers are device pointers; bf16 values are 16-bit patterns.
struct MoeDecodeFusedParams {
  int32_t num_tokens = 0;  // 1..kMoeDecodeFusedMaxTokens
  // 0: no routed experts (a dense MLP of shared_parts * inter, shared_parts >= 1); topk_ids,
  // topk_weights, slot_of_expert, gate_up, down and num_experts are then not read (may be 0 /
  // null).
  int32_t top_k = 0;
  int32_t num_experts = 0;                  // >= 1 when top_k > 0
  int32_t hidden_size = 0;                  // a multiple of 8
  int32_t inter = 0;                        // moe_intermediate_size, a multiple of 8
  const float* hidden = nullptr;            // [num_tokens, hidden_size], 16-byte aligned
  const int32_t* topk_ids = nullptr;        // [num_tokens, top_k]; distinct within a token
  const float* topk_weights = nullptr;      // [num_tokens, top_k]
  const int32_t* slot_of_expert = nullptr;  // [num_experts]: expert e's table entry
  // [num_experts] pointers (indexed by slot), each 16-byte aligned: [2*inter, hidden_size] and
  // [hidden_size, inter] bf16 row-major.
  const uint16_t* const* gate_up = nullptr;
  const uint16_t* const* down = nullptr;
  // Shared experts (shared_parts == 0: none): gate rows then up rows,
  // [2 * shared_parts * inter, hidden_size], and down [hidden_size, shared_parts * inter].
  int32_t shared_parts = 0;
  const uint16_t* shared_gate_up = nullptr;
  const uint16_t* shared_down = nullptr;
  // Workspace: [num_tokens, top_k + shared_parts, inter] fp32 (MoeDecodeFusedActFloats).
  float* act = nullptr;
  float* out = nullptr;  // [num_tokens, hidden_size], overwritten
  // > 0: DeepSeek-V4's clamped SwiGLU in every part, silu(min(g, limit)) * clamp(u, -limit,
  // limit) (V4Ops::SwiGluClamped); 0: silu(g) * u.
  float swiglu_limit = 0.0f;
};

// Floats of MoeDecodeFusedParams::act for these sizes.
int64_t MoeDecodeFusedActFloats(int32_t num_tokens, int32_t top_k, int32_t shared_parts,
                                int32_t inter);

// Weights are used exactly, activations in fp32, sums in fp32 (per lane ascending k, then a
// butterfly across the warp; the routed weight is applied to each lane's partial sum). A choice
// whose expert id is outside [0, num_experts) contributes nothing. cudaErrorInvalidValue for
// sizes outside the ranges above (incl. top_k + shared_parts == 0), hidden_size or inter not a
// multiple of 8, a misaligned hidden, null pointers (the routed ones only when top_k > 0),
// or shared_parts > 0 without shared weights.
cudaError_t MoeDecodeFusedF32(const MoeDecodeFusedParams& params, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_MOE_DECODE_FUSED_H_
