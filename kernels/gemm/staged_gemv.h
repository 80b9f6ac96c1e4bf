// GEMV for a few activation rows (decode at batch 1..4) whose activation is staged once per block
// in shared memory as bf16, optionally produced there by a prologue: the residual add and RMS
// norm that would otherwise be a kernel of its own (AddRmsNormF32) before the GEMV. Up to
// kStagedGemvMaxTargets weight matrices that read the same activation (q_proj and kv_a_proj)
// run as one launch over their concatenated rows. Each warp owns whole weight rows and keeps two
// rows' 16-byte weight chunks in flight (the next row's loads issued before the current row is
// summed); the grid is at most two blocks per SM, every warp looping over its rows, so the
// activation is staged by few blocks and all of the matrix's loads are issued early. With
// StagedGemvWeights::kSharedMemory the rows wait in shared memory instead of registers: every
// row a block will use is copied in before the wait for the preceding kernel, so a matrix that
// fits is entirely in flight while that kernel still runs.
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

// Where a block's weight rows wait between their loads and their use (a performance choice only:
// both give the same bits).
enum class StagedGemvWeights {
  // In registers: two passes of each warp in flight (the first two loaded before the PDL wait).
  // 128 registers a thread, so two blocks fill an SM's register file and a following kernel's
  // blocks cannot start beside them.
  kRegisters,
  // In shared memory: every row of the block copied in with 16-byte cp.async before the PDL
  // wait (each lane copies the chunks it later reads), few registers, and the kAddRmsNorm
  // prologue with all its loads issued at once and the residual's write-back off the blocks'
  // path. Taken where StagedGemvSharedWeightsBytes fits kStagedGemvMaxSharedWeightsBytes on an
  // sm_80+ device; kRegisters otherwise.
  kSharedMemory,
};

// The most dynamic shared memory a block of the kSharedMemory layout may use (two blocks must
// fit an SM's 228 KiB).
inline constexpr int64_t kStagedGemvMaxSharedWeightsBytes = 108 * 1024;

// c_t[i, j] (+)= sum_p act[i, p] * w_t[j, p] for every target t, i < m, j < n_t, p < k; products
// exact (bf16 x bf16), sums in fp32, each row's sum in a fixed order (deterministic).
struct StagedGemvTarget {
  int64_t n = 0;
  const uint16_t* w = nullptr;  // bf16 bits, rows of ldw elements
  int64_t ldw = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;
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
  StagedGemvWeights weights = StagedGemvWeights::kRegisters;
};

// Whether StagedGemvBf16 takes these arguments: 1 <= m <= kStagedGemvMaxRows, k a multiple of 8,
// m * k * 2 <= kStagedGemvMaxActivationBytes, 1..kStagedGemvMaxTargets targets each with n >= 1,
// 16-byte aligned weights with ldw >= k a multiple of 8, ldc >= n; kCopy: a (and lda, in bytes)
// 16-byte aligned, lda >= k; kAddRmsNorm: x and norm_weight set, and a counter when y is set.
bool StagedGemvSupports(const StagedGemvParams& p);

// Whether, for one activation row and one product, the staged GEMV measured faster on the H200
// than kernels::SmallMGemmBf16's kAuto choice (small_m_gemm_bench, back-to-back launches in a
// CUDA graph, docs/kernels.md): q_proj 3072 x 2048 4.96 vs 6.01 us, kv_a 576 x 2048 2.25 vs
// 2.46, shared gate_up 5632 x 2048 8.55 vs 11.11, shared down 2048 x 2816 5.09 vs 5.47, dense
// gate_up 22528 x 2048 26.73 vs 28.05; not for o_proj 2048 x 2048 (3.99 vs 3.69), dense down
// 2048 x 11264 (16.01 vs 15.99) or the LM head 129280 x 2048 (132.86 vs 131.97): 1024 <= k <=
// 4096, n < 65536, and not 1024 < n <= 2048 with k <= 2048.
bool StagedGemvPreferredAtOneRow(int64_t n, int64_t k);

// The dynamic shared memory per block that the kSharedMemory layout needs for these arguments on
// a device with `sms` SMs (the staged activation, x + y for the write-back when it is small, and
// every weight row of a block); it is used where this is at most
// kStagedGemvMaxSharedWeightsBytes. Host-only.
int64_t StagedGemvSharedWeightsBytes(const StagedGemvParams& p, int sms);

// Whether, for one activation row and one product, the kSharedMemory layout is to be preferred
// to kernels::SmallMGemmBf16's kAuto choice (from small_m_gemm_bench on the H200; see
// docs/kernels.md). Host-only.
bool StagedGemvSharedPreferredAtOneRow(int64_t n, int64_t k);

// Returns cudaErrorInvalidValue (launching nothing) where StagedGemvSupports is false.
cudaError_t StagedGemvBf16(const StagedGemvParams& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_STAGED_GEMV_H_
