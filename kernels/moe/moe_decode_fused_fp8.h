// The fused decode MoE block of moe_decode_fused.h (routed + shared experts for 1-2 tokens in two
// launches, straight from the router's outputs, or a dense MLP with top_k 0) on FP8 weights kept
// FP8: e4m3 with one fp32 scale per 128 x 128 block (kernels/gemm/fp8_block_gemm.h's layout), so
// a decode step reads one byte per weight instead of bf16's two.
//
// The same two kernels as the bf16 block's grid-strided pair: gate_up (one warp per (part, row)
// pair, grid-strided, the next pair's first loads issued before the current one is summed) and
// down (one block per output feature, grid-strided, the parts' rows flattened over the block's
// threads, the next feature's loads issued first). Each lane loads 16 weights (16 bytes) at a
// time, all in one 128-wide k block: their products with the fp32 activations are summed in
// fp32, the sum multiplied by the block's scale and added to the lane's fp32 accumulator, then a
// butterfly across the warp (deterministic, no atomics). Both launched with programmatic
// dependent launch (kernels/common/launch.cuh).
//
// Numerics: e4m3 bytes are widened to fp32 values times 2^-120 with bit moves (exact, e4m3
// subnormals included), and 2^120 is folded into the block scale; products under fp32's normal
// range in that scaled domain (|product| < 2^-126, i.e. |a * w| < 2^-6 before the scale) keep
// fewer bits, an absolute error of at most 2^-30 * scale per product. e4m3 NaN bytes read as
// +-480 (checkpoints hold none). CPU reference: moe_decode_fused_fp8_test.
#ifndef DEEPINFER_KERNELS_MOE_MOE_DECODE_FUSED_FP8_H_
#define DEEPINFER_KERNELS_MOE_MOE_DECODE_FUSED_FP8_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/moe/moe_decode_fused.h"

namespace deepinfer {
namespace kernels {

// As MoeDecodeFusedParams (its limits kMoeDecodeFusedMaxTokens / kMoeDecodeFusedMaxParts, and
// its act workspace: MoeDecodeFusedActFloats floats), with FP8 matrices and their block scales.
// No clamped SwiGLU (DeepSeek-V4's experts are never kept FP8).
struct MoeDecodeFusedFp8Params {
  int32_t num_tokens = 0;  // 1..kMoeDecodeFusedMaxTokens
  // 0: a dense MLP of shared_parts * inter (no routed field is read; they may be 0 / null).
  int32_t top_k = 0;
  int32_t num_experts = 0;                  // >= 1 when top_k > 0
  int32_t hidden_size = 0;                  // a multiple of 16
  int32_t inter = 0;                        // moe_intermediate_size, a multiple of 16
  const float* hidden = nullptr;            // [num_tokens, hidden_size], 16-byte aligned
  const int32_t* topk_ids = nullptr;        // [num_tokens, top_k]; distinct within a token
  const float* topk_weights = nullptr;      // [num_tokens, top_k]
  const int32_t* slot_of_expert = nullptr;  // [num_experts]: expert e's table entry
  // [num_experts] pointers (indexed by slot), the matrices 16-byte aligned: gate_up [2*inter,
  // hidden_size] e4m3 row-major with its scale grid stacked at inter rows (Fp8ScaleRow(j,
  // inter)), scale rows gate_up_scale_ld apart; down [hidden_size, inter] with one grid.
  const uint8_t* const* gate_up = nullptr;
  const float* const* gate_up_scales = nullptr;
  int32_t gate_up_scale_ld = 0;  // >= Fp8ScaleCols(hidden_size)
  const uint8_t* const* down = nullptr;
  const float* const* down_scales = nullptr;
  int32_t down_scale_ld = 0;  // >= Fp8ScaleCols(inter)
  // Shared experts (shared_parts == 0: none): one MLP of intermediate shared_parts * inter,
  // gate rows then up rows [2 * shared_parts * inter, hidden_size] (16-byte aligned) with its
  // scale grid stacked at shared_gate_up_split_rows (0: one grid), and down [hidden_size,
  // shared_parts * inter] with one grid.
  int32_t shared_parts = 0;
  const uint8_t* shared_gate_up = nullptr;
  const float* shared_gate_up_scales = nullptr;
  int32_t shared_gate_up_scale_ld = 0;  // >= Fp8ScaleCols(hidden_size)
  int32_t shared_gate_up_split_rows = 0;
  const uint8_t* shared_down = nullptr;
  const float* shared_down_scales = nullptr;
  int32_t shared_down_scale_ld = 0;  // >= Fp8ScaleCols(shared_parts * inter)
  float* act = nullptr;              // [num_tokens, top_k + shared_parts, inter] fp32 workspace
  float* out = nullptr;              // [num_tokens, hidden_size], overwritten
};

// out[t] = sum over k of topk_weights[t, k] * down_e(silu(gate_e x_t) * up_e x_t) + the shared
// MLP of x_t, the weights dequantised exactly (e4m3 value times its block's scale), activations
// fp32. A choice whose expert id is outside [0, num_experts) contributes nothing.
// cudaErrorInvalidValue (nothing launched) for sizes outside the ranges above (incl. top_k +
// shared_parts == 0), hidden_size or inter not a multiple of 16, a misaligned hidden or shared
// matrix, short scale strides, a negative split, or null pointers (the routed ones only when
// top_k > 0, the shared ones only when shared_parts > 0).
cudaError_t MoeDecodeFusedFp8(const MoeDecodeFusedFp8Params& params, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_MOE_DECODE_FUSED_FP8_H_
