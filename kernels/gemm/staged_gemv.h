// GEMV for a few activation rows (decode at batch 1..4) whose activation is staged once per block
// in shared memory as bf16, optionally produced there by a prologue: the residual add and RMS
// norm that would otherwise be a kernel of its own (AddRmsNormF32) before the GEMV. Up to
// kStagedGemvMaxTargets weight matrices that read the same activation (q_proj and kv_a_proj)
// run as one launch over their concatenated rows; one matrix may also run as a batch of products
// with their own activations (DeepSeek-V4's grouped o_a). Each warp owns whole weight rows, read
// in passes of up to 8 16-byte chunks a lane, and keeps two passes in flight (each loaded as soon
// as the one two ahead of it has been multiplied); the grid is at most two blocks per SM, every
// warp looping over its rows, so the activation is staged by few blocks and all of the matrix's
// loads are issued early.
#ifndef DEEPINFER_KERNELS_GEMM_STAGED_GEMV_H_
#define DEEPINFER_KERNELS_GEMM_STAGED_GEMV_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

inline constexpr int kStagedGemvMaxRows = 4;
inline constexpr int kStagedGemvMaxTargets = 4;
// The staged activation (m rows of k bf16 values) must fit in this much shared memory.
// (64 KiB: 4 rows of DeepSeek-V3's hidden size 7168; two blocks still fit an SM.)
inline constexpr int kStagedGemvMaxActivationBytes = 64 * 1024;

// How the staged activation is made.
enum class StagedGemvPrologue {
  // act = bf16(a): fp32 rows rounded to nearest even (as RoundF32ToBf16), or bf16 rows as they are.
  kCopy,
  // When y is not null, x += y (written once, by the last block to stage the activation); act =
  // bf16(RmsNorm(x) * norm_weight), the same arithmetic in the same order as AddRmsNormF32, so
  // act is bit for bit the out_bf16 that AddRmsNormF32 writes. x rows are contiguous (ld = k).
  kAddRmsNorm,
};

// c_t[i, j] (+)= sum_p act[i, p] * w_t[j, p] for every target t, i < m, j < n_t, p < k; products
// exact (bf16 x bf16), sums in fp32, each row's sum in a fixed order (deterministic).
struct StagedGemvTarget {
  int64_t n = 0;
  const uint16_t* w = nullptr;  // bf16 bits, rows of ldw elements
  int64_t ldw = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;
  // StagedGemvParams::fp8: the weight is w8 instead (e4m3 bytes, rows of ldw bytes) with fp32
  // block scales (fp8_block_gemm.h's layout: one per 128 x 128 block, scale rows scale_ld apart,
  // stacked at split_rows, 0: one grid).
  const uint8_t* w8 = nullptr;
  const float* scales = nullptr;
  int64_t scale_ld = 0;
  int64_t split_rows = 0;
};

struct StagedGemvParams {
  int64_t m = 0, k = 0;
  StagedGemvPrologue prologue = StagedGemvPrologue::kCopy;
  // kCopy: the activation rows.
  const void* a = nullptr;
  bool a_bf16 = false;
  int64_t lda = 0;
  // kAddRmsNorm: the residual rows (updated in place when y is not null), the rows added to it,
  // the norm's weight (k values) and epsilon, and a device counter that must be 0 before the
  // launch (the kernel leaves it 0; needed when y is not null; launches on one stream may share
  // one counter).
  float* x = nullptr;
  const float* y = nullptr;
  const float* norm_weight = nullptr;
  float eps = 0.0f;
  unsigned int* counter = nullptr;
  int num_targets = 0;
  StagedGemvTarget targets[kStagedGemvMaxTargets];
  // Every target FP8 (StagedGemvTarget::w8): a lane loads 16 weights (16 bytes) at a time, whose
  // exact products with the staged bf16 activation are summed in fp32, multiplied by their
  // block's scale and added to the row's fp32 sum (as Fp8SmallMGemm). k a multiple of 16.
  bool fp8 = false;
  // kCopy, one bf16 target: `batch` products, product b reading the activation rows at
  // a + b * stride_a and the weights at targets[0].w + b * stride_w and writing
  // targets[0].c + b * stride_c (all in elements).
  int64_t batch = 1;
  int64_t stride_a = 0, stride_w = 0, stride_c = 0;
};

