// The fused decode MoE block of moe_decode_fused.h (routed + shared experts for 1-2 tokens in two
// launches, straight from the router's outputs, or a dense MLP with top_k 0) on FP8 weights kept
// FP8: e4m3 with one fp32 scale per 128 x 128 block (kernels/gemm/fp8_block_gemm.h's layout), so
// a decode step reads one byte per weight instead of bf16's two.
//
// Four kernel pairs (MoeDecodeFusedFp8Variant), each a gate_up launch and a down launch, both
// launched with programmatic dependent launch (kernels/common/launch.cuh) and summing across a
// warp with a butterfly (deterministic, no atomics):
// - kPerRow: the bf16 block's grid-strided pair: gate_up one warp per (part, row) pair, down one
//   block per output feature; each lane loads 16 weights (16 bytes) at a time and the fp32
//   hidden / act values for them through L1.
// - kRowReuse: gate_up one warp per (part, 2 rows) item, the hidden rows staged once per block in
//   shared memory (swizzled: conflict-free 16-byte reads), so one activation read serves 4 weight
//   rows (gate and up of 2 rows); down one block per 4 output features, one act read serving
//   the 4 features' rows, the act workspace written by gate_up in an order in which a warp's act
//   reads are contiguous. Taken where hidden_size <= kMoeDecodeFusedFp8MaxStagedHidden, the shared
//   split row is even and the device gives the shared memory (else kPerRow).
// - kStationary: kRowReuse's gate_up; at one token, where a feature's parts make at most 3 x 384
//   chunks of 16 values ((top_k + shared_parts) * inter / 16: Moonlight 704, V3 1152), a down of
//   one 384-thread block per SM over a contiguous range of output features whose threads each
//   own the same few chunks of every feature and hold those chunks' act values, routing weights
//   and row pointers in registers, so a weight load costs no act read and no table look-up
//   (moe_decode_fused_fp8_stationary.cu); elsewhere kRowReuse's down (and kPerRow where
//   kRowReuse's gate_up does not apply). Its sums are kRowReuse's in another order.
// - kPipelined: at one token where hidden_size <= 2048 (Moonlight), a gate_up in which each warp
//   streams whole (gate, up) row pairs, 4 of them in flight in a register ring, against its
//   lanes' slices of the hidden row held in fp32 registers (no shared memory, no barrier), the
//   first shared rows loaded before the PDL wait and the routing resolved per warp
//   (moe_decode_fused_fp8_pipelined.cu; its act values are kRowReuse's gate_up's bit for bit),
//   then kStationary's down (kRowReuse's where that does not apply); elsewhere kStationary.
// Each lane's 16 weights lie in one 128-wide k block: their products with the fp32 activations
// are summed in fp32 in k order, the sum multiplied by the block's scale and added to the lane's
// fp32 accumulator.
//
// Numerics: kPerRow widens e4m3 bytes to fp32 values times 2^-120 with bit moves (exact, e4m3
// subnormals included) and folds 2^120 into the block scale; products under fp32's normal range
// in that scaled domain (|product| < 2^-126, i.e. |a * w| < 2^-6 before the scale) keep fewer
// bits, an absolute error of at most 2^-30 * scale per product; e4m3 NaN bytes read as +-480.
// kRowReuse, kStationary and kPipelined widen them with cvt.f16x2.e4m3x2 then fp16 -> fp32 (exact:
// every e4m3 value is an fp16 value), so products are the fp32 products of the exact weights; e4m3
// NaN bytes read as NaN. Checkpoints hold no NaN bytes. CPU reference: moe_decode_fused_fp8_test.
#ifndef DEEPINFER_KERNELS_MOE_MOE_DECODE_FUSED_FP8_H_
#define DEEPINFER_KERNELS_MOE_MOE_DECODE_FUSED_FP8_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/moe/moe_decode_fused.h"

namespace deepinfer {
namespace kernels {

// The kernel pairs of the block (see the top of this file); kDefault is
// kMoeDecodeFusedFp8DefaultVariant.
enum class MoeDecodeFusedFp8Variant : int32_t {
  kDefault = 0,
  kPerRow = 1,
  kRowReuse = 2,
  kStationary = 3,
  kPipelined = 4,
};
inline constexpr MoeDecodeFusedFp8Variant kMoeDecodeFusedFp8DefaultVariant =
    MoeDecodeFusedFp8Variant::kStationary;
// kRowReuse's largest hidden_size (its hidden rows in shared memory: 4 * num_tokens * hidden_size
// bytes a block).
inline constexpr int32_t kMoeDecodeFusedFp8MaxStagedHidden = 8192;

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
  // [num_tokens, top_k + shared_parts, inter] fp32 workspace (each row's order is the
  // variant's own).
  float* act = nullptr;
  float* out = nullptr;  // [num_tokens, hidden_size], overwritten
  MoeDecodeFusedFp8Variant variant = MoeDecodeFusedFp8Variant::kDefault;
};

// out[t] = sum over k of topk_weights[t, k] * down_e(silu(gate_e x_t) * up_e x_t) + the shared
// MLP of x_t, the weights dequantised exactly (e4m3 value times its block's scale), activations
// fp32. A choice whose expert id is outside [0, num_experts) contributes nothing.
// cudaErrorInvalidValue (nothing launched) for sizes outside the ranges above (incl. top_k +
// shared_parts == 0), an unknown variant, hidden_size or inter not a multiple of 16, a misaligned
// hidden or shared matrix, short scale strides, a negative split, or null pointers (the routed ones
// only when top_k > 0, the shared ones only when shared_parts > 0).
cudaError_t MoeDecodeFusedFp8(const MoeDecodeFusedFp8Params& params, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_MOE_DECODE_FUSED_FP8_H_
