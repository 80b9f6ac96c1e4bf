// Grouped expert GEMM with bf16 weights for the MoE path: y = x · W_slotᵀ for the rows of each
// local expert slot, where the slot boundaries are read from DEVICE memory (as MoePermuteF32
// leaves them), so the host never needs the routing. Tuned for decode and small batches (a few
// to a few tens of rows per expert): each expert's weights are streamed from HBM with 16-byte
// loads and applied to all of the slot's rows, on CUDA cores (one row) or with bf16 MMAs. Correct
// for any group size, but large groups (prefill) are better served by cuBLAS / CUTLASS per
// group. CPU reference: GroupedGemmBf16Reference (moe_reference.h). Contracts and H200 numbers:
// docs/kernels.md.
#ifndef DEEPINFER_KERNELS_MOE_GROUPED_GEMM_H_
#define DEEPINFER_KERNELS_MOE_GROUPED_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

enum class GroupedGemmAlgo {
  kAuto,        // CUDA cores for rows_per_slot_hint <= 2 (decode), else tensor cores if built
  kCudaCore,    // fp32 FMA on CUDA cores: x used at full fp32 precision
  kTensorCore,  // mma.sync bf16 with x split into bf16 hi + lo (sm_80+; else cudaErrorNotSupported)
  // mma.sync bf16 with x rounded to bf16 to nearest even (one MMA per product, as the cuBLAS
  // paths' bf16 activations; sm_80+, else cudaErrorNotSupported). The same tiles and k order as
  // kTensorCore without its lo term: a row's result depends on neither max_rows nor the other
  // slots (the batch-invariant mode's expert GEMMs).
  kTensorCoreBf16X,
};

// From this many max_rows the tensor-core paths (fp32 x) take 128-row shared-memory tiles.
constexpr int32_t kGroupedGemmTiledMinRows = 8192;

// All pointers are device pointers.
struct GroupedGemmBf16Params {
  int32_t num_slots = 0;
  // Upper bound of slot_offsets[num_slots] known on the host (e.g. tokens * top_k); sizes the
  // grid, and rows at or beyond it are never touched even if the offsets claim them.
  int32_t max_rows = 0;
  const int32_t* slot_offsets = nullptr;  // [num_slots + 1], non-decreasing, [0] = 0
  int32_t n = 0;                          // output features
  int32_t k = 0;                          // input features, a multiple of 8
  const float* x = nullptr;               // [max_rows, k] fp32, 16-byte aligned
  // Instead of x, only with kTensorCoreBf16X (x null then): [max_rows, k] bf16 bits, 16-byte
  // aligned; the same outputs as x holding these values. Always the register tiles (the
  // shared-memory tiles from kGroupedGemmTiledMinRows take fp32 x; their sums are the same).
  const uint16_t* x_bf16 = nullptr;
  // [num_slots] pointers to bf16 (16-bit patterns) [n, k] row-major, each 16-byte aligned;
  // an empty slot's pointer is never read and may be null.
  const uint16_t* const* weights = nullptr;
  float* y = nullptr;  // [max_rows, n] fp32; rows >= slot_offsets[num_slots] left untouched
  // Expected most rows in one slot (0 = unknown: max_rows). Only a performance choice (the
  // register tile): any slot size stays correct. Decode knows it: a token's top-k experts are
  // distinct, so a slot has at most num_tokens rows.
  int32_t rows_per_slot_hint = 0;
  GroupedGemmAlgo algo = GroupedGemmAlgo::kAuto;
};

// Weights are used exactly; products are accumulated in fp32, and the result is fp32. CUDA-core
// path: x in fp32, so results differ from the sequential reference only by summation order
// (per lane ascending k, then a butterfly across the warp). Tensor-core path: x is split into
// two bf16 terms (hi + lo, relative error <= 2^-17 per element) and accumulated by the MMA
// units in fp32; the error bound is about 2^-16 * sum |x w| per output. From 8192 max_rows the
// tensor-core path stages 128-row x 64-feature tiles in shared memory; each output is the same
// sum, bit for bit, as with the smaller tiles (so a row's result depends on neither max_rows nor
// the other slots). kTensorCoreBf16X: x rounded to bf16, so the products are exact and the error
// is the fp32 accumulation's alone, against x's bf16 values (about k/16 * 2^-23 * sum |x w|).
// cudaErrorInvalidValue for k not a multiple of 8, non-positive n / k / num_slots, negative
// max_rows, a misaligned x or x_bf16, or x_bf16 with x or another algo. max_rows == 0 launches
// nothing.
cudaError_t GroupedGemmBf16(const GroupedGemmBf16Params& params, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_GROUPED_GEMM_H_
