// Grouped GEMM against bf16 weights on bf16 tensor cores (mma.sync m16n8k16, sm_80+),
// on the tile loop of the FP8 and MXFP4 GEMMs (mma_weight_tile.cuh) with the weights used as they
// are (no widening, no scales): the routed experts' rows of a decode step or a prefill, grouped by
// expert with the group extents in device memory. Each thread streams 16-byte pieces of its weight
// rows (a quad reads 64 contiguous bytes of a row per load); activations are bf16, so the products
// are exact and only the fp32 summation rounds: each 128-wide k block's MMA sum is added to an fp32
// accumulator, and warps that split k add their partial sums in warp order through shared memory.
//
// Batch invariance: with a fixed k_split every output's sum (its MMAs, their order, the k-slices'
// addition) depends on neither the group's row count nor the row's place in it, nor on the tile
// options (all_rows and rows_by_group included) or the row tile (rows_per_group_hint): the
// batch-invariant mode's routed-expert GEMMs (CudaTuning::batch_invariant).
#ifndef DEEPINFER_KERNELS_GEMM_BF16_MMA_GEMM_H_
#define DEEPINFER_KERNELS_GEMM_BF16_MMA_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/gemm/mma_tile_options.h"

namespace deepinfer {
namespace kernels {

// The bf16 kernel's default tile: 16 weight rows a warp (the wide tile's 32 rows would hold 128
// registers of weights a thread, a k block ahead), the activation fragments through shared
// memory, two blocks an SM: the loads in flight a warp as kGroupedMmaTile's for FP8 weights (4 KiB
// a k block).
constexpr MmaTileOptions kBf16GroupedMmaTile{false, true, true};

// The batch-invariant mode's register loop (CudaBackend, decode sizes): kBf16GroupedMmaTile with
// rows_by_group, so that a group of at most the hint's rows takes one pass of the fewest 8-row
// tiles that hold them (the same sums as kBf16GroupedMmaTile).
constexpr MmaTileOptions kBf16BatchInvariantTile{false, true, true, false, true};

// Whether this process has the tensor-core kernel for the current device (sm_80+ code).
bool Bf16MmaGemmAvailable();

// For group g: c[r, j] = sum_p a[r, p] * w_g[j, p] for rows r in [offsets[g], offsets[g + 1])
// (clamped to max_rows; rows past offsets[num_groups] untouched), a bf16 [max_rows, k], each w_g
// bf16 [n, k] row-major, c fp32 [max_rows, n]. One block row per non-empty group (grid rows beyond
// the last exit); no host synchronisation (graph-capturable).
struct Bf16MmaGroupedGemmParams {
  int32_t num_groups = 0;
  int32_t max_rows = 0;
  const int32_t* offsets = nullptr;          // device [num_groups + 1], non-decreasing, [0] = 0
  int64_t n = 0, k = 0;                      // k a multiple of 8
  const uint16_t* a = nullptr;               // 16-byte aligned
  const uint16_t* const* weights = nullptr;  // device [num_groups] pointers, 16-byte aligned
  float* c = nullptr;
  // Expected most rows in one group (0: unknown, max_rows): only the register tile (8, 16 or 32
  // rows a pass) depends on it; any group size stays correct.
  int32_t rows_per_group_hint = 0;
  // Warps that split k (their partial sums added in warp order): 0 picks them from the shape and
  // the busy groups (max_rows among them, so the split depends on the rows); a fixed 1, 2, 4 or 8
  // (at most half the 128-wide k blocks, or 1) keeps every row's sums the same at any row count.
  int32_t k_split = 0;
  // With all_rows (the other fields ignored then): the all-rows loop, each warp's 16 weight rows
  // of a k block loaded once for a pass of 32, 64 or 128 rows (by the hint) whose activation
  // fragments are staged in shared memory (64 or 128 KiB), where the register loop takes passes
  // of at most 32 rows, each loading every weight again: for large groups (prefill). With
  // rows_by_group (not with wide): the hint's row tile is the most a pass takes, a group with
  // fewer rows taking one pass of the fewest 8-row tiles (8, 16, 24 or 32 rows) that hold them.
  MmaTileOptions tile = kBf16GroupedMmaTile;
};

// Whether Bf16MmaGroupedGemm takes these arguments (rows_by_group not with the wide tile) and the
// device has the kernel.
bool Bf16MmaGroupedGemmSupports(const Bf16MmaGroupedGemmParams& p);
// cudaErrorInvalidValue (nothing launched) where Bf16MmaGroupedGemmSupports is false; max_rows 0
// launches nothing.
cudaError_t Bf16MmaGroupedGemm(const Bf16MmaGroupedGemmParams& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_BF16_MMA_GEMM_H_
