// MLA prefill in the non-absorbed (multi-head) form on bf16 tensor cores, what vLLM / SGLang run
// for prefill: each cached key's normalised latent is expanded once through kv_b into per-head
// K_nope and V, and the queries attend with ordinary causal attention of width nope + rope (192
// for DeepSeek-V3) over values of width v (128), instead of the absorbed form's 576 / 512 per
// key. Per query token at L visible keys: 2 * heads * L * (nope + rope + v) FLOPs, plus once per
// key 2 * heads * latent * (nope + v) for the expansion; the absorbed form spends 2 * heads * L *
// (latent + rope + latent) per query token, so this form wins once a sequence brings more than a
// few hundred new tokens (docs/cuda/prefill.md has the measured crossover).
//
// Per group of sequences (the workspace holds one group's keys):
//   gather   each sequence's cached entries 0 .. context_len - 1 (latent | rope key) into a
//            contiguous bf16 [keys, latent + rope] buffer (widened / kept bf16 from the cache),
//            one launch for the group;
//   expand   KV = latent . kv_b^T, one GEMM with bf16 output: [keys, heads * (nope + v)],
//            head h's K_nope at columns h * (nope + v) .., its V after (the caller's
//            MhaPrefillParams::expand_gemm, e.g. cuBLASLt with a timed algorithm, else
//            cublasGemmEx);
//   attend   flash attention (mma.sync m16n8k16 bf16, ldmatrix, cp.async, online softmax in
//            exp2): a block takes 128 (or 64: MhaFlashKernel) query tokens of one (sequence,
//            head) and streams the sequence's keys in tiles of 64 (K = K_nope | the shared rope
//            key, V).
// Precision: q, the expanded K / V and P are rounded to bf16, every sum is fp32.
#ifndef DEEPINFER_KERNELS_ATTENTION_MHA_PREFILL_H_
#define DEEPINFER_KERNELS_ATTENTION_MHA_PREFILL_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace deepinfer {
namespace kernels {

// One sequence of the batch, described on the host: its query rows are tokens first_token ..
// first_token + num_tokens - 1 of q / out, at positions context_len - num_tokens ..
// context_len - 1; row `seq` of block_tables holds its blocks; the query at position p sees keys
// 0..p. The cache must already hold every position 0 .. context_len - 1 (this step's included).
struct MhaPrefillSequence {
  int32_t seq = 0;
  int32_t first_token = 0;
  int32_t num_tokens = 0;
  int32_t context_len = 0;
};

// The flash kernel's tiling. kRows64: a block of 4 warps takes 64 query rows (16 per warp) and
// streams 64-key tiles, double-buffered. kRows128: 4 warps take 128 rows (32 per warp, so each
// K / V fragment read from shared memory feeds two MMAs); a warp skips the key tiles past its
// own last row; single K and V buffers of 64 keys loaded alternately (FlashAttention-2's
// pipeline). kAuto: kRows128 for a group of sequences whose new tokens fill 128-row tiles about
// as well as 64-row ones (padded rows at 128 within 1/8 of those at 64), else kRows64. kRows128
// on a device that cannot run it falls back to kRows64. The forced kernels are for tests.
enum class MhaFlashKernel { kAuto, kRows64, kRows128 };

// The expansion GEMM of one workspace group, row-major: kv[keys, kv_width] = entries[keys,
// 0 .. latent_dim - 1] . kv_b[kv_width, latent_dim]^T, bf16 operands and output, fp32
// accumulation. Strides in elements: entries_stride = latent_dim + rope_dim, kv_b's latent_dim,
// kv's kv_width.
struct MhaExpandGemm {
  int64_t keys = 0;
  int64_t kv_width = 0;  // heads * (nope_dim + v_dim)
  int64_t latent_dim = 0;
  const uint16_t* entries = nullptr;
  int64_t entries_stride = 0;
  const uint16_t* kv_b = nullptr;
  uint16_t* kv = nullptr;
};

// Runs g on `stream` (in order with the op's other work; no host synchronisation inside graph
// capture). Returns cudaSuccess when it ran it, cudaErrorNotSupported to leave it to
// MhaPrefillBf16's cublasGemmEx (nothing launched), any other error to fail the op.
using MhaExpandGemmFn = std::function<cudaError_t(const MhaExpandGemm& g, cudaStream_t stream)>;

// Default soft cap on the workspace (MhaPrefillParams::workspace_budget).
inline constexpr size_t kMhaDefaultWorkspaceBudget = size_t{256} << 20;

struct MhaPrefillParams {
  int32_t num_heads = 0;
  int32_t nope_dim = 0;  // qk_nope_head_dim (128)
  int32_t v_dim = 0;     // v_head_dim (128)
  // Queries, fp32: head h of token t at q + t * q_token_stride + h * q_head_stride, nope_dim
  // values then rope_dim (already rotated).
  const float* q = nullptr;
  int64_t q_token_stride = 0;
  int64_t q_head_stride = 0;
  // Paged latent cache: entry t of block b at cache + (b * block_size + t) * (latent_dim +
  // rope_dim) elements (bf16 bits when cache_bf16, else fp32), the normalised latent first.
  const void* cache = nullptr;
  bool cache_bf16 = true;
  int32_t block_size = 0;
  int32_t latent_dim = 0;                 // kv_lora_rank (512)
  int32_t rope_dim = 0;                   // qk_rope_head_dim (64)
  const int32_t* block_tables = nullptr;  // device [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  // kv_b_proj, bf16 bits, [heads * (nope_dim + v_dim), latent_dim] row-major (checkpoint layout).
  const uint16_t* kv_b = nullptr;
  const MhaPrefillSequence* sequences = nullptr;  // HOST array
  int32_t num_sequences = 0;
  float softmax_scale = 1.0f;
  // Output [tokens, heads * v_dim] at row stride out_token_stride: fp32 (out) or bf16 bits
  // (out_bf16, a GEMM operand), exactly one of the two; rows of other tokens untouched.
  float* out = nullptr;
  uint16_t* out_bf16 = nullptr;
  int64_t out_token_stride = 0;
  // At least MhaPrefillWorkspaceBytes(params) bytes.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  MhaFlashKernel flash = MhaFlashKernel::kAuto;
  // Benchmarks only: gather and expand, but skip the attention (out is not written).
  bool expand_only = false;
  // Optional: the expansion GEMM (see MhaExpandGemmFn); empty: cublasGemmEx with its default
  // algorithm.
  MhaExpandGemmFn expand_gemm;
  // Soft cap on the workspace in bytes (0: kMhaDefaultWorkspaceBudget): the sequences are split
  // into as few groups of about equal key counts as keep each group's gathered entries and
  // expanded K_nope | V (9344 bytes a key at 16 heads) under it; a group has at least one
  // sequence and at most 64.
  size_t workspace_budget = 0;
};

// Whether MhaPrefillBf16 takes these params on the current device: nope_dim 128, v_dim 128,
// rope_dim 64, latent_dim a multiple of 8, 16-byte aligned q / cache / kv_b with strides that
// keep it, an out stride even, and sm_80+ code in the build with enough opt-in shared memory.
bool MhaPrefillSupported(const MhaPrefillParams& params);

// Bytes of workspace MhaPrefillBf16 needs for these params (0 for invalid params).
size_t MhaPrefillWorkspaceBytes(const MhaPrefillParams& params);

// Runs the attention of every sequence of params.sequences on `stream` (the cuBLAS handle is set
// to that stream). cudaErrorInvalidValue for params MhaPrefillSupported refuses, a sequence with
// num_tokens outside 1 .. context_len, or a workspace too small; when the cuBLAS call fails,
// cudaErrorUnknown and its status in *blas_status (when not null).
cudaError_t MhaPrefillBf16(const MhaPrefillParams& params, cublasHandle_t blas, cudaStream_t stream,
                           cublasStatus_t* blas_status = nullptr);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_ATTENTION_MHA_PREFILL_H_
