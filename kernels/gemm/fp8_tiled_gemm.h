// A tiled GEMM against FP8 block-scaled weights (fp8_block_gemm.h's layout) on bf16 tensor cores
// (mma.sync m16n8k16, sm_80+) for tens to a few hundred bf16 activation rows: c[m, n] (+)=
// a[m, k] * dequant(w)[n, k]^T, c fp32.
//
// A block of 8 warps computes a tile of BM activation rows (32, 64 or 128) x 128 weight rows over
// a range of 128-wide k blocks (one weight scale block in k). Each k block's weight tile (128 x
// 128 e4m3 bytes) and activation tile (BM x 128 bf16) are copied to shared memory with cp.async,
// four stages deep. The warps are tiled 2 (rows) x 4 (weights): a warp multiplies 32 weight rows by
// BM / 2 activation rows, so each weight fragment it widens feeds BM / 16 MMAs and each
// activation fragment two, and every staged weight byte is read by two warps, every activation
// by four. Weights are read from shared memory as bytes and widened to bf16 A fragments in
// registers (mma_weight_tile.cuh's WidenFp8x4: exact, every e4m3 value is a bf16 value); the
// activation fragments are read as 16-byte rows and paired in registers in the same k order
// (each thread's 8 contiguous k of a 32-k step as {(0, 2), (1, 3)} and {(4, 6), (5, 7)}, the
// order the widening gives), so no ldmatrix. The products are exact: each k block's MMAs sum in
// a fresh fp32 fragment, which is multiplied by its rows' block scales and added to the running
// fp32 sum (promotion per k block; scaling the widened weights instead would round them to bf16
// unless the scales are powers of two). Rows' scales are looked up per row, so stacked matrices
// ([gate; up] at any split_rows) need no alignment.
//
// k split: grid z splits the k blocks into k_split contiguous ranges of as equal a number of
// blocks as they divide (each range z of Z: blocks [z B / Z, (z + 1) B / Z)); with more than one,
// each range's sums go to a workspace ([k_split, m, n] fp32) and a second kernel adds them in range
// order onto c (deterministic; no atomics). The default split (Fp8TiledKSplit) depends on n and
// k only, and every output is summed in the same order whatever BM and m (its MMAs per k block,
// the blocks in order, the ranges in order): a row's bits do not depend on the other rows.
//
// Edges: rows past m and weight rows past n are zero-filled and not stored; k must be a multiple
// of 16 (the last k block may be partial: its missing 16-byte chunks are zero-filled). Activations
// are bf16 only (the callers round fp32 rows first). e4m3 NaN bytes (0x7F, 0xFF) read as +-480,
// not NaN, as in Fp8MmaGemm.
#ifndef DEEPINFER_KERNELS_GEMM_FP8_TILED_GEMM_H_
#define DEEPINFER_KERNELS_GEMM_FP8_TILED_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/gemm/fp8_block_gemm.h"

namespace deepinfer {
namespace kernels {

// The block row tiles Fp8TiledGemm has.
inline constexpr int32_t kFp8TiledBlockRows[] = {32, 64, 128};
// The largest k split it takes.
inline constexpr int32_t kFp8TiledMaxKSplit = 16;

// c[i, j] (+)= sum_p a[i, p] * w(j, p) * scale(j, p), i < m, j < n, p < k; a bf16 bits.
struct Fp8TiledGemmParams {
  int64_t m = 0, n = 0, k = 0;
  const uint16_t* a = nullptr;
  int64_t lda = 0;
  Fp8BlockWeight w;
  float* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;
  // Activation rows per block: 32, 64 or 128; 0: Fp8TiledBlockRows(m).
  int32_t block_rows = 0;
  // Contiguous k-block ranges summed apart (1..kFp8TiledMaxKSplit, at most the k blocks);
  // 0: Fp8TiledKSplit(n, k).
  int32_t k_split = 0;
  // Fp8TiledGemmWorkspaceBytes(*this) bytes of device memory where that is not 0.
  float* workspace = nullptr;
};

// The block row tile for m rows: 32 up to 32 rows, 64 up to 64, else 128.
int32_t Fp8TiledBlockRows(int64_t m);
// The k split for an [n, k] weight: enough (128-row tile, k range) blocks for about one per SM of
// a 132-SM GPU at one row tile, at least two k blocks a range, at most kFp8TiledMaxKSplit.
int32_t Fp8TiledKSplit(int64_t n, int64_t k);
// The k ranges p runs with: p.k_split, or Fp8TiledKSplit's where 0.
int32_t Fp8TiledRanges(const Fp8TiledGemmParams& p);
// Workspace bytes p needs: 0 at one range, else ranges * m * n floats.
size_t Fp8TiledGemmWorkspaceBytes(const Fp8TiledGemmParams& p);

// Whether Fp8TiledGemm takes p and the device has the kernel (sm_80+ code): m, n, k >= 1 in int
// range, k a multiple of 16, a and w.data 16-byte aligned with lda * 2 and ldw multiples of 16,
// lda, ldw >= k, ldc >= n, scale_ld >= Fp8ScaleCols(k), block_rows and k_split as above, the
// workspace where needed, non-null pointers.
bool Fp8TiledGemmSupports(const Fp8TiledGemmParams& p);
// cudaErrorInvalidValue (nothing launched) where Fp8TiledGemmSupports is false.
cudaError_t Fp8TiledGemm(const Fp8TiledGemmParams& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_FP8_TILED_GEMM_H_
