// GEMMs against FP8 block-scaled weights (fp8_block_gemm.h's layout) on bf16 tensor cores (mma.sync
// m16n8k16, sm_80+), for a few to a few hundred activation rows: decode batches and the routed
// experts' rows. Each weight tile is read from memory and widened to bf16 in registers once per
// pass of up to 32 activation rows, or 128 with MmaTileOptions::all_rows (16 bytes per lane, no
// shared-memory staging of weights), which is exact (every e4m3 value is a bf16 value); activations
// are bf16 (fp32 rows rounded to nearest even as they are read). So the products are exact, as in
// Fp8SmallMGemm: the MMAs sum each 128-wide k block in fp32, the sum is multiplied by the weight
// block's scale and added to an fp32 accumulator, and warps that split k add their partial sums in
// warp order through shared memory (deterministic). Per 16 weights the widening costs about ten
// integer and bf16 instructions, against one FMA per weight and row on CUDA cores: from a few rows
// on the weights stream at memory speed where the CUDA-core kernel is bound by its FMAs and its
// activation re-reads (fp8_block_gemm_bench). e4m3 NaN bytes (0x7F, 0xFF) read as +-480 here, not
// NaN (checkpoints hold none).
#ifndef DEEPINFER_KERNELS_GEMM_FP8_MMA_GEMM_H_
#define DEEPINFER_KERNELS_GEMM_FP8_MMA_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/gemm/mma_tile_options.h"

namespace deepinfer {
namespace kernels {

// Whether this process has the tensor-core kernels for the current device (sm_80+ code; the
// compute_75 PTX fallback has no bf16 MMA). The Supports functions check it too.
bool Fp8MmaGemmAvailable();

// The dense kernel's tile for m rows: the plain register loop (16 weight rows a warp, activations
// per warp) at every m. On the H200 it was within noise of the best variant up to 16 rows
// (fp8_gemm_bench --variants), and MmaTileOptions::all_rows was slower above (Moonlight q_proj
// at 64 rows 27.0 us against 17.6; docs/performance.md, tried and rejected).
MmaTileOptions Fp8MmaDenseTile(int64_t m);

// c[i, j] (+)= sum_p bf16(a[i, p]) * w(j, p) * scale(j, p), i < m, j < n, p < k; a fp32 or (a_bf16)
// bf16 bits, c fp32. With accumulate, c[i, j] + the sum is one fp32 addition.
struct Fp8MmaGemmParams {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  bool a_bf16 = false;
  int64_t lda = 0;
  Fp8BlockWeight w;
  float* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;
  // Warps that split k (their partial sums added in warp order): 0 picks them from the shape
  // and the rows (more for few blocks, so the split depends on m); a fixed 1, 2, 4 or 8 (at most
  // half the 128-wide k blocks, or 1) keeps every row's sums the same at any m (the
  // batch-invariant mode), with any tile options.
  int32_t k_split = 0;
  MmaTileOptions tile;
};

// Whether Fp8MmaGemm takes these arguments and the device has the kernel (sm_80+ code): m, n, k
// >= 1 with m and n in int range, k a multiple of 16, w.data, w.ldw, a and lda 16-byte aligned
// (in bytes), ldc >= n, scale_ld >= Fp8ScaleCols(k), non-null pointers.
bool Fp8MmaGemmSupports(const Fp8MmaGemmParams& p);
// cudaErrorInvalidValue (nothing launched) where Fp8MmaGemmSupports is false.
cudaError_t Fp8MmaGemm(const Fp8MmaGemmParams& p, cudaStream_t stream);

// Rows of `a` grouped by expert with the groups' extents read on the device, as
// Fp8GroupedGemmParams (offsets[num_groups] <= max_rows; rows past it untouched): for group g,
// c[r, j] = sum_p a[r, p] * w_g(j, p) * scale_g(j, p) with a bf16 [max_rows, k] (the MoE
// permutation's bf16 rows), each w_g [n, k] contiguous with scale_ld and split_rows shared by all
// groups, c fp32 [max_rows, n]. One block row per non-empty group (grid rows beyond the last
// exit), so a decode step pays for its busy experts only; no host synchronisation.
struct Fp8MmaGroupedGemmParams {
  int32_t num_groups = 0;
  int32_t max_rows = 0;
  const int32_t* offsets = nullptr;  // device [num_groups + 1], non-decreasing, [0] = 0
  int64_t n = 0, k = 0;
  const uint16_t* a = nullptr;
  const uint8_t* const* weights = nullptr;  // device [num_groups] pointers, 16-byte aligned
  const float* const* scales = nullptr;     // device [num_groups] pointers
  int64_t scale_ld = 0;                     // >= Fp8ScaleCols(k)
  int64_t split_rows = 0;
  float* c = nullptr;
  // Expected most rows in one group (0: unknown, max_rows): only the register tile (8, 16 or 32
  // rows a pass) depends on it; any group size stays correct.
  int32_t rows_per_group_hint = 0;
  // As Fp8MmaGemmParams::k_split (0: picked from the shape and the busy groups).
  int32_t k_split = 0;
  MmaTileOptions tile = kGroupedMmaTile;
};

bool Fp8MmaGroupedGemmSupports(const Fp8MmaGroupedGemmParams& p);
cudaError_t Fp8MmaGroupedGemm(const Fp8MmaGroupedGemmParams& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_FP8_MMA_GEMM_H_
