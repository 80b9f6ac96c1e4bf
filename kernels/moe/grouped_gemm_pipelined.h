// Grouped expert GEMM for decode batches of a few to a few tens of rows per expert, laid out for
// HBM bandwidth: a persistent grid (one block per SM) walks the (expert slot, 32-feature tile)
// items of the GEMM and streams each item's weights through a cp.async ring in shared memory
// that runs on across items, so a block keeps ~96 KB of weights in flight at every moment, with
// bf16 MMAs (sm_80+) over up to 16-24 of the slot's rows a pass. The slot boundaries are
// read on the DEVICE (as MoePermuteF32 leaves them, no row padding needed), so it records into a
// CUDA graph with one fixed shape. The gate_up GEMM can apply SiLU-mul in its epilogue and write
// the down GEMM's bf16 input directly (no gate_up buffer, no separate pass). Contract and H200
// numbers: docs/kernels.md ("Pipelined grouped GEMM").
#ifndef DEEPINFER_KERNELS_MOE_GROUPED_GEMM_PIPELINED_H_
#define DEEPINFER_KERNELS_MOE_GROUPED_GEMM_PIPELINED_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

enum class PipelinedGemmEpilogue {
  // y[r, f] = x[r, :] · W_slot[f, :] in fp32 ([rows, n]).
  kF32,
  // W_slot is a gate_up weight ([2 * inter, k]: gate rows, then up rows; n = 2 * inter):
  // act[r, i] = bf16(silu(gate) * up) with gate = x[r] · W[i], up = x[r] · W[inter + i], both
  // fp32, silu(g) = g / (1 + exp(-g)) ([rows, inter] bf16).
  kSiluMulBf16,
};

// All pointers are device pointers.
struct GroupedGemmBf16PipelinedParams {
  int32_t num_slots = 0;
  // Host-known upper bound of slot_offsets[num_slots] (e.g. tokens * top_k): rows at or past it
  // are never touched even if the offsets claim them.
  int32_t max_rows = 0;
  const int32_t* slot_offsets = nullptr;  // [num_slots + 1], non-decreasing, [0] = 0
  int32_t n = 0;                          // output features (kSiluMulBf16: 2 * inter, even)
  int32_t k = 0;                          // input features, a multiple of 8
  const uint16_t* x = nullptr;            // [max_rows, k] bf16 (16-bit patterns), 16-byte aligned
  // [num_slots] pointers to bf16 [n, k] row-major, each 16-byte aligned; an empty slot's pointer
  // is never dereferenced for its data (it may be null).
  const uint16_t* const* weights = nullptr;
  PipelinedGemmEpilogue epilogue = PipelinedGemmEpilogue::kF32;
  float* y = nullptr;       // kF32: [max_rows, n]; rows >= slot_offsets[num_slots] untouched
  uint16_t* act = nullptr;  // kSiluMulBf16: [max_rows, n / 2]; likewise
  // Blocks of the persistent grid; 0 = as many as are resident at once on the device (one per
  // SM on the H200). Tests set small counts so that one block walks many items.
  int32_t max_blocks = 0;
  // The pipeline shape: 1 (0 = the default): k chunks of 256 (512-byte runs per weight row),
  // 24-row passes, 7 stages; 2: k chunks of 512 (1 KB runs), 16-row passes, 4 stages. Same
  // results up to the order of the fp32 sums (both add the 8 warps' k slices in warp order).
  int32_t variant = 0;
};

// The largest GroupedGemmBf16PipelinedParams::variant.
constexpr int32_t kMaxPipelinedGemmVariant = 2;

// Products of bf16 values are exact in fp32; each output is accumulated by the MMA units in fp32
// over k in 16-wide steps: it differs from an exact dot product by about (k / 16) * 2^-23 *
// sum |x w|. kSiluMulBf16 rounds only the final product to bf16 (nearest even).
// cudaErrorInvalidValue for k not a multiple of 8, non-positive n / k / num_slots, an odd n with
// kSiluMulBf16, negative max_rows or max_blocks, a variant outside [0, kMaxPipelinedGemmVariant],
// a misaligned x, or a missing output pointer;
// cudaErrorNotSupported where the MMA kernel was not built for the device. max_rows == 0
// launches nothing. Launched with programmatic dependent launch (kernels/common/launch.cuh): the
// first item's weights are prefetched into L2 before the wait for the preceding kernels.
cudaError_t GroupedGemmBf16Pipelined(const GroupedGemmBf16PipelinedParams& params,
                                     cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_GROUPED_GEMM_PIPELINED_H_
