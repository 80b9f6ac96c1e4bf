// GEMMs whose every output row is computed the same way whatever the number of rows and the
// row's place among them: the batch-invariant mode's dense GEMMs (CudaTuning::batch_invariant,
// docs/engine.md "Batch invariance"). Each output element is summed over k in an order fixed by
// the shapes (k, the dtypes), never by m or the row's place: the tensor-core kernel's row tiles,
// which it does pick by m, only change which rows a block computes, not how one row is summed.
// So a request's logits do not depend on which other requests share its batch.
#ifndef DEEPINFER_KERNELS_GEMM_BATCH_INVARIANT_GEMM_H_
#define DEEPINFER_KERNELS_GEMM_BATCH_INVARIANT_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// c_b[i, j] (+)= sum_p a_b[i, p] * w_b[j, p] for i < m, j < n, p < k and every product b of
// `batch` (a_b = a + b*stride_a, w_b = w + b*stride_w, c_b = c + b*stride_c, in elements). All
// pointers are device pointers; c is fp32; with accumulate, c + the sum is one fp32 addition.
struct BatchInvariantGemmParams {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  bool a_bf16 = false;  // a holds bf16 bits; else fp32
  int64_t lda = 0;
  const void* w = nullptr;
  bool w_bf16 = true;  // w holds bf16 bits; else fp32
  int64_t ldw = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_w = 0, stride_c = 0;
};

// Whether BatchInvariantGemmTc takes p: bf16 w, m, n, batch >= 1 and k >= 0 in int range (batch
// and n / 16 <= 65535; k = 0 writes zeros, or leaves c with accumulate), k a multiple of 8, a, w
// and their row and batch strides 16-byte aligned, ldc >= n, and the device has the kernel (sm_80+
// code). A property of the shapes and the layout, never of m alone.
bool BatchInvariantGemmTcSupports(const BatchInvariantGemmParams& p);

// bf16 tensor cores (mma.sync m16n8k16, fp32 accumulation): an fp32 a is rounded to bf16 to
// nearest even as it is read (as RoundF32ToBf16), so every product is exact. A block owns 16 or
// 32 output columns (32 where that still gives 256 blocks) and up to 32 rows; its 8 warps
// split k at fixed places (warp w: the 32-wide k steps w, w + 8, ...; each step's MMAs in one
// warp) and their partial sums are added in warp order. Up to 32 rows or few blocks (under about
// two waves): blocks tile m by 32 rows, the row blocks of one column tile launched one after
// another (its weights come from L2 after the first).
// More: 128 rows x 64 columns a block, k steps staged in shared memory, the 8 k partitions summed
// one after another with the same MMAs and added in the same order, so bit for bit the same
// outputs. The sum order of one output element is the same for every tile, row count and pass size.
// cudaErrorInvalidValue (nothing launched) where BatchInvariantGemmTcSupports is false.
cudaError_t BatchInvariantGemmTc(const BatchInvariantGemmParams& p, cudaStream_t stream);

// The k splits of BatchInvariantGemmPipelined for `batch` products of n x k weights: a function of
// the shape alone (never of m). Doubled from 1 (up to 8) while batch * ceil(n / 64) * splits < 128
// and every split keeps at least 4 of the ceil(k / 64) k steps.
int BatchInvariantGemmSplits(int64_t batch, int64_t n, int64_t k);

// Whether BatchInvariantGemmPipelined takes p: bf16 a and w, m, n, batch >= 1 and k >= 0 in int
// range (batch <= 65535), k a multiple of 8, a and w 16-byte aligned, lda, ldw, stride_a and
// stride_w multiples of 8, ldc >= n, and the device runs the kernel's sm_90 code in clusters of
// the shape's split count. A property of the shapes and the layout, never of m.
bool BatchInvariantGemmPipelinedSupports(const BatchInvariantGemmParams& p);

// A launch's tile for BatchInvariantGemmPipelined: rows (16, 32, 64 or 128) x columns (64 or
// 128); 0 picks it (up to 64 rows: the smallest row tile that holds m, and 128 columns where
// that gives at least 132 blocks, else 64; above 64 rows: 128 columns, and 128 rows where that
// gives at least 128 blocks, else 64). The tile never changes a bit of the outputs.
struct BatchInvariantGemmTile {
  int rows = 0;
  int columns = 0;
};

// bf16 tensor cores (mma.sync m16n8k16, fp32 accumulation), the weights as the MMA's 16-row side:
// k is cut into BatchInvariantGemmSplits(batch, n, k) contiguous ranges of 64-wide steps, each
// summed by one block from zero in increasing k through a multi-stage cp.async pipeline, and the
// splits' partial sums added in split order inside a thread-block cluster (distributed shared
// memory, no workspace); then c = the sum, or c + the sum. So each output's sum order is fixed by
// (batch, n, k) alone: any m, tile and row position give the same bits. Its bits differ from
// BatchInvariantGemmTc's (another order): a caller uses one of the two for a shape, never both.
// cudaErrorInvalidValue (nothing launched) where BatchInvariantGemmPipelinedSupports is false or
// the tile is not one of the kernel's.
cudaError_t BatchInvariantGemmPipelined(const BatchInvariantGemmParams& p, cudaStream_t stream,
                                        BatchInvariantGemmTile tile = {});

// Any layout and dtype (bf16 or fp32 a and w; an fp32 a against bf16 w is rounded to bf16 as in
// BatchInvariantGemmTc, against fp32 w used as it is): each output summed by one warp, lane l
// summing p = l, l + 32, ... in order, then a fixed butterfly across the warp; a warp computes
// one output, or with enough outputs a tile of 2 rows x 4 columns (the same sums, its loads
// shared). For fp32 weights
// (the router gate, the fp32 model) and layouts the tensor-core kernel does not take; slow for
// large GEMMs. cudaErrorInvalidValue for m, n, batch < 1 or k < 0, sizes beyond int range, or null
// pointers.
cudaError_t BatchInvariantGemmWarp(const BatchInvariantGemmParams& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_BATCH_INVARIANT_GEMM_H_
