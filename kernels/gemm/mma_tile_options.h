// Launch-time variants of the tile loop that Fp8MmaGemm, Fp8MmaGroupedGemm, Mxfp4MmaGroupedGemm
// and Bf16MmaGroupedGemm share (mma_weight_tile.cuh). Each gives the same sums bit for bit at the
// same fixed k split (fp8_mma_gemm_test, mxfp4_mma_gemm_test, bf16_mma_gemm_test); with k_split 0
// `wide` may pick another split (the same products, the k-slices' partial sums added in another
// grouping: equal up to fp32 reordering). fp8_gemm_bench --variants and grouped_gemm_bench time
// them side by side.
#ifndef DEEPINFER_KERNELS_GEMM_MMA_TILE_OPTIONS_H_
#define DEEPINFER_KERNELS_GEMM_MMA_TILE_OPTIONS_H_

namespace deepinfer {
namespace kernels {

struct MmaTileOptions {
  // 32 weight rows a warp (two 16-row MMA tiles sharing each activation fragment), not 16.
  bool wide = false;
  // The block's activation fragments built once per k block in shared memory (32 KiB) and read by
  // all its warps, instead of each warp loading and permuting its own; where k-slices x 8-row
  // tiles exceed 16 the kernel reads them per warp as without it.
  bool shared_activations = false;
  // At most 128 registers a thread (spilling where the tile needs more), so that two 256-thread
  // blocks fit an SM.
  bool two_blocks_per_sm = false;
  // Fp8MmaGemm and Bf16MmaGroupedGemm (the others ignore it): each warp loads (and widens) its 16
  // weight rows once per k block and applies them to up to 128 activation rows (passes of 32, 64
  // or 128 rows by the rows, the activation fragments through shared memory), where the other
  // variants take passes of at most 32 rows, each loading every weight again. The other fields do
  // not apply to it.
  bool all_rows = false;
  // Bf16MmaGroupedGemm's register loop with the narrow tile (the others ignore it; not with wide):
  // each pass of a group takes the fewest 8-row tiles that hold the group's rows left, up to the
  // row hint's (8, 16, 24 or 32 rows), instead of the hint's for every pass, so that a group with
  // fewer rows than the hint does no MMAs and activation staging for rows it does not have; with
  // shared_activations each phase stages twice the k blocks (64 KiB: half the barriers).
  bool rows_by_group = false;
};

// The grouped kernels' tile (Fp8MmaGroupedGemmParams::tile, Mxfp4MmaGroupedGemmParams::tile):
// wide + shared_activations + two_blocks_per_sm, the fastest FP8 variant at every routed-expert
// shape of fp8_gemm_bench --variants (H200: Moonlight gate_up at 1 / 8 / 16 rows an expert 73 /
// 136 / 221 us against 94 / 249 / 375 for the plain register loop).
constexpr MmaTileOptions kGroupedMmaTile{true, true, true};

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_MMA_TILE_OPTIONS_H_