// The 16-byte chunks a lane loads per pass (1, 2, 4, 6 or 8) where a weight row (k / 8 chunks,
// FP8 k / 16) is read in the fewest passes of up to 8 chunks a lane.
int StagedGemvLaneChunks(const StagedGemvParams& p);

// Whether StagedGemvBf16 takes these arguments: 1 <= m <= kStagedGemvMaxRows, k a multiple of 8,
// m * k * 2 <= kStagedGemvMaxActivationBytes, 1..kStagedGemvMaxTargets targets each with n >= 1,
// 16-byte aligned weights with ldw >= k a multiple of 8, ldc >= n; kCopy: a (and lda, in bytes)
// 16-byte aligned, lda >= k; kAddRmsNorm: x and norm_weight set, and a counter when y is set.
// fp8: k and ldw multiples of 16, w8 and scales set, scale_ld >= ceil(k / 128), split_rows >= 0.
// batch > 1: kCopy, m = 1... 4, one bf16 target, batch <= 65535, stride_a 16-byte aligned,
// stride_w a multiple of 8.
bool StagedGemvSupports(const StagedGemvParams& p);

// Whether, for one activation row and one product, the staged GEMV measured faster on the H200
// than kernels::SmallMGemmBf16's kAuto choice (small_m_gemm_bench, back-to-back launches in a CUDA
// graph, docs/cuda/prefill.md): q_proj 3072 x 2048 4.96 vs 6.01 us, kv_a
// 576 x 2048 2.25 vs 2.46, shared gate_up 5632 x 2048 8.55 vs 11.11, shared down 2048 x 2816
// 5.09 vs 5.47, dense gate_up 22528 x 2048 26.73 vs 28.05; not for o_proj 2048 x 2048 (3.99 vs
// 3.69), dense down 2048 x 11264 (16.01 vs 15.99) or Moonlight's LM head 129280 x 2048 (132.86
// vs 131.97): 1024 <= k <= 4096 with n < 65536, and not 1024 < n <= 2048 with k <= 2048. Also
// DeepSeek-V4's o_b, 4096 x 8192 (n <= 4096 with 4096 < k <= 8192; small_m_gemm_bench v4: 19.49
// us against kSplitK's 20.45 in an earlier call of the same bench), and DeepSeek-V4's LM head,
// 129280 x 4096 (n >= 65536 with k = 4096, the one such k measured): 243.81 against kSplitK's
// 257.76 (cuBLAS 260.99).
bool StagedGemvPreferredAtOneRow(int64_t n, int64_t k);

// The same for two activation rows (the kCopy prologue; n: all targets' rows): where the staged
// GEMV measured faster than kernels::SmallMGemmBf16's kAuto choice on the H200
// (small_m_gemm_bench staged: back-to-back in a CUDA graph / after an 8.4 MB GEMV): o_proj 2048 x
// 2048 4.63 / 4.37 vs 5.98 / 5.74 us, q + kv_a 3648 x 2048 (one launch against two) 6.97 / 7.14 vs
// 10.01 / 9.75, 2816 x 2048 5.43 / 6.41 vs 6.54 / 6.30, 2048 x 2816 6.02 / 6.05 vs 7.87 / 7.67,
// 2048 x 1408 3.74 / 3.58 vs 4.76 / 4.63: 1024 <= k <= 2816 and 2048 <= n <= 4096 (above 4096
// columns the CUDA backend takes cuBLAS at two rows, not measured against this kernel).
bool StagedGemvPreferredAtTwoRows(int64_t n, int64_t k);

// Whether a batch of one-row products (m = 1; DeepSeek-V4's grouped o_a, 8 x 1024 x 4096) takes
// the staged GEMV's batch rather than kernels::SmallMGemmBf16's kAuto: 2 <= batch, 2048 <= k <=
// 8192, n * batch >= 4096 (small_m_gemm_bench v4 on the H200, "v4 o_a (8 groups)": o_a's 8
// groups in one staged launch 18.14 us against 23.40 on the small-m kernel's kRowPerGroup).
bool StagedGemvPreferredBatchedAtOneRow(int64_t batch, int64_t n, int64_t k);

// Returns cudaErrorInvalidValue (launching nothing) where StagedGemvSupports is false.
cudaError_t StagedGemvBf16(const StagedGemvParams& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_STAGED_GEMV_H_
