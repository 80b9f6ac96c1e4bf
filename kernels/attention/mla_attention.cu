// MLA attention, correctness-first version: one block per (token, head). The query (latent +
// rope, <= 1088 floats) sits in shared memory; keys are scored a chunk at a time (one warp per
// key, fp32 shuffle reduction), then an online softmax (running max and denominator, as in
// FlashAttention) rescales the per-thread latent accumulators. Context length is unbounded
// because nothing is kept per key beyond the current chunk.
#include <math.h>

#include "kernels/attention/mla_attention.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 32;  // keys scored per round
constexpr int kPerThread = kMaxMlaLatentDim / kThreads;

__global__ void WriteLatentCacheKernel(const float* latent, int64_t ld_latent,
                                       const float* rope_key, int64_t ld_rope, const int32_t* slots,
                                       PagedLatentCache cache) {
  const int64_t t = blockIdx.x;
  const int64_t entry = cache.latent_dim + cache.rope_dim;
  float* dst = cache.cache + static_cast<int64_t>(slots[t]) * entry;
  for (int64_t i = threadIdx.x; i < entry; i += blockDim.x) {
    dst[i] = i < cache.latent_dim ? latent[t * ld_latent + i]
                                  : rope_key[t * ld_rope + (i - cache.latent_dim)];
  }
}

__device__ __forceinline__ const float* Entry(const MlaAttentionParams& p, const int32_t* table,
                                              int64_t j) {
  const int64_t bs = p.cache.block_size;
  const int64_t entry = p.cache.latent_dim + p.cache.rope_dim;
  return p.cache.cache + (static_cast<int64_t>(table[j / bs]) * bs + j % bs) * entry;
}

__global__ void MlaAttentionKernel(MlaAttentionParams p) {
  extern __shared__ float smem[];
  const int latent = p.cache.latent_dim, rope = p.cache.rope_dim;
  float* q = smem;                      // [latent + rope]
  float* score = smem + latent + rope;  // [kChunk]
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const float* ql = p.q_latent + (t * p.num_heads + h) * latent;
  const float* qr = p.q_rope + t * p.q_rope_token_stride + h * p.q_rope_head_stride;
  for (int i = threadIdx.x; i < latent + rope; i += kThreads) {
    q[i] = i < latent ? ql[i] : qr[i - latent];
  }
  __syncthreads();

  const int32_t* table =
      p.block_tables + static_cast<int64_t>(p.token_seq[t]) * p.max_blocks_per_seq;
  const int64_t len = p.context_len[t];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float running_max = -INFINITY, denom = 0.0f;
  float acc[kPerThread];
#pragma unroll
  for (int c = 0; c < kPerThread; ++c) acc[c] = 0.0f;

  for (int64_t j0 = 0; j0 < len; j0 += kChunk) {
    const int n = static_cast<int>(len - j0 < kChunk ? len - j0 : kChunk);
    for (int jj = warp; jj < n; jj += kWarps) {
      const float* kv = Entry(p, table, j0 + jj);
      float dl = 0.0f, dr = 0.0f;
      for (int i = lane; i < latent; i += 32) dl += q[i] * kv[i];
      for (int i = lane; i < rope; i += 32) dr += q[latent + i] * kv[latent + i];
      for (int o = 16; o > 0; o >>= 1) {
        dl += __shfl_xor_sync(0xffffffffu, dl, o);
        dr += __shfl_xor_sync(0xffffffffu, dr, o);
      }
      if (lane == 0) score[jj] = (dl + dr) * p.softmax_scale;
    }
    __syncthreads();
    float chunk_max = running_max;
    for (int jj = 0; jj < n; ++jj) chunk_max = fmaxf(chunk_max, score[jj]);
    // exp(-inf - finite) = 0 on the first chunk, so the empty accumulators stay zero.
    const float rescale = expf(running_max - chunk_max);
    denom *= rescale;
#pragma unroll
    for (int c = 0; c < kPerThread; ++c) acc[c] *= rescale;
    for (int jj = 0; jj < n; ++jj) {
      const float pj = expf(score[jj] - chunk_max);
      denom += pj;
      const float* kv = Entry(p, table, j0 + jj);
#pragma unroll
      for (int c = 0; c < kPerThread; ++c) {
        const int i = threadIdx.x + c * kThreads;
        if (i < latent) acc[c] += pj * kv[i];
      }
    }
    running_max = chunk_max;
    __syncthreads();  // score[] is rewritten by the next chunk
  }
  float* out = p.out_latent + (t * p.num_heads + h) * latent;
#pragma unroll
  for (int c = 0; c < kPerThread; ++c) {
    const int i = threadIdx.x + c * kThreads;
    if (i < latent) out[i] = acc[c] / denom;
  }
}

}  // namespace

cudaError_t WriteLatentCacheF32(int64_t tokens, const float* latent, int64_t ld_latent,
                                const float* rope_key, int64_t ld_rope, const int32_t* slots,
                                const PagedLatentCache& cache, cudaStream_t stream) {
  if (tokens <= 0) return cudaSuccess;
  if (tokens > 0x7fffffff) return cudaErrorInvalidValue;
  WriteLatentCacheKernel<<<static_cast<unsigned>(tokens), 128, 0, stream>>>(
      latent, ld_latent, rope_key, ld_rope, slots, cache);
  return cudaGetLastError();
}

cudaError_t MlaAttentionF32(const MlaAttentionParams& params, cudaStream_t stream) {
  if (params.num_tokens <= 0 || params.num_heads <= 0) return cudaSuccess;
  if (params.cache.latent_dim <= 0 || params.cache.latent_dim > kMaxMlaLatentDim ||
      params.cache.rope_dim < 0 || params.num_heads > 65535) {
    return cudaErrorInvalidValue;
  }
  const size_t smem =
      (static_cast<size_t>(params.cache.latent_dim) + params.cache.rope_dim + kChunk) *
      sizeof(float);
  dim3 grid(static_cast<unsigned>(params.num_tokens), static_cast<unsigned>(params.num_heads));
  MlaAttentionKernel<<<grid, kThreads, smem, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace deepinfer
