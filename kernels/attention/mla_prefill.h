// Absorbed MLA attention for prefill on bf16 tensor cores: the counterpart of MlaAttentionF32 for
// sequences with many new tokens. Absorbed MLA is multi-query attention with one shared key
// [latent | rope] (576 wide for DeepSeek-V3) and the latent as the value. Two implementations:
//
// Fused (MlaPrefillKernel::kFused; kAuto where measured faster): one flash-attention kernel
// (mma.sync bf16, fp32 accumulation, online softmax) per (sequence, tile of 64 query rows =
// tokens x heads, which all share the key); 64-key tiles stream from the paged bf16 cache with
// cp.async double buffering; scores and probabilities never leave the SM; no workspace.
// Supported: bf16 cache, latent 512, rope 64, an sm_90-class device (it needs 226 KiB of shared
// memory per block: the Q tile, two key tiles and P) and a build for sm_80+.
//
// cuBLAS (MlaPrefillKernel::kCublas, and the fallback for everything else): per sequence and
// chunk of queries two plain GEMMs (bf16 inputs, fp32 accumulation) around a causal softmax:
//   gather   the sequence's cached rows into a contiguous bf16 [L, latent + rope] buffer;
//   pack     the chunk's queries [tokens * heads, latent + rope] in bf16 (q_latent | q_rope);
//   S = scale * Q K^T  (fp32),  P = softmax over each row's visible keys, rounded to bf16;
//   O = P C  (C = the latent columns of the gathered rows), written straight into out_latent.
// Sequences next to each other with the same (new tokens, context) go through one strided-
// batched GEMM per chunk. Precision: q, the cached key/latent and P are rounded to bf16 (as HF's
// bf16 model does), every sum is fp32; docs/cuda/prefill.md gives the error bound the tests use.
#ifndef DEEPINFER_KERNELS_ATTENTION_MLA_PREFILL_H_
#define DEEPINFER_KERNELS_ATTENTION_MLA_PREFILL_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace deepinfer {
namespace kernels {

// Which implementation MlaPrefillBf16 runs (see the top of this file).
enum class MlaPrefillKernel {
  kAuto,    // kFused when MlaPrefillFusedSupported and every sequence has context_len <= 1024
            // and at least as many 64-row query tiles as 64-key tiles (where it was measured
            // faster on the H200), else kCublas; MlaPrefillUsesFused says which
  kCublas,  // gather + cuBLAS GEMMs + softmax (any latent / rope multiple of 8, fp32 or bf16 cache)
  kFused,   // the flash kernel; cudaErrorInvalidValue when not MlaPrefillFusedSupported
};

// Element type of the paged latent cache (fp32 today; bf16 bit patterns as uint16_t).
enum class MlaCacheDType { kFloat32, kBFloat16 };

// One sequence of the batch, described on the host. Its query rows are tokens first_token ..
// first_token + num_tokens - 1 of q_latent / out_latent, at positions context_len - num_tokens ..
// context_len - 1; row `seq` of block_tables holds its blocks. The query at position p sees keys
// 0..p (causal).
struct MlaPrefillSequence {
  int32_t seq = 0;
  int32_t first_token = 0;
  int32_t num_tokens = 0;
  int32_t context_len = 0;
};

struct MlaPrefillParams {
  int32_t num_heads = 0;
  const float* q_latent = nullptr;  // [tokens, heads, latent_dim]
  const float* q_rope = nullptr;    // (t, h, i) at q_rope[t*token_stride + h*head_stride + i]
  int64_t q_rope_token_stride = 0;
  int64_t q_rope_head_stride = 0;
  // Paged cache: entry t of block b at cache + (b*block_size + t) * (latent_dim + rope_dim)
  // elements of cache_dtype, the latent first.
  const void* cache = nullptr;
  MlaCacheDType cache_dtype = MlaCacheDType::kFloat32;
  int32_t block_size = 0;
  int32_t latent_dim = 0;
  int32_t rope_dim = 0;
  const int32_t* block_tables = nullptr;  // device [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  const MlaPrefillSequence* sequences = nullptr;  // HOST array
  int32_t num_sequences = 0;
  float softmax_scale = 1.0f;
  float* out_latent = nullptr;  // [tokens, heads, latent_dim]; rows of other tokens untouched
  // cuBLAS path: at least MlaPrefillWorkspaceBytes(params) bytes, or null: then MlaPrefillBf16
  // allocates it with cudaMallocAsync on the stream and frees it after the last use
  // (cudaFreeAsync). The fused kernel needs none.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // cuBLAS path: query rows (tokens * heads) per GEMM chunk; 0 = kMlaPrefillChunkRows. Smaller
  // chunks waste less on masked keys (each chunk's GEMMs stop at its last query's context).
  int32_t chunk_rows = 0;
  MlaPrefillKernel kernel = MlaPrefillKernel::kAuto;
};

constexpr int32_t kMlaPrefillChunkRows = 4096;

// Whether the fused kernel takes these params on the current device: bf16 cache, latent_dim 512,
// rope_dim 64, a 16-byte aligned cache, enough opt-in shared memory and sm_80+ code in the build.
bool MlaPrefillFusedSupported(const MlaPrefillParams& params);

// Whether MlaPrefillBf16 runs these (valid) params on the fused kernel (kAuto's choice).
bool MlaPrefillUsesFused(const MlaPrefillParams& params);

// Bytes of workspace MlaPrefillBf16 needs for these params (cuBLAS path: gathered keys, packed
// queries, scores and probabilities of one chunk; 0 when the fused kernel runs them).
size_t MlaPrefillWorkspaceBytes(const MlaPrefillParams& params);

// Runs the prefill attention of every sequence in params.sequences on `stream` (the cuBLAS
// handle is set to that stream; unused, may be null, when the fused kernel runs).
// cudaErrorInvalidValue for bad sizes (latent_dim or rope_dim not a multiple of 8, a sequence
// with num_tokens > context_len, a workspace too small, kFused on params it does not take); when
// a cuBLAS call fails, cudaErrorUnknown and its status in *blas_status (when not null).
cudaError_t MlaPrefillBf16(const MlaPrefillParams& params, cublasHandle_t blas, cudaStream_t stream,
                           cublasStatus_t* blas_status = nullptr);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_ATTENTION_MLA_PREFILL_H_
