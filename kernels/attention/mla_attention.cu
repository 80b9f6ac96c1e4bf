// MLA attention kernels.
//
// MlaAttentionF32: one block per (token, context split, group of kGroupHeads = 16 heads), so a
// cached key is read from memory once for 16 heads instead of once per head. Per chunk of
// kKeyChunk = 16 keys:
//   load     the chunk's [latent | rope] rows into shared memory with 16-byte cp.async (plain
//            loads when rows are not float4-aligned), double-buffered: chunk c + 1 is in
//            flight while chunk c is computed;
//   score    S[16 heads x 16 keys] = Q K^T: each half-warp owns a 4x4 (head x key) tile and
//            splits the dot products over its 16 lanes in float4 steps; a reduce-scatter of
//            the 16 partial sums leaves one finished score per lane;
//   softmax  online, per head (a half-warp each): running max, running denominator and the
//            factor that rescales the accumulated output, as in FlashAttention;
//   value    O[16 x latent] = alpha O + P V, the value being the latent itself; a thread owns
//            the columns tid + k*256 of all 16 heads in registers and reads P as float4
//            broadcasts.
// Decode (few tokens, long contexts) would leave most SMs idle, so the context is split over
// num_splits blocks; each writes its unnormalised output, max and denominator to a workspace and
// MlaCombineKernel (fewer than 8 splits) or MlaCombineWideKernel merges them (FlashDecoding).
// All accumulation is fp32.
//
// With a bf16 cache the same kernel widens each key to fp32 in shared memory (any shape), but
// DeepSeek's latent 512 + rope 64 goes to MlaBf16KeySplitKernel (FlashMLA's work split: each
// warp scores its own keys over the whole dot product; described at the kernel; 1.2x faster
// than MlaBf16MmaKernel at 64-256 decode tokens on the H200) and the other usual shapes
// (latent <= 512, latent + rope <= 640) to MlaBf16MmaKernel, which is not limited by fp32 FMA
// throughput. On the H200 MlaBf16MmaKernel reaches ~30-37% of HBM bandwidth for
// 128 x 1024 decode, bound by instruction issue, not by memory: ncu counts ~1,900 instructions
// per warp per 32-key chunk at 6.1 cycles each (2 warps per scheduler), and a block alone on
// the GPU still takes 5 us per chunk (docs/cuda.md). Per chunk of keys (bf16 rows in shared
// memory, double-buffered cp.async ring of 32-key chunks) the scores
// S[16 heads x 32 keys] = Q K^T and the update O[16 x latent] += P V run as bf16
// mma.sync.m16n8k16 with fp32 accumulation. Both fp32 operands (Q and P) are split into bf16
// hi + lo parts (x - hi is exactly representable to 8 more bits), so each product is
// x_hi*k + x_lo*k with a relative error of about 2^-17 instead of bf16's 2^-9, the keys being
// exact bf16 already: fp32-grade math at tensor-core speed. Warps split the 576-long score dot
// products (k-steps), sum them through shared memory in a fixed order, and then each runs the
// online softmax for all 16 heads itself and owns a quarter of the latent columns of O.
// Variants 8 and 9 of the key-split kernel (the kernel's default) drop the lo parts:
// bf16 Q and P, one MMA per product, as FlashMLA; 9 also merges 2-3 context splits inside a
// thread-block cluster instead of through the workspace and MlaCombineKernel (described at
// MlaBf16KeySplitKernel).
//
// MlaAttentionPerHeadF32, the plain fp32 kernel: one block per (token, head), keys scored one warp
// per key, online softmax rescaling per-thread latent accumulators.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <math.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "kernels/attention/mla_attention.h"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/common/kernel_facts.h"

namespace deepinfer {
namespace kernels {
namespace {

using sm80::CopyAsyncCommit;
using sm80::CopyAsyncWait;
using sm80::LdMatrixX4;
using sm80::MmaBf16;
using sm80::SharedAddr;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 32;  // keys scored per round
constexpr int kPerThread = kMaxMlaLatentDim / kThreads;

// Cache element <-> fp32.
__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void Store(float x, float* dst) { *dst = x; }
__device__ __forceinline__ void Store(float x, __nv_bfloat16* dst) {
  *dst = __float2bfloat16_rn(x);
}

template <typename T>
__global__ void WriteLatentCacheKernel(const float* latent, int64_t ld_latent,
                                       const float* rope_key, int64_t ld_rope, const int32_t* slots,
                                       PagedLatentCache cache) {
  const int64_t t = blockIdx.x;
  const int64_t entry = cache.latent_dim + cache.rope_dim;
  T* dst = static_cast<T*>(cache.cache) + static_cast<int64_t>(slots[t]) * entry;
  for (int64_t i = threadIdx.x; i < entry; i += blockDim.x) {
    Store(i < cache.latent_dim ? latent[t * ld_latent + i]
                               : rope_key[t * ld_rope + (i - cache.latent_dim)],
          dst + i);
  }
}

__device__ __forceinline__ const float* Entry(const MlaAttentionParams& p, const int32_t* table,
                                              int64_t j) {
  const int64_t bs = p.cache.block_size;
  const int64_t entry = p.cache.latent_dim + p.cache.rope_dim;
  return static_cast<const float*>(p.cache.cache) +
         (static_cast<int64_t>(table[j / bs]) * bs + j % bs) * entry;
}

__global__ void MlaAttentionPerHeadKernel(MlaAttentionParams p) {
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

// ---- Grouped-head kernel (MlaAttentionF32) ----

constexpr int kGroupHeads = 16;     // heads sharing each key load
constexpr int kKeyChunk = 16;       // keys per shared-memory chunk
constexpr int kGroupThreads = 256;  // = kGroupHeads * kKeyChunk: one softmax element per thread
constexpr int kTileSlices = 16;     // lanes splitting one 4x4 score tile's dot products
constexpr int kMaxColIters = kMaxMlaLatentDim / kGroupThreads;

// Shared memory: key row offsets [3][kKeyChunk] (int64; chunk c's in slot c % 3, computed two
// chunks ahead), then Q [16][d4], K [2][16][d4] (float4, rows zero-padded to a multiple of 4;
// chunk c + 1 is copied in with cp.async while chunk c is computed), scores [heads][keys],
// P [keys][heads], alpha/max/sum [heads]. Latent 512 + rope 64: 110.6 KB, two blocks per SM.
constexpr int kRowSlots = 3;
constexpr int kRowOffsetsFloat4 = kRowSlots * kKeyChunk * 8 / 16;
constexpr int kSmallFloats = 2 * kGroupHeads * kKeyChunk + 3 * kGroupHeads;

size_t GroupedSmemBytes(int dim) {
  const size_t d4 = (static_cast<size_t>(dim) + 3) / 4;
  return (kRowOffsetsFloat4 + (kGroupHeads + 2 * kKeyChunk) * d4) * sizeof(float4) +
         kSmallFloats * sizeof(float);
}

// 16-byte global -> shared copy that completes asynchronously (sm_80+; a plain copy on older
// targets, where the waits below are no-ops).
__device__ __forceinline__ void CopyAsync16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(src) : "memory");
#else
  *static_cast<float4*>(dst) = *static_cast<const float4*>(src);
#endif
}

// Sums part[i] and part[i + N] pairwise across lanes lane ^ N: afterwards part[0..N) holds,
// for this lane, the upper or lower half of the 2N values (upper when lane & N is set). After
// N = 8, 4, 2, 1 lane l of each half-warp holds the 16-lane total of value l % 16 in part[0].
template <int N>
__device__ __forceinline__ void ReduceScatterStep(float* part, int lane) {
  const bool upper = (lane & N) != 0;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float send = upper ? part[i] : part[i + N];
    const float keep = upper ? part[i + N] : part[i];
    part[i] = keep + __shfl_xor_sync(0xffffffffu, send, N);
  }
}

__device__ __forceinline__ int64_t KeyRowOffset(const MlaAttentionParams& p, const int32_t* table,
                                                int64_t j) {
  const int64_t bs = p.cache.block_size;
  return (static_cast<int64_t>(table[j / bs]) * bs + j % bs) *
         (p.cache.latent_dim + p.cache.rope_dim);
}

// Starts copying the 16 keys whose row offsets are in rows (-1: past the end, zero-filled) into
// dst [16][d4] and commits them as one copy group (empty for threads with nothing to copy).
// bf16 entries are widened to fp32 with plain loads (vec_loads is false for them).
template <typename T>
__device__ __forceinline__ void LoadKeyChunk(const MlaAttentionParams& p, const int64_t* rows,
                                             float4* dst, int d4, int dim, bool vec_loads) {
  int j = threadIdx.x / d4, f = threadIdx.x - j * d4;
  for (int i = threadIdx.x; i < kKeyChunk * d4; i += kGroupThreads) {
    const int64_t row = rows[j];
    const T* src = static_cast<const T*>(p.cache.cache) + row;
    if (row < 0) {
      dst[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // keys past the end: P V needs no mask
    } else if (vec_loads) {
      CopyAsync16(dst + i, reinterpret_cast<const float4*>(src) + f);
    } else {
      const int c = f * 4;
      float4 v = make_float4(ToFloat(src[c]), 0.0f, 0.0f, 0.0f);
      if (c + 1 < dim) v.y = ToFloat(src[c + 1]);
      if (c + 2 < dim) v.z = ToFloat(src[c + 2]);
      if (c + 3 < dim) v.w = ToFloat(src[c + 3]);
      dst[i] = v;
    }
    f += kGroupThreads;
    while (f >= d4) {
      f -= d4;
      ++j;
    }
  }
  CopyAsyncCommit();
}

// Sets [begin, end) to split `split`'s keys of token t's context: splits cover whole chunks of
// kChunkKeys keys, so trailing splits of a short context are empty. An empty split (only
// possible with num_splits > 1) writes the combine's "nothing here" marker (max -inf, sum 0)
// for its kHeads heads from h0 and returns true: the block has nothing else to do.
template <int kChunkKeys>
__device__ __forceinline__ void SplitRange(const MlaAttentionParams& p, int64_t t, int split,
                                           int num_splits, int64_t* begin, int64_t* end) {
  const int64_t len = p.context_len[t];
  const int64_t per_split = (len + num_splits - 1) / num_splits;
  const int64_t span = (per_split + kChunkKeys - 1) / kChunkKeys * kChunkKeys;
  *begin = split * span;
  *end = len < *begin + span ? len : *begin + span;
}

template <int kChunkKeys, int kHeads>
__device__ __forceinline__ bool SplitIsEmpty(const MlaAttentionParams& p, int64_t t, int split,
                                             int num_splits, int h0, float* ws_ml, int64_t* begin,
                                             int64_t* end) {
  SplitRange<kChunkKeys>(p, t, split, num_splits, begin, end);
  if (num_splits == 1 || *begin < *end) return false;
  if (threadIdx.x < kHeads && h0 + static_cast<int>(threadIdx.x) < p.num_heads) {
    float* ml = ws_ml + ((t * p.num_heads + h0 + threadIdx.x) * num_splits + split) * 2;
    ml[0] = -INFINITY;
    ml[1] = 0.0f;
  }
  return true;
}

// Block index = (token * num_splits + split) * num_groups + group: the head groups of one
// (token, split) run side by side and share its keys through L2.
// Two blocks per SM up to latent 512; wider latents need more shared memory than that leaves.
template <int kColIters, typename T>
__global__ void __launch_bounds__(kGroupThreads, kColIters <= 2 ? 2 : 1)
    MlaGroupedKernel(MlaAttentionParams p, int num_groups, int num_splits, bool vec_loads,
                     float* ws_out, float* ws_ml) {
  extern __shared__ float4 smem4[];
  const int latent = p.cache.latent_dim, dim = latent + p.cache.rope_dim;
  const int d4 = (dim + 3) / 4;
  int64_t* rows = reinterpret_cast<int64_t*>(smem4);
  float4* q4 = smem4 + kRowOffsetsFloat4;
  float4* kbuf = q4 + kGroupHeads * d4;                                // [2][16][d4]
  float* score = reinterpret_cast<float*>(kbuf + 2 * kKeyChunk * d4);  // [heads][keys]
  float* prob = score + kGroupHeads * kKeyChunk;                       // [keys][heads]
  float* alpha = prob + kKeyChunk * kGroupHeads;
  float* run_max = alpha + kGroupHeads;
  float* run_sum = run_max + kGroupHeads;

  const int tid = threadIdx.x;
  const int group = blockIdx.x % num_groups;
  const int split = (blockIdx.x / num_groups) % num_splits;
  const int64_t t = blockIdx.x / num_groups / num_splits;
  const int h0 = group * kGroupHeads;
  const int32_t* table =
      p.block_tables + static_cast<int64_t>(p.token_seq[t]) * p.max_blocks_per_seq;
  int64_t begin = 0, end = 0;
  if (SplitIsEmpty<kKeyChunk, kGroupHeads>(p, t, split, num_splits, h0, ws_ml, &begin, &end)) {
    return;
  }

  float* qf = reinterpret_cast<float*>(q4);
  for (int i = tid; i < kGroupHeads * d4 * 4; i += kGroupThreads) {
    const int hh = i / (d4 * 4), c = i - hh * (d4 * 4);
    const int64_t h = h0 + hh;
    float v = 0.0f;
    if (h < p.num_heads && c < dim) {
      v = c < latent
              ? p.q_latent[(t * p.num_heads + h) * latent + c]
              : p.q_rope[t * p.q_rope_token_stride + h * p.q_rope_head_stride + (c - latent)];
    }
    qf[i] = v;
  }
  if (tid < kGroupHeads) {
    run_max[tid] = -INFINITY;
    run_sum[tid] = 0.0f;
  }
  if (tid < 2 * kKeyChunk) {  // chunks 0 and 1
    rows[tid] = begin + tid < end ? KeyRowOffset(p, table, begin + tid) : -1;
  }

  float acc[kGroupHeads][kColIters];
#pragma unroll
  for (int h = 0; h < kGroupHeads; ++h) {
#pragma unroll
    for (int k = 0; k < kColIters; ++k) acc[h][k] = 0.0f;
  }

  const int warp = tid / 32, lane = tid % 32;
  const int tile = warp * 2 + lane / kTileSlices, slice = lane % kTileSlices;
  const int tile_head = (tile / 4) * 4, tile_key = (tile % 4) * 4;
  __syncthreads();  // Q, rows of chunks 0 and 1
  LoadKeyChunk<T>(p, rows, kbuf, d4, dim, vec_loads);
  int chunk = 0;
  for (int64_t j0 = begin; j0 < end; j0 += kKeyChunk, ++chunk) {
    const float4* k4 = kbuf + (chunk & 1) * kKeyChunk * d4;
    const bool has_next = j0 + kKeyChunk < end;
    // The other buffer was last read before the previous iteration's closing barrier.
    if (has_next) {
      LoadKeyChunk<T>(p, rows + ((chunk + 1) % kRowSlots) * kKeyChunk,
                      kbuf + ((chunk + 1) & 1) * kKeyChunk * d4, d4, dim, vec_loads);
    }
    if (tid < kKeyChunk) {  // two chunks ahead; that slot was last read two iterations ago
      const int64_t j = j0 + 2 * kKeyChunk + tid;
      rows[((chunk + 2) % kRowSlots) * kKeyChunk + tid] = j < end ? KeyRowOffset(p, table, j) : -1;
    }
    if (has_next) {
      CopyAsyncWait<1>();  // this chunk's copies (all but the newest group) have landed
    } else {
      CopyAsyncWait<0>();
    }
    __syncthreads();  // ... for every thread

    {  // Scores: this half-warp's 4 heads x 4 keys.
      float part[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) part[i] = 0.0f;
      for (int f = slice; f < d4; f += kTileSlices) {
        float4 qv[4], kv[4];
#pragma unroll
        for (int a = 0; a < 4; ++a) qv[a] = q4[(tile_head + a) * d4 + f];
#pragma unroll
        for (int b = 0; b < 4; ++b) kv[b] = k4[(tile_key + b) * d4 + f];
#pragma unroll
        for (int a = 0; a < 4; ++a) {
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            float x = part[a * 4 + b];
            x = fmaf(qv[a].x, kv[b].x, x);
            x = fmaf(qv[a].y, kv[b].y, x);
            x = fmaf(qv[a].z, kv[b].z, x);
            x = fmaf(qv[a].w, kv[b].w, x);
            part[a * 4 + b] = x;
          }
        }
      }
      ReduceScatterStep<8>(part, lane);
      ReduceScatterStep<4>(part, lane);
      ReduceScatterStep<2>(part, lane);
      ReduceScatterStep<1>(part, lane);
      const int h = tile_head + slice / 4, j = tile_key + slice % 4;
      score[h * kKeyChunk + j] = j0 + j < end ? part[0] * p.softmax_scale : -INFINITY;
    }
    __syncthreads();

    {  // Online softmax: head tid / 16, key tid % 16 (a half-warp per head).
      const int h = tid / kKeyChunk, j = tid % kKeyChunk;
      const float s = score[h * kKeyChunk + j];
      const float old_max = run_max[h];
      float mx = s;
#pragma unroll
      for (int o = kKeyChunk / 2; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      __syncwarp();  // every lane has read run_max[h] before lane j == 0 rewrites it
      const float new_max = fmaxf(old_max, mx);  // finite: every chunk has a key in range
      const float pj = expf(s - new_max);        // 0 for keys past the end
      float sum = pj;
#pragma unroll
      for (int o = kKeyChunk / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      prob[j * kGroupHeads + h] = pj;
      if (j == 0) {
        const float a = expf(old_max - new_max);  // 0 on the first chunk (old_max = -inf)
        alpha[h] = a;
        run_sum[h] = run_sum[h] * a + sum;
        run_max[h] = new_max;
      }
    }
    __syncthreads();

    {  // O = alpha O + P V over this chunk.
      float a[kGroupHeads];
#pragma unroll
      for (int h = 0; h < kGroupHeads; ++h) a[h] = alpha[h];
#pragma unroll
      for (int h = 0; h < kGroupHeads; ++h) {
#pragma unroll
        for (int k = 0; k < kColIters; ++k) acc[h][k] *= a[h];
      }
      const float* kf = reinterpret_cast<const float*>(k4);
#pragma unroll 4
      for (int j = 0; j < kKeyChunk; ++j) {
        const float4* pj4 = reinterpret_cast<const float4*>(prob + j * kGroupHeads);
        float pj[kGroupHeads];
#pragma unroll
        for (int q = 0; q < kGroupHeads / 4; ++q) {
          const float4 v = pj4[q];
          pj[4 * q] = v.x;
          pj[4 * q + 1] = v.y;
          pj[4 * q + 2] = v.z;
          pj[4 * q + 3] = v.w;
        }
#pragma unroll
        for (int k = 0; k < kColIters; ++k) {
          const int c = tid + k * kGroupThreads;
          const float v = c < latent ? kf[j * d4 * 4 + c] : 0.0f;
#pragma unroll
          for (int h = 0; h < kGroupHeads; ++h) acc[h][k] = fmaf(pj[h], v, acc[h][k]);
        }
      }
    }
    __syncthreads();  // this K buffer and P are rewritten next iteration
  }

  __syncthreads();  // run_sum is final (also when the loop ran zero times)
#pragma unroll
  for (int h = 0; h < kGroupHeads; ++h) {
    const int64_t head = h0 + h;
    if (head >= p.num_heads) break;
    const int64_t th = t * p.num_heads + head;
    if (num_splits == 1) {
      const float denom = run_sum[h];
#pragma unroll
      for (int k = 0; k < kColIters; ++k) {
        const int c = tid + k * kGroupThreads;
        if (c < latent) p.out_latent[th * latent + c] = acc[h][k] / denom;
      }
    } else {
      float* out = ws_out + (th * num_splits + split) * latent;
#pragma unroll
      for (int k = 0; k < kColIters; ++k) {
        const int c = tid + k * kGroupThreads;
        if (c < latent) out[c] = acc[h][k];
      }
      if (tid == 0) {
        float* ml = ws_ml + (th * num_splits + split) * 2;
        ml[0] = run_max[h];
        ml[1] = run_sum[h];
      }
    }
  }
}

// Warp 0 of a merge block: the weight w_s = exp(m_s - max m) of each split (ml: the splits'
// (m, l) pairs) into weight[], and sum_s w_s l_s into *denom.
__device__ __forceinline__ void SplitWeights(const float* ml, int num_splits, float* weight,
                                             float* denom) {
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < num_splits; s += 32) mx = fmaxf(mx, ml[2 * s]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.0f;
  for (int s = threadIdx.x; s < num_splits; s += 32) {
    // Empty splits (l = 0, m = -inf) get weight 0 without evaluating exp(-inf - -inf).
    const float w = ml[2 * s + 1] > 0.0f ? expf(ml[2 * s] - mx) : 0.0f;
    weight[s] = w;
    sum += w * ml[2 * s + 1];
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (threadIdx.x == 0) *denom = sum;
}

// One block per (token, head): out = sum_s w_s O_s / sum_s w_s l_s, w_s = exp(m_s - max m).
__global__ void MlaCombineKernel(const float* ws_out, const float* ws_ml, int num_splits,
                                 int latent, float* out) {
  __shared__ float weight[kMaxMlaSplits];
  __shared__ float denom;
  const int64_t th = blockIdx.x;
  const float* ml = ws_ml + th * num_splits * 2;
  if (threadIdx.x < 32) SplitWeights(ml, num_splits, weight, &denom);
  __syncthreads();
  const float* part = ws_out + th * num_splits * latent;
  for (int c = threadIdx.x; c < latent; c += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < num_splits; ++s) {
      if (weight[s] != 0.0f) acc = fmaf(weight[s], part[static_cast<int64_t>(s) * latent + c], acc);
    }
    out[th * latent + c] = acc / denom;
  }
}

// The same merge for many splits (kWideCombineMinSplits or more: few decode tokens): a block
// per (token x head, 32 columns), its 8 warps summing splits w, w + 8, ... of the lane's column.
// Every partial is loaded before the weights are needed, so those loads and the weights'
// overlap, and the 8 sums are added in warp order. MlaCombineKernel's block per (token x head)
// loads its splits one after another: at one decode token (16 blocks, 64 splits) that took
// 27.5 us of a 1 x 1024 call in a CUDA graph, this one 19 us (docs/cuda.md). With few splits
// (2-4: many tokens) most of this kernel's loads would be predicated off; MlaCombineKernel
// serves those.
constexpr int kWideCombineMinSplits = 8;
constexpr int kWideCombineRows = 8;
constexpr int kWideCombineCols = 32;
constexpr int kWideCombinePerThread = kMaxMlaSplits / kWideCombineRows;

__global__ void __launch_bounds__(kWideCombineRows* kWideCombineCols)
    MlaCombineWideKernel(const float* ws_out, const float* ws_ml, int num_splits, int latent,
                         float* out) {
  __shared__ float weight[kMaxMlaSplits];
  __shared__ float denom;
  __shared__ float row_sum[kWideCombineRows][kWideCombineCols];
  const int64_t th = blockIdx.x;
  const int row = threadIdx.x / kWideCombineCols, lane = threadIdx.x % kWideCombineCols;
  const int col = blockIdx.y * kWideCombineCols + lane;
  // Loads regardless of the split's weight (an empty split's partial is never written, so it
  // may be anything); weight 0 discards it below.
  float x[kWideCombinePerThread];
  const float* part = ws_out + th * num_splits * latent + col;
#pragma unroll
  for (int i = 0; i < kWideCombinePerThread; ++i) {
    const int s = row + i * kWideCombineRows;
    x[i] = s < num_splits && col < latent ? part[static_cast<int64_t>(s) * latent] : 0.0f;
  }
  if (threadIdx.x < 32) SplitWeights(ws_ml + th * num_splits * 2, num_splits, weight, &denom);
  __syncthreads();
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < kWideCombinePerThread; ++i) {
    const int s = row + i * kWideCombineRows;
    if (s < num_splits && weight[s] != 0.0f) acc = fmaf(weight[s], x[i], acc);
  }
  row_sum[row][lane] = acc;
  __syncthreads();
  if (row == 0 && col < latent) {
    float total = 0.0f;
#pragma unroll
    for (int r = 0; r < kWideCombineRows; ++r) total += row_sum[r][lane];
    out[th * latent + col] = total / denom;
  }
}

// ---- Tensor-core kernel for bf16 caches ----

constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = 32 * kMmaWarps;
constexpr int kMmaHeads = 16;                               // the M of m16n8k16: one head group
constexpr int kMmaMaxLatent = 512;                          // 4 warps x 16 n-tiles x 8 columns
constexpr int kMmaMaxDim = 640;                             // latent + rope, padded to 16
constexpr int kMmaMaxKSteps = kMmaMaxDim / 16 / kMmaWarps;  // score k-steps per warp

// Shared-memory row of one key in bf16 elements: the entry padded to whole k-steps (zeros),
// plus 8 so that the 8 rows an ldmatrix reads start in different bank groups.
__host__ __device__ __forceinline__ int MmaRowStride(int dim) { return (dim + 15) / 16 * 16 + 8; }

// Pipeline shape of the tensor-core kernel (mma_variant 4, the fallback of the key-split
// kernels): 32-key shared-memory chunks (4 score n-tiles, 2 P·V k-steps), double-buffered
// (kMmaStages - 1 chunks in flight while one is computed), shared memory sized for 2 blocks per
// SM. Its instruction count per chunk is the kernel's bound (docs/cuda.md; deeper rings and
// 16-key chunks, the removed variants 1-3, measured slower): each key row is copied by
// kMmaThreads / kMmaKeys threads at fixed offsets (no division or 64-bit address per 16-byte
// piece), and the softmax runs in base 2 (exp2f, log2 e folded into the score scale; the
// workspace's maxima are stored in natural-log units).
constexpr int kMmaKeys = 32;
constexpr int kMmaStages = 2;
constexpr int kMmaMinBlocks = 2;

// Partial-score rows: kKeys + 8 floats keeps a half-warp's float2 stores in distinct banks.
__host__ __device__ constexpr int MmaRedLd(int keys) { return keys + 8; }

// Row offsets [stages + 1][keys] (int64), keys [stages][keys][row stride] (bf16), partial scores
// [4][16][keys + 8] (fp32).
size_t MmaSmemBytes(int dim) {
  return static_cast<size_t>(kMmaStages + 1) * kMmaKeys * sizeof(int64_t) +
         static_cast<size_t>(kMmaStages) * kMmaKeys * MmaRowStride(dim) * sizeof(__nv_bfloat16) +
         static_cast<size_t>(kMmaWarps) * kMmaHeads * MmaRedLd(kMmaKeys) * sizeof(float);
}

__device__ __forceinline__ uint32_t Bf16x2Bits(__nv_bfloat162 v) {
  return *reinterpret_cast<uint32_t*>(&v);
}

// (a, b) as bf16 pairs hi + lo with a ~= hi.x + lo.x to about 2^-17 relative (a in the low half).
__device__ __forceinline__ void SplitBf16(float a, float b, uint32_t* hi, uint32_t* lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 hf = __bfloat1622float2(h);
  *hi = Bf16x2Bits(h);
  *lo = Bf16x2Bits(__floats2bfloat162_rn(a - hf.x, b - hf.y));
}

// Element c of head h's query [q_latent | q_rope] (0 past the entry or the last head).
__device__ __forceinline__ float QueryValue(const MlaAttentionParams& p, int64_t t, int h, int c,
                                            int latent, int dim) {
  if (h >= p.num_heads || c >= dim) return 0.0f;
  return c < latent ? p.q_latent[(t * p.num_heads + h) * latent + c]
                    : p.q_rope[t * p.q_rope_token_stride + h * p.q_rope_head_stride + (c - latent)];
}

// Starts copying the kKeys bf16 keys whose row offsets are in rows (-1: past the end, zeroed)
// into dst [kKeys][ld] and commits them as one copy group (empty when !any). vec_loads: 16-byte
// cp.async (rows are whole 16-byte pieces and the cache is 16-byte aligned), the 16-byte pieces
// of key row threadIdx / kPerRow copied by that row's kPerRow threads, piece threadIdx % kPerRow
// + k * kPerRow (fixed strides from one row lookup); else 2-byte loads.
template <int kKeys>
__device__ __forceinline__ void LoadKeyChunkBf16(const MlaAttentionParams& p, const int64_t* rows,
                                                 __nv_bfloat16* dst, int ld, int dim,
                                                 bool vec_loads, bool any) {
  static_assert(kMmaThreads % kKeys == 0, "whole threads per key row");
  constexpr int kPerRow = kMmaThreads / kKeys;
  const __nv_bfloat16* cache = static_cast<const __nv_bfloat16*>(p.cache.cache);
  if (!any) {
  } else if (vec_loads) {
    const int d8 = dim / 8, j = threadIdx.x / kPerRow, f0 = threadIdx.x % kPerRow;
    const int64_t row = rows[j];
    __nv_bfloat16* d = dst + j * ld + f0 * 8;
    if (row < 0) {
      for (int f = f0; f < d8; f += kPerRow, d += kPerRow * 8) {
        *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
      }
    } else {
      const __nv_bfloat16* src = cache + row + f0 * 8;
      for (int f = f0; f < d8; f += kPerRow, d += kPerRow * 8, src += kPerRow * 8) {
        CopyAsync16(d, src);
      }
    }
  } else {
    for (int i = threadIdx.x; i < kKeys * dim; i += kMmaThreads) {
      const int j = i / dim, c = i - j * dim;
      const int64_t row = rows[j];
      dst[j * ld + c] = row < 0 ? __float2bfloat16_rn(0.0f) : cache[row + c];
    }
  }
  CopyAsyncCommit();
}

// Block index = (token * num_splits + split) * num_groups + group, as MlaGroupedKernel. kNT:
// n-tiles of 8 latent columns per warp in P·V (even; latent <= 32 * kNT).
template <int kNT>
__global__ void __launch_bounds__(kMmaThreads, kMmaMinBlocks)
    MlaBf16MmaKernel(MlaAttentionParams p, int num_groups, int num_splits, bool vec_loads,
                     float* ws_out, float* ws_ml) {
  constexpr int kKeys = kMmaKeys;
  constexpr int kStages = kMmaStages;
  // Softmax exponent: base 2 with log2 e folded into the scale.
  const float score_scale = p.softmax_scale * 1.4426950408889634f;
  constexpr int kTiles = kKeys / 8;    // score n-tiles per chunk
  constexpr int kKSteps = kKeys / 16;  // P·V k-steps per chunk
  constexpr int kRedLd = MmaRedLd(kKeys);
  extern __shared__ float4 smem4[];
  const int latent = p.cache.latent_dim, dim = latent + p.cache.rope_dim;
  const int ksteps = (dim + 15) / 16;
  const int ld = MmaRowStride(dim);
  int64_t* rows = reinterpret_cast<int64_t*>(smem4);  // [kStages + 1][kKeys]: chunk c in c % (S+1)
  __nv_bfloat16* kbuf = reinterpret_cast<__nv_bfloat16*>(rows + (kStages + 1) * kKeys);
  float* red = reinterpret_cast<float*>(kbuf + kStages * kKeys * ld);  // [warps][16][kRedLd]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, tq = lane % 4;  // mma fragment coordinates: row group, pair in row
  const int group = blockIdx.x % num_groups;
  const int split = (blockIdx.x / num_groups) % num_splits;
  const int64_t t = blockIdx.x / num_groups / num_splits;
  const int h0 = group * kMmaHeads;
  const int32_t* table =
      p.block_tables + static_cast<int64_t>(p.token_seq[t]) * p.max_blocks_per_seq;
  int64_t begin = 0, end = 0;
  if (SplitIsEmpty<kKeys, kMmaHeads>(p, t, split, num_splits, h0, ws_ml, &begin, &end)) return;

  // This warp's score k-steps are warp, warp + 4, ...; their Q fragments (hi and lo) stay in
  // registers. Fragment register r: head g + 8 (r & 1), dims 2 tq + 8 (r >> 1) + {0, 1}.
  uint32_t qhi[kMmaMaxKSteps][4], qlo[kMmaMaxKSteps][4];
#pragma unroll
  for (int i = 0; i < kMmaMaxKSteps; ++i) {
    const int ks = warp + i * kMmaWarps;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int h = h0 + g + (r & 1) * 8, c = ks * 16 + 2 * tq + (r >> 1) * 8;
      float x0 = 0.0f, x1 = 0.0f;
      if (ks < ksteps) {
        x0 = QueryValue(p, t, h, c, latent, dim);
        x1 = QueryValue(p, t, h, c + 1, latent, dim);
      }
      SplitBf16(x0, x1, &qhi[i][r], &qlo[i][r]);
    }
  }
  // Zero the row padding of every key buffer once (copies never write it; the score k-steps
  // read it, and 0 * garbage could be NaN).
  const int pad = ld - dim;
  for (int i = tid; i < kStages * kKeys * pad; i += kMmaThreads) {
    const int row = i / pad;
    kbuf[row * ld + dim + (i - row * pad)] = __float2bfloat16_rn(0.0f);
  }
  for (int i = tid; i < kStages * kKeys; i += kMmaThreads) {  // chunks 0 .. kStages - 1
    rows[i] = begin + i < end ? KeyRowOffset(p, table, begin + i) : -1;
  }

  float acc[kNT][4];
#pragma unroll
  for (int n = 0; n < kNT; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
  }
  float run_max[2] = {-INFINITY, -INFINITY}, run_sum[2] = {0.0f, 0.0f};  // rows g, g + 8
  const int col0 = warp * kNT * 8;
  const int mat = lane / 8, mat_row = lane % 8;  // ldmatrix: which matrix / row this lane names

  __syncthreads();  // rows of the first kStages chunks, padding
  // Chunks 0 .. kStages - 2 in flight; one copy group per chunk (empty past the end), so that
  // "all but the newest kStages - 1 groups" is always "this chunk".
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) {
    LoadKeyChunkBf16<kKeys>(p, rows + c * kKeys, kbuf + c * kKeys * ld, ld, dim, vec_loads,
                            begin + c * kKeys < end);
  }
  int chunk = 0;
  for (int64_t j0 = begin; j0 < end; j0 += kKeys, ++chunk) {
    const __nv_bfloat16* kc = kbuf + (chunk % kStages) * kKeys * ld;
    {  // chunk + kStages - 1 into the buffer chunk - 1 used (read before the last closing barrier)
      const int ahead = chunk + kStages - 1;
      LoadKeyChunkBf16<kKeys>(p, rows + (ahead % (kStages + 1)) * kKeys,
                              kbuf + (ahead % kStages) * kKeys * ld, ld, dim, vec_loads,
                              j0 + (kStages - 1) * kKeys < end);
    }
    if (tid < kKeys) {  // rows one chunk further; that slot held chunk - 1's, long consumed
      const int64_t j = j0 + kStages * kKeys + tid;
      rows[((chunk + kStages) % (kStages + 1)) * kKeys + tid] =
          j < end ? KeyRowOffset(p, table, j) : -1;
    }
    CopyAsyncWait<kStages - 1>();  // this chunk's group has landed (for this thread) ...
    __syncthreads();               // ... and for every thread

    // Partial scores over this warp's k-steps: s[n] is the C fragment of keys 8n .. 8n + 7.
    float s[kTiles][4];
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kMmaMaxKSteps; ++i) {
      const int ks = warp + i * kMmaWarps;
      if (ks < ksteps) {
#pragma unroll
        for (int kp = 0; kp < kKSteps; ++kp) {
          // Matrices: keys 16 kp + 8 (mat >> 1) + 0..7, dims 16 ks + 8 (mat & 1) + 0..7.
          uint32_t b[4];
          LdMatrixX4<false>(
              b, kc + (kp * 16 + (mat >> 1) * 8 + mat_row) * ld + ks * 16 + (mat & 1) * 8);
          MmaBf16(s[2 * kp], qhi[i], b[0], b[1]);
          MmaBf16(s[2 * kp], qlo[i], b[0], b[1]);
          MmaBf16(s[2 * kp + 1], qhi[i], b[2], b[3]);
          MmaBf16(s[2 * kp + 1], qlo[i], b[2], b[3]);
        }
      }
    }
    float* mine = red + warp * kMmaHeads * kRedLd;
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
      *reinterpret_cast<float2*>(mine + g * kRedLd + n * 8 + 2 * tq) =
          make_float2(s[n][0], s[n][1]);
      *reinterpret_cast<float2*>(mine + (g + 8) * kRedLd + n * 8 + 2 * tq) =
          make_float2(s[n][2], s[n][3]);
    }
    __syncthreads();
    // Every warp sums the four partials in the same order, so all hold identical scores and
    // softmax state.
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float2 sum = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < kMmaWarps; ++w) {
          const float2 v = *reinterpret_cast<const float2*>(
              red + (w * kMmaHeads + g + half * 8) * kRedLd + n * 8 + 2 * tq);
          sum.x += v.x;
          sum.y += v.y;
        }
        s[n][2 * half] = sum.x;
        s[n][2 * half + 1] = sum.y;
      }
    }

    // Online softmax for rows g (e = 0, 1) and g + 8 (e = 2, 3); a row's keys are spread over
    // the 4 lanes of a quad.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = j0 + n * 8 + 2 * tq + (e & 1);
        const float v = key < end ? s[n][e] * score_scale : -INFINITY;
        s[n][e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
    }
    float alpha[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      mx[r] = fmaxf(run_max[r], mx[r]);  // finite: every chunk has a key in range
      // 0 on the first chunk (run_max = -inf)
      alpha[r] = exp2f(run_max[r] - mx[r]);
    }
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        // 0 for keys past the end
        s[n][e] = exp2f(s[n][e] - mx[e >> 1]);
        sum[e >> 1] += s[n][e];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
      run_sum[r] = run_sum[r] * alpha[r] + sum[r];
      run_max[r] = mx[r];
    }
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      acc[n][0] *= alpha[0];
      acc[n][1] *= alpha[0];
      acc[n][2] *= alpha[1];
      acc[n][3] *= alpha[1];
    }

    // P as A fragments (hi, lo) per 16-key k-step kk: the C fragments of score n-tiles 2 kk
    // and 2 kk + 1 are exactly the A fragment's four registers.
    uint32_t phi[kKSteps][4], plo[kKSteps][4];
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      SplitBf16(s[2 * kk][0], s[2 * kk][1], &phi[kk][0], &plo[kk][0]);
      SplitBf16(s[2 * kk][2], s[2 * kk][3], &phi[kk][1], &plo[kk][1]);
      SplitBf16(s[2 * kk + 1][0], s[2 * kk + 1][1], &phi[kk][2], &plo[kk][2]);
      SplitBf16(s[2 * kk + 1][2], s[2 * kk + 1][3], &phi[kk][3], &plo[kk][3]);
    }
    // O[16 x this warp's columns] += P V, V = the keys' latent part.
#pragma unroll
    for (int np = 0; np < kNT / 2; ++np) {
      const int c0 = col0 + np * 16;
      if (c0 < latent) {
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) {
          // Matrices: keys 16 kk + 8 (mat & 1) + 0..7, columns c0 + 8 (mat >> 1) + 0..7.
          uint32_t b[4];
          LdMatrixX4<true>(b, kc + (kk * 16 + (mat & 1) * 8 + mat_row) * ld + c0 + (mat >> 1) * 8);
          MmaBf16(acc[2 * np], phi[kk], b[0], b[1]);
          MmaBf16(acc[2 * np], plo[kk], b[0], b[1]);
          MmaBf16(acc[2 * np + 1], phi[kk], b[2], b[3]);
          MmaBf16(acc[2 * np + 1], plo[kk], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // this key buffer and the partial scores are rewritten next iteration
  }

#pragma unroll
  for (int n = 0; n < kNT; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = h0 + g + (e >> 1) * 8, c = col0 + n * 8 + 2 * tq + (e & 1);
      if (h >= p.num_heads || c >= latent) continue;
      const int64_t th = t * p.num_heads + h;
      if (num_splits == 1) {
        p.out_latent[th * latent + c] = acc[n][e] / run_sum[e >> 1];
      } else {
        ws_out[(th * num_splits + split) * latent + c] = acc[n][e];
      }
    }
  }
  if (num_splits > 1 && warp == 0 && tq == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = h0 + g + r * 8;
      if (h >= p.num_heads) continue;
      float* ml = ws_ml + ((t * p.num_heads + h) * num_splits + split) * 2;
      ml[0] = run_max[r] * 0.6931471805599453f;  // natural-log units
      ml[1] = run_sum[r];
    }
  }
}

// ---- Key-split tensor-core kernel (variants 7, 8 and 9): latent 512 + rope 64 ----
//
// The FlashMLA work split over mma.sync: one block of 4 warps per (token, context split, group
// of 16 heads), keys in tiles of kSplitKeys (32, two blocks per SM), double-buffered with
// cp.async, with a short start-up (below). (64-key tiles at one block per SM, and the start-up
// without its overlap, the removed variants 5 and 6, measured slower: docs/cuda.md.)
// Per tile:
//   score    warp w computes S[16 heads x its kSplitKeys / 4 keys] over the whole 576-deep dot
//            product (Q hi and lo fragments read from shared memory, where they were staged
//            once per block; independent accumulator chains per k-step parity and hi / lo), so
//            no partial scores are summed across warps;
//   softmax  each warp takes its keys' row maxima, the four warps exchange them through shared
//            memory (one barrier), and every warp applies the same tile maximum; each warp keeps
//            its own keys' part of the running denominator (summed across warps once, at the
//            end);
//   value    warp w's P goes to shared memory as its part of the bf16 hi / lo A fragments of
//            P·V (one barrier); every warp then owns 128 of the 512 output columns and
//            accumulates O[16 x 128] += P[16 x kSplitKeys] V[kSplitKeys x 128].
// Q and P enter the MMAs as bf16 hi + lo pairs as in MlaBf16MmaKernel (fp32-grade scores and
// weights; the cache's bf16 keys are exact).
constexpr int kSplitLatent = 512, kSplitRope = 64;
constexpr int kSplitKeys = 32;  // keys per tile
constexpr int kSplitDim = kSplitLatent + kSplitRope;
constexpr int kSplitKSteps = kSplitDim / 16;  // score k-steps (36)
constexpr int kSplitLd = kSplitDim + 8;       // bf16 row stride: ldmatrix rows in distinct banks
constexpr int kSplitRowThreads = 8;           // threads copying one key row (128 bytes a step)
constexpr int kSplitRowsPerPass = kMmaThreads / kSplitRowThreads;        // 16
constexpr int kSplitPiecesPerThread = kSplitDim / 8 / kSplitRowThreads;  // 9 16-byte pieces
constexpr int kSplitWarpCols = kSplitLatent / kMmaWarps;                 // 128 columns per warp
constexpr int kSplitNT = kSplitWarpCols / 8;                             // 16 output n-tiles
static_assert(kSplitDim % (8 * kSplitRowThreads) == 0, "whole 16-byte pieces per copying thread");
static_assert(kSplitKSteps % 2 == 0, "8-key warps load two score k-steps per ldmatrix");

// The kernel keeps the block-table entries of its split's keys in shared memory, up to
// kSplitTableSlots of them (a split needing more reads the table in global memory): at block
// size 16, 4096 keys.
constexpr int kSplitTableSlots = 256;
constexpr int kSplitTablePerThread = kSplitTableSlots / kMmaThreads;  // loads per thread: 2
static_assert(kSplitTableSlots % kMmaThreads == 0, "whole table loads per thread");

// Shared memory: Q fragments [k-step][hi, lo][lane] (uint4), keys [2][kSplitKeys][kSplitLd]
// (bf16), P fragments [P·V k-step][hi, lo][lane] (uint4), row maxima and row sums [warp][16]
// (fp32), and the block-table entries [kSplitTableSlots] (int32).
// With bf16 operands (variants 8 and 9) Q has no lo part: [k-step][lane] (half the bytes).
constexpr size_t SplitQBytes(bool bf16_ops) {
  return size_t{kSplitKSteps} * (bf16_ops ? 1 : 2) * 32 * sizeof(uint4);
}
constexpr size_t SplitSmemBytes(bool bf16_ops) {
  return SplitQBytes(bf16_ops) + size_t{2} * kSplitKeys * kSplitLd * sizeof(__nv_bfloat16) +
         static_cast<size_t>(kSplitKeys / 16) * 2 * 32 * sizeof(uint4) +
         2 * kMmaWarps * kMmaHeads * sizeof(float) + size_t{kSplitTableSlots} * sizeof(int32_t);
}
// Two blocks per SM on sm_90 (228 KB of shared memory per SM, 1 KB of it reserved per block):
// 112.5 KB. A third key buffer (3-stage ring) would take a block to 148 KB, one block per SM, so
// the kernel stays double-buffered.
static_assert(2 * (SplitSmemBytes(false) + 1024) <= 228 * 1024, "two blocks per SM");
static_assert(2 * (SplitSmemBytes(false) + kSplitKeys * kSplitLd * sizeof(__nv_bfloat16) + 1024) >
                  228 * 1024,
              "a 3-stage ring would not fit two blocks per SM (revisit the ring)");

// Starts copying the tile's key rows threadIdx / 8 + 16 k (row offsets rows[k]; -1: zeroed, so
// that P·V never multiplies garbage) into dst [kKeys][kSplitLd], 16-byte pieces threadIdx % 8 +
// 8 i of each, and commits them as one copy group.
template <int kRows>
__device__ __forceinline__ void LoadSplitTile(const __nv_bfloat16* cache,
                                              const int64_t (&rows)[kRows], __nv_bfloat16* dst) {
  const int r0 = threadIdx.x / kSplitRowThreads, f0 = threadIdx.x % kSplitRowThreads;
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    __nv_bfloat16* d = dst + (r0 + k * kSplitRowsPerPass) * kSplitLd + f0 * 8;
    if (rows[k] < 0) {
#pragma unroll
      for (int i = 0; i < kSplitPiecesPerThread; ++i) {
        *reinterpret_cast<uint4*>(d + i * 8 * kSplitRowThreads) = make_uint4(0u, 0u, 0u, 0u);
      }
    } else {
      const __nv_bfloat16* s = cache + rows[k] + f0 * 8;
#pragma unroll
      for (int i = 0; i < kSplitPiecesPerThread; ++i) {
        CopyAsync16(d + i * 8 * kSplitRowThreads, s + i * 8 * kSplitRowThreads);
      }
    }
  }
  CopyAsyncCommit();
}

// ---- The key-split kernel's start-up ----
//
// Q of one head group as fp32 float4s: element e = threadIdx + i * kMmaThreads of the
// [16 heads][144 float4] group, i < kSplitQLoads; dims 4 f .. 4 f + 3 of [latent | rope].
constexpr int kSplitQF4PerHead = kSplitDim / 4;                           // 144
constexpr int kSplitQLoads = kMmaHeads * kSplitQF4PerHead / kMmaThreads;  // 18 per thread
static_assert(kMmaHeads * kSplitQF4PerHead % kMmaThreads == 0, "whole Q loads per thread");
static_assert(kSplitLatent % 4 == 0, "a float4 of Q lies in the latent or in the rope part");

// Issues all of this thread's Q loads (nothing waits for them here): 16-byte loads where the
// query pointers and strides allow (q_vec), else four 4-byte loads; heads past num_heads are 0.
__device__ __forceinline__ void LoadQueryF4(const MlaAttentionParams& p, int64_t t, int h0,
                                            bool q_vec, float4 (&q)[kSplitQLoads]) {
#pragma unroll
  for (int i = 0; i < kSplitQLoads; ++i) {
    const int e = threadIdx.x + i * kMmaThreads;
    const int hl = e / kSplitQF4PerHead, f = e - hl * kSplitQF4PerHead, h = h0 + hl;
    q[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (h >= p.num_heads) continue;
    if (4 * f < kSplitLatent) {  // q_latent rows are whole float4s when q_vec
      const float* src = p.q_latent + (t * p.num_heads + h) * kSplitLatent + 4 * f;
      q[i] = q_vec ? *reinterpret_cast<const float4*>(src)
                   : make_float4(src[0], src[1], src[2], src[3]);
    } else {
      const float* src =
          p.q_rope + t * p.q_rope_token_stride + h * p.q_rope_head_stride + (4 * f - kSplitLatent);
      q[i] = q_vec ? *reinterpret_cast<const float4*>(src)
                   : make_float4(src[0], src[1], src[2], src[3]);
    }
  }
}

// Writes the loaded Q as the A fragments of the score MMAs, hi and lo:
// qf[(ks * 2 + lo) * 32 + lane] register r holds head
// g + 8 (r & 1), dims 16 ks + 2 tq + 8 (r >> 1) + {0, 1} (lane = 4 g + tq). A float4 at dim c
// is two such pairs: (c, c + 1) at tq = (c % 8) / 2 and (c + 2, c + 3) at the next tq.
// kBf16Ops: only the hi (round-to-nearest-even) part, at qf[ks * 32 + lane].
template <bool kBf16Ops>
__device__ __forceinline__ void StoreQueryFragments(const float4 (&q)[kSplitQLoads], uint4* qf) {
  uint32_t* words = reinterpret_cast<uint32_t*>(qf);
#pragma unroll
  for (int i = 0; i < kSplitQLoads; ++i) {
    const int e = threadIdx.x + i * kMmaThreads;
    const int hl = e / kSplitQF4PerHead, c = 4 * (e - hl * kSplitQF4PerHead);
    const int ks = c / 16, o = c % 16;
    const int r = hl / 8 + 2 * (o / 8), lane = (hl % 8) * 4 + (o % 8) / 2;
    if constexpr (kBf16Ops) {
      words[(ks * 32 + lane) * 4 + r] = Bf16x2Bits(__floats2bfloat162_rn(q[i].x, q[i].y));
      words[(ks * 32 + lane + 1) * 4 + r] = Bf16x2Bits(__floats2bfloat162_rn(q[i].z, q[i].w));
    } else {
      uint32_t hi[2], lo[2];
      SplitBf16(q[i].x, q[i].y, &hi[0], &lo[0]);
      SplitBf16(q[i].z, q[i].w, &hi[1], &lo[1]);
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        words[((ks * 2) * 32 + lane + k) * 4 + r] = hi[k];
        words[((ks * 2 + 1) * 32 + lane + k) * 4 + r] = lo[k];
      }
    }
  }
}

// Where the key-split kernel finds the block-table entries of its split: table entries first_block
// .. first_block + kSplitTableSlots - 1 in shared memory (stab) when in_smem, else the table
// itself.
struct SplitTable {
  const int32_t* table;  // the token's row of block_tables (global)
  const int32_t* stab;   // shared copy of entries first_block ...
  int32_t first_block;
  bool in_smem;
};

// Copies the table entries of keys [begin, end) into stab when they fit (one round of
// kSplitTablePerThread independent loads per thread). The caller syncs before stab is read.
__device__ __forceinline__ SplitTable PrefetchSplitTable(const MlaAttentionParams& p,
                                                         const int32_t* table, int32_t* stab,
                                                         int32_t begin, int32_t end) {
  const int32_t bs = p.cache.block_size;
  SplitTable st{table, stab, begin / bs, false};
  const int32_t n = (end - 1) / bs - st.first_block + 1;
  st.in_smem = n <= kSplitTableSlots;
  if (st.in_smem) {
    int32_t v[kSplitTablePerThread];
#pragma unroll
    for (int k = 0; k < kSplitTablePerThread; ++k) {
      const int32_t i = threadIdx.x + k * kMmaThreads;
      v[k] = i < n ? table[st.first_block + i] : 0;
    }
#pragma unroll
    for (int k = 0; k < kSplitTablePerThread; ++k) {
      const int32_t i = threadIdx.x + k * kMmaThreads;
      if (i < n) stab[i] = v[k];
    }
  }
  return st;
}

// Cache offset of key j (< 2^31: context lengths are int32) of the split, -1 at or past end:
// 32-bit index math and, when the table is in shared memory, no global load.
__device__ __forceinline__ int64_t SplitRowOrNone(const MlaAttentionParams& p, const SplitTable& st,
                                                  int32_t j, int32_t end) {
  if (j >= end) return -1;
  const int32_t bs = p.cache.block_size;
  const int32_t b = j / bs, o = j - b * bs;
  const int32_t block = st.in_smem ? st.stab[b - st.first_block] : st.table[b];
  return (static_cast<int64_t>(block) * bs + o) * kSplitDim;
}

// ---- Variant 9's split merge (kClusterMerge) ----
//
// The largest cluster (= split count) variant 9 merges in distributed shared memory; more
// splits run variant 8 and the combine kernels. Measured on the H200 (docs/cuda.md): clusters
// of 2 and 3 beat variant 8's workspace + combine, clusters of 4 lost to it (64 x 1024, 4
// splits: 50.3 vs 36.5 us in a graph). The merge itself takes up to 8 (the portable size).
constexpr int kMaxClusterSplits = 8;
static_assert(kMlaClusterMergeMaxSplits >= 2 && kMlaClusterMergeMaxSplits <= kMaxClusterSplits,
              "the cluster merge's split range");
// Row stride (floats) of a block's partial O in shared memory: rows 16-byte aligned for the
// merge's float4 reads, and the fragment stores' rows g = 0..7 in different banks.
constexpr int kMergeLd = kSplitLatent + 8;
constexpr size_t kMergeFloats =
    size_t{kMmaHeads} * kMergeLd + kMmaHeads * 2 + kMmaHeads * kMaxClusterSplits + kMmaHeads;
static_assert(kMergeFloats * sizeof(float) <= size_t{2} * 32 * kSplitLd * sizeof(__nv_bfloat16),
              "the merge's buffers fit in the key tiles' shared memory");
static_assert(kMergeLd % 4 == 0, "float4 rows");

// The end of a variant 9 block (split `split` of a cluster of num_splits): this block's
// unnormalised O (acc: warp w's columns 128 w ..., the mma C-fragment layout), its row maxima
// (log2 units) and denominators go to shared memory (buf: the key tiles' space, free now);
// after a cluster barrier the block merges its slice of the output columns from every block
// of the cluster: out = sum_s w_s O_s / sum_s w_s l_s, w_s = 2^(m_s - max m), weight 0 for an
// empty split (l = 0). A second barrier keeps every block's shared memory alive until all
// have read it.
__device__ __forceinline__ void ClusterMergeSplits(const MlaAttentionParams& p, int64_t t, int h0,
                                                   int split, int num_splits,
                                                   const float (&acc)[kSplitNT][4],
                                                   const float (&run_max)[2],
                                                   const float (&total)[2], float* buf) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
  float* part_o = buf;                                     // [16][kMergeLd]
  float* part_ml = part_o + kMmaHeads * kMergeLd;          // [16][2]: max (log2), sum
  float* merge_w = part_ml + kMmaHeads * 2;                // [16][kMaxClusterSplits]
  float* denom = merge_w + kMmaHeads * kMaxClusterSplits;  // [16]
  CopyAsyncWait<0>();  // no copy group may still write the key tiles (all are empty by now)
#pragma unroll
  for (int n = 0; n < kSplitNT; ++n) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      *reinterpret_cast<float2*>(part_o + (g + 8 * r) * kMergeLd + warp * kSplitWarpCols + n * 8 +
                                 2 * tq) = make_float2(acc[n][2 * r], acc[n][2 * r + 1]);
    }
  }
  if (warp == 0 && tq == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      part_ml[2 * (g + 8 * r)] = run_max[r];
      part_ml[2 * (g + 8 * r) + 1] = total[r];
    }
  }
  cluster.sync();  // every block's partial is complete and visible to the cluster
  if (tid < kMmaHeads) {
    const int h = tid;
    float m[kMaxClusterSplits], l[kMaxClusterSplits];
    float mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      m[s] = -INFINITY;
      l[s] = 0.0f;
      if (s < num_splits) {
        const float* remote = cluster.map_shared_rank(part_ml, s);
        m[s] = remote[2 * h];
        l[s] = remote[2 * h + 1];
        if (l[s] > 0.0f) mx = fmaxf(mx, m[s]);
      }
    }
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      // Empty splits (l = 0, m = -inf) get weight 0 without evaluating 2^(-inf - -inf).
      const float w = l[s] > 0.0f ? exp2f(m[s] - mx) : 0.0f;
      merge_w[h * kMaxClusterSplits + s] = w;
      sum = fmaf(w, l[s], sum);
    }
    denom[h] = sum;  // > 0: split 0 always holds key 0
  }
  __syncthreads();
  // This block's float4 columns [c4_begin, c4_begin + n4) of the 16 heads.
  constexpr int kCols4 = kSplitLatent / 4;
  const int per_block = (kCols4 + num_splits - 1) / num_splits;
  const int c4_begin = split * per_block;
  const int n4 = c4_begin >= kCols4 ? 0 : min(per_block, kCols4 - c4_begin);
  for (int i = tid; i < kMmaHeads * n4; i += kMmaThreads) {
    const int h = i / n4, c4 = c4_begin + i % n4;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = 0; s < num_splits; ++s) {
      const float w = merge_w[h * kMaxClusterSplits + s];
      const float4 x =
          reinterpret_cast<const float4*>(cluster.map_shared_rank(part_o, s) + h * kMergeLd)[c4];
      o.x = fmaf(w, x.x, o.x);
      o.y = fmaf(w, x.y, o.y);
      o.z = fmaf(w, x.z, o.z);
      o.w = fmaf(w, x.w, o.w);
    }
    if (h0 + h < p.num_heads) {
      const float d = denom[h];
      reinterpret_cast<float4*>(p.out_latent + (t * p.num_heads + h0 + h) * kSplitLatent)[c4] =
          make_float4(o.x / d, o.y / d, o.z / d, o.w / d);
    }
  }
  cluster.sync();  // no block leaves while others read its shared memory
#endif             // __CUDA_ARCH__ >= 900
}

// Block index = (token * num_splits + split) * num_groups + group, as MlaGroupedKernel. Needs a
// 16-byte aligned cache (vec_loads is implied; PlanGrouped checks it). The start-up takes few
// dependent steps: all of Q's fp32 loads are issued first
// (16-byte loads), the split's block-table entries are copied into shared memory in one round,
// tiles 0 and 1 are both put in flight, and only then is Q converted into its fragments (so the
// conversion overlaps the key copies); tile row offsets come from the shared table with 32-bit
// index math.
//
// kBf16Ops (variants 8 and 9): Q and P enter the MMAs as plain bf16 (round to nearest even),
// one MMA per product instead of hi + lo (as FlashMLA / FlashInfer): half the score and P·V
// MMAs and half of Q's shared-memory reads; the scores' four accumulator chains are the k-step
// modulo 4. Scores then carry Q's bf16 rounding (2^-9 relative per element) and the output P's.
//
// kClusterMerge (variant 9, 2 <= num_splits <= kMlaClusterMergeMaxSplits, sm_90): the num_splits
// blocks of one (token, head group) are a thread-block cluster (block index = (token *
// num_groups + group) * num_splits + split, split = the block's cluster rank); instead of
// writing partials to a workspace for MlaCombineKernel, each block leaves its unnormalised O
// and (max, sum) in its shared memory, and after a cluster barrier block r merges output
// columns [r, r + 1) * 512 / num_splits of every block's partial through distributed shared
// memory (the FlashDecoding merge, as MlaDecodeSmall's). An empty split takes part with max
// -inf and sum 0 (weight 0).
template <bool kBf16Ops = false, bool kClusterMerge = false>
__global__ void __launch_bounds__(kMmaThreads, 2)
    MlaBf16KeySplitKernel(MlaAttentionParams p, int num_groups, int num_splits, bool /*vec_loads*/,
                          float* ws_out, float* ws_ml) {
  constexpr int kKeys = kSplitKeys;
  constexpr int kWarpKeys = kKeys / kMmaWarps;      // keys scored per warp: 8
  constexpr int kWarpTiles = kWarpKeys / 8;         // their score n-tiles: 1
  constexpr int kPvSteps = kKeys / 16;              // P·V k-steps per tile
  constexpr int kRows = kKeys / kSplitRowsPerPass;  // key rows each thread copies
  constexpr int kQParts = kBf16Ops ? 1 : 2;         // Q and P: hi (+ lo)
  static_assert(kWarpTiles == 1, "one score n-tile per warp");
  static_assert(!kClusterMerge || kBf16Ops, "variant 9 is variant 8 with the cluster merge");
  extern __shared__ float4 smem4[];
  uint4* qf = reinterpret_cast<uint4*>(smem4);
  __nv_bfloat16* kbuf = reinterpret_cast<__nv_bfloat16*>(qf + kSplitKSteps * kQParts * 32);
  uint4* pf = reinterpret_cast<uint4*>(kbuf + 2 * kKeys * kSplitLd);  // 16-byte aligned
  float* red_max = reinterpret_cast<float*>(pf + kPvSteps * 2 * 32);
  float* red_sum = red_max + kMmaWarps * kMmaHeads;
  int32_t* stab = reinterpret_cast<int32_t*>(red_sum + kMmaWarps * kMmaHeads);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, tq = lane % 4;  // mma fragment coordinates: row group, pair in row
  // Cluster merge: the splits of one (token, group) are consecutive blocks (one cluster).
  const int group =
      kClusterMerge ? (blockIdx.x / num_splits) % num_groups : blockIdx.x % num_groups;
  const int split =
      kClusterMerge ? blockIdx.x % num_splits : (blockIdx.x / num_groups) % num_splits;
  const int64_t t = blockIdx.x / num_groups / num_splits;
  const int h0 = group * kMmaHeads;
  float4 q4[kSplitQLoads];
  {
    // First, so that these loads are in flight with the token's sequence and length loads.
    const uintptr_t q_bases =
        reinterpret_cast<uintptr_t>(p.q_latent) | reinterpret_cast<uintptr_t>(p.q_rope);
    const bool q_vec =
        q_bases % 16 == 0 && p.q_rope_token_stride % 4 == 0 && p.q_rope_head_stride % 4 == 0;
    LoadQueryF4(p, t, h0, q_vec, q4);
  }
  const int32_t* table =
      p.block_tables + static_cast<int64_t>(p.token_seq[t]) * p.max_blocks_per_seq;
  int64_t begin = 0, end = 0;
  if constexpr (kClusterMerge) {
    // No early exit: every block of the cluster takes part in the merge (an empty split runs
    // no tile and leaves max -inf, sum 0). ws_ml is null here.
    SplitRange<kKeys>(p, t, split, num_splits, &begin, &end);
  } else if (SplitIsEmpty<kKeys, kMmaHeads>(p, t, split, num_splits, h0, ws_ml, &begin, &end)) {
    return;
  }
  const __nv_bfloat16* cache = static_cast<const __nv_bfloat16*>(p.cache.cache);
  // Base-2 softmax: log2 e folded into the scale; the workspace's maxima in natural-log units.
  const float score_scale = p.softmax_scale * 1.4426950408889634f;

  const int my_row = tid / kSplitRowThreads;
  int64_t rows[kRows];
  SplitTable st{};
  // The row offsets of the tile starting at key j0 into rows[].
  auto tile_rows = [&](int64_t j0) {
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int64_t j = j0 + my_row + k * kSplitRowsPerPass;
      rows[k] =
          SplitRowOrNone(p, st, static_cast<int32_t>(j < end ? j : end), static_cast<int32_t>(end));
    }
  };
  // The split's table entries into shared memory (one round of loads), then tiles 0 and 1 in
  // flight (two copy groups; the second empty when the split has one tile) before Q's
  // conversion; rows[] then holds tile 2's row offsets (two tiles ahead, see the loop).
  st = PrefetchSplitTable(p, table, stab, static_cast<int32_t>(begin), static_cast<int32_t>(end));
  __syncthreads();
  tile_rows(begin);
  LoadSplitTile(cache, rows, kbuf);
  if (begin + kKeys < end) {
    tile_rows(begin + kKeys);
    LoadSplitTile(cache, rows, kbuf + kKeys * kSplitLd);
    tile_rows(begin + 2 * kKeys);
  } else {
    CopyAsyncCommit();
  }
  StoreQueryFragments<kBf16Ops>(q4, qf);  // published by the loop's first barrier

  float acc[kSplitNT][4];
#pragma unroll
  for (int n = 0; n < kSplitNT; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
  }
  // Rows g and g + 8: the running maximum (the same in every warp) and this lane's part of the
  // running denominator (its keys only).
  float run_max[2] = {-INFINITY, -INFINITY}, part_sum[2] = {0.0f, 0.0f};
  const int mat = lane / 8, mat_row = lane % 8;  // ldmatrix: which matrix / row this lane names
  const int key0 = warp * kWarpKeys, col0 = warp * kSplitWarpCols;

  int tile = 0;
  for (int64_t j0 = begin; j0 < end; j0 += kKeys, ++tile) {
    // Tile 0: tile 1's group (committed after tile 0's) may stay in flight.
    if (tile == 0) {
      CopyAsyncWait<1>();
    } else {
      CopyAsyncWait<0>();  // this tile's copies (the only group in flight) have landed ...
    }
    __syncthreads();  // ... for every thread, and every warp is done with the previous tile
    const __nv_bfloat16* kc = kbuf + (tile & 1) * kKeys * kSplitLd;
    // The next tile into the buffer the previous one used (tile 1 is in flight already, so
    // from tile 1 on, and rows[] holds tile + 1's offsets then).
    if (tile > 0 && j0 + kKeys < end) {
      LoadSplitTile(cache, rows, kbuf + ((tile + 1) & 1) * kKeys * kSplitLd);
      tile_rows(j0 + 2 * kKeys);
    }

    // S[16 x this warp's keys]: sc[(ks & 1) * 2 + lo][n] for n-tile n (keys 8n .. 8n + 7), so
    // that 4 kWarpTiles independent MMA chains are in flight.
    float sc[4][kWarpTiles][4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int n = 0; n < kWarpTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[c][n][e] = 0.0f;
      }
    }
#pragma unroll
    for (int ks2 = 0; ks2 < kSplitKSteps; ks2 += 2) {
      uint32_t b[2][2];  // [k-step ks2 + i]: b0, b1 of the warp's n-tile (8 keys)
      {
        // Matrices: keys key0 + 0..7, dims 16 ks2 + 8 mat + 0..7 (k-steps ks2 and ks2 + 1).
        uint32_t r[4];
        LdMatrixX4<false>(r, kc + (key0 + mat_row) * kSplitLd + ks2 * 16 + mat * 8);
        b[0][0] = r[0];
        b[0][1] = r[1];
        b[1][0] = r[2];
        b[1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int ks = ks2 + i;
        if constexpr (kBf16Ops) {
          const uint4 qh4 = qf[ks * 32 + lane];
          const uint32_t qh[4] = {qh4.x, qh4.y, qh4.z, qh4.w};
#pragma unroll
          for (int n = 0; n < kWarpTiles; ++n) {
            MmaBf16(sc[ks & 3][n], qh, b[i][2 * n], b[i][2 * n + 1]);
          }
        } else {
          const uint4 qh4 = qf[(ks * 2) * 32 + lane], ql4 = qf[(ks * 2 + 1) * 32 + lane];
          const uint32_t qh[4] = {qh4.x, qh4.y, qh4.z, qh4.w};
          const uint32_t ql[4] = {ql4.x, ql4.y, ql4.z, ql4.w};
#pragma unroll
          for (int n = 0; n < kWarpTiles; ++n) {
            MmaBf16(sc[i * 2][n], qh, b[i][2 * n], b[i][2 * n + 1]);
            MmaBf16(sc[i * 2 + 1][n], ql, b[i][2 * n], b[i][2 * n + 1]);
          }
        }
      }
    }
    float s[kWarpTiles][4], mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kWarpTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = j0 + key0 + n * 8 + 2 * tq + (e & 1);
        const float v = (sc[0][n][e] + sc[2][n][e]) + (sc[1][n][e] + sc[3][n][e]);
        s[n][e] = key < end ? v * score_scale : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
    if (tq == 0) {
      red_max[warp * kMmaHeads + g] = mx[0];  // -inf when all this warp's keys are past the end
      red_max[warp * kMmaHeads + g + 8] = mx[1];
    }
    __syncthreads();
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = run_max[r];
#pragma unroll
      for (int w = 0; w < kMmaWarps; ++w) m = fmaxf(m, red_max[w * kMmaHeads + g + 8 * r]);
      alpha[r] = exp2f(run_max[r] - m);  // 0 on the first tile (run_max = -inf); m is finite
      run_max[r] = m;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < kWarpTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2f(s[n][e] - run_max[e >> 1]);  // 0 for keys past the end
        sum[e >> 1] += s[n][e];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      part_sum[r] = part_sum[r] * alpha[r] + sum[r];
    }
    // P·V k-step kk's A fragment (keys 16 kk .. 16 kk + 15): registers 0, 1 are the C fragment
    // of keys 16 kk + 0..7, registers 2, 3 that of keys 16 kk + 8..15; this warp's n-tile n
    // holds keys key0 + 8 n.
#pragma unroll
    for (int n = 0; n < kWarpTiles; ++n) {
      const int kk = (key0 + 8 * n) / 16, half = ((key0 + 8 * n) / 8) % 2;
      if constexpr (kBf16Ops) {
        const uint2 hi = make_uint2(Bf16x2Bits(__floats2bfloat162_rn(s[n][0], s[n][1])),
                                    Bf16x2Bits(__floats2bfloat162_rn(s[n][2], s[n][3])));
        reinterpret_cast<uint2*>(pf + kk * 32 + lane)[half] = hi;
      } else {
        uint2 hi, lo;
        SplitBf16(s[n][0], s[n][1], &hi.x, &lo.x);
        SplitBf16(s[n][2], s[n][3], &hi.y, &lo.y);
        reinterpret_cast<uint2*>(pf + (kk * 2) * 32 + lane)[half] = hi;
        reinterpret_cast<uint2*>(pf + (kk * 2 + 1) * 32 + lane)[half] = lo;
      }
    }
    __syncthreads();
    // Variants 8 and 9 skip the rescale when no row's maximum moved in this warp (alpha = 1
    // exactly: the same bits), as it mostly does after the first tiles.
    if (!kBf16Ops || __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int n = 0; n < kSplitNT; ++n) {
        acc[n][0] *= alpha[0];
        acc[n][1] *= alpha[0];
        acc[n][2] *= alpha[1];
        acc[n][3] *= alpha[1];
      }
    }
    // O[16 x this warp's 128 columns] += P V, V = the keys' latent part.
#pragma unroll
    for (int kk = 0; kk < kPvSteps; ++kk) {
      const uint4 ph4 = pf[(kk * kQParts) * 32 + lane];
      const uint4 pl4 = kBf16Ops ? ph4 : pf[(kk * kQParts + 1) * 32 + lane];
      const uint32_t ph[4] = {ph4.x, ph4.y, ph4.z, ph4.w};
      const uint32_t pl[4] = {pl4.x, pl4.y, pl4.z, pl4.w};
#pragma unroll
      for (int np = 0; np < kSplitNT / 2; ++np) {
        // Matrices: keys 16 kk + 8 (mat & 1) + 0..7, columns c0 + 8 (mat >> 1) + 0..7.
        const int c0 = col0 + np * 16;
        uint32_t b[4];
        LdMatrixX4<true>(b,
                         kc + (kk * 16 + (mat & 1) * 8 + mat_row) * kSplitLd + c0 + (mat >> 1) * 8);
        MmaBf16(acc[2 * np], ph, b[0], b[1]);
        if constexpr (!kBf16Ops) MmaBf16(acc[2 * np], pl, b[0], b[1]);
        MmaBf16(acc[2 * np + 1], ph, b[2], b[3]);
        if constexpr (!kBf16Ops) MmaBf16(acc[2 * np + 1], pl, b[2], b[3]);
      }
    }
  }

  // The denominators: this warp's keys over the quad, then the four warps in a fixed order.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    part_sum[r] += __shfl_xor_sync(0xffffffffu, part_sum[r], 1);
    part_sum[r] += __shfl_xor_sync(0xffffffffu, part_sum[r], 2);
  }
  if (tq == 0) {
    red_sum[warp * kMmaHeads + g] = part_sum[0];
    red_sum[warp * kMmaHeads + g + 8] = part_sum[1];
  }
  __syncthreads();
  float total[2] = {0.0f, 0.0f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) total[r] += red_sum[w * kMmaHeads + g + 8 * r];
  }
  if constexpr (kClusterMerge) {
    ClusterMergeSplits(p, t, h0, split, num_splits, acc, run_max, total,
                       reinterpret_cast<float*>(kbuf));
  } else {
#pragma unroll
    for (int n = 0; n < kSplitNT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = h0 + g + (e >> 1) * 8, c = col0 + n * 8 + 2 * tq + (e & 1);
        if (h >= p.num_heads) continue;
        const int64_t th = t * p.num_heads + h;
        if (num_splits == 1) {
          p.out_latent[th * kSplitLatent + c] = acc[n][e] / total[e >> 1];
        } else {
          ws_out[(th * num_splits + split) * kSplitLatent + c] = acc[n][e];
        }
      }
    }
    if (num_splits > 1 && warp == 0 && tq == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int h = h0 + g + r * 8;
        if (h >= p.num_heads) continue;
        float* ml = ws_ml + ((t * p.num_heads + h) * num_splits + split) * 2;
        ml[0] = run_max[r] * 0.6931471805599453f;  // natural-log units
        ml[1] = total[r];
      }
    }
  }
}

using GroupedKernelFn = void (*)(MlaAttentionParams, int, int, bool, float*, float*);

template <typename T>
GroupedKernelFn GroupedKernelFor(int latent_dim) {
  switch ((latent_dim + kGroupThreads - 1) / kGroupThreads) {
    case 1:
      return MlaGroupedKernel<1, T>;
    case 2:
      return MlaGroupedKernel<2, T>;
    case 3:
      return MlaGroupedKernel<3, T>;
    default:
      static_assert(kMaxColIters == 4, "one instantiation per column count");
      return MlaGroupedKernel<4, T>;
  }
}

GroupedKernelFn MmaKernelFor(int latent_dim) {
  const int cols = (latent_dim + kMmaWarps - 1) / kMmaWarps;  // per warp
  if (cols <= 16) return MlaBf16MmaKernel<2>;
  if (cols <= 32) return MlaBf16MmaKernel<4>;
  if (cols <= 64) return MlaBf16MmaKernel<8>;
  return MlaBf16MmaKernel<16>;
}

bool IsBf16(const MlaAttentionParams& p) { return p.cache.type == LatentCacheType::kBFloat16; }

// KernelFacts of a decode kernel (cached per kernel and device; the first query raises its
// dynamic shared-memory limit to all the device allows).
cudaError_t FactsFor(GroupedKernelFn kernel, int device, KernelFacts* out) {
  *out = KernelFactsFor(reinterpret_cast<const void*>(kernel), device, kAllSharedMemory);
  return out->error;
}

cudaError_t BlocksPerSm(GroupedKernelFn kernel, int device, int threads, size_t smem, int* out) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, size_t>, int>* cache =
      new std::map<std::tuple<const void*, int, size_t>, int>();
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), device, smem);
  auto it = cache->find(key);
  if (it != cache->end()) {
    *out = it->second;
    return cudaSuccess;
  }
  const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, kernel, threads, smem);
  if (e == cudaSuccess) cache->emplace(key, *out);
  return e;
}

// True when the tensor-core kernel takes these params: bf16 cache, shape within its register
// budget, and the kernel compiled for sm_80+ (its mma / ldmatrix code is absent from PTX JIT-
// compiled for an older virtual architecture).
bool UseMma(const MlaAttentionParams& p, GroupedKernelFn kernel, int device) {
  if (!IsBf16(p) || p.cache.latent_dim > kMmaMaxLatent ||
      (p.cache.latent_dim + p.cache.rope_dim + 15) / 16 * 16 > kMmaMaxDim) {
    return false;
  }
  KernelFacts f;
  return FactsFor(kernel, device, &f) == cudaSuccess && f.ptx_version >= 80;
}

struct GroupedPlan {
  GroupedKernelFn kernel = nullptr;
  int threads = kGroupThreads;
  size_t smem = 0;
  bool mma = false;
  bool key_split = false;  // MlaBf16KeySplitKernel
  bool bf16_ops = false;   // variants 8 and 9: Q and P rounded to bf16
  int cluster = 0;         // variant 9's cluster merge: blocks per cluster (= splits), else 0
  int num_groups = 0;
  int num_splits = 0;
  size_t workspace_bytes = 0;
};

// MlaAttentionParams::mma_variant of the kernels (numbers kept from when 1-3 and 5-6 existed:
// users pass them): MlaBf16MmaKernel (4), MlaBf16KeySplitKernel<> (7), <true> (8: 7 with bf16
// Q and P) and variant 9 (8 with the cluster merge where the split count allows it, else 8).
constexpr int kMmaVariant = 4;
constexpr int kKeySplitVariant = 7;
constexpr int kKeySplitBf16Variant = 8;
constexpr int kKeySplitClusterVariant = 9;
static_assert(kKeySplitClusterVariant == kMaxMlaMmaVariant,
              "mla_attention.h documents the variants");
static_assert(MlaMmaVariantIsValid(kMmaVariant) && MlaMmaVariantIsValid(kKeySplitVariant) &&
                  MlaMmaVariantIsValid(kKeySplitBf16Variant) &&
                  MlaMmaVariantIsValid(kKeySplitClusterVariant),
              "mla_attention.h lists the variants");
bool KeySplitBf16Ops(int variant) { return variant >= kKeySplitBf16Variant; }

GroupedKernelFn KeySplitKernelFor(int variant) {
  if (variant >= kKeySplitBf16Variant) return MlaBf16KeySplitKernel<true>;
  return MlaBf16KeySplitKernel<>;
}
constexpr GroupedKernelFn kClusterMergeKernel = MlaBf16KeySplitKernel<true, true>;

// Whether variant 9's cluster kernel runs clusters of `splits` blocks on this device (sm_90
// code, cluster launch, at least one such cluster schedulable); once per (splits, device).
cudaError_t ClusterMergeRuns(int splits, int device, bool* out) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, bool>* cache = new std::map<std::pair<int, int>, bool>();
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(splits, device);
  auto it = cache->find(key);
  if (it != cache->end()) {
    *out = it->second;
    return cudaSuccess;
  }
  const size_t smem = SplitSmemBytes(true);
  const KernelFacts k =
      KernelFactsFor(reinterpret_cast<const void*>(kClusterMergeKernel), device, kAllSharedMemory);
  if (k.error != cudaSuccess) return k.error;
  int cluster_launch = 0;
  cudaError_t e = cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device);
  if (e != cudaSuccess) return e;
  bool runs = cluster_launch != 0 && k.ptx_version >= 90 && static_cast<size_t>(k.max_smem) >= smem;
  if (runs) {
    cudaLaunchConfig_t c = {};
    cudaLaunchAttribute attr;
    c.gridDim = dim3(static_cast<unsigned>(splits), 1, 1);
    c.blockDim = dim3(kMmaThreads, 1, 1);
    c.dynamicSmemBytes = smem;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(splits);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    c.attrs = &attr;
    c.numAttrs = 1;
    int n = 0;
    e = cudaOccupancyMaxActiveClusters(&n, kClusterMergeKernel, &c);
    if (e != cudaSuccess) {
      cudaGetLastError();
      n = 0;  // cannot schedule it: variant 8 instead
    }
    runs = n > 0;
  }
  cache->emplace(key, runs);
  *out = runs;
  return cudaSuccess;
}

// The variant used when MlaAttentionParams::mma_variant is 0: variant 9 (bf16 operands, the
// cluster merge; docs/cuda.md); shapes it does not take run variant 4.
constexpr int kDefaultMmaVariant = kKeySplitClusterVariant;

// True when the key-split kernel takes these params (given the device's shared-memory limit):
// bf16 cache of latent 512 + rope 64, 16-byte aligned (whole-row cp.async copies).
bool KeySplitFits(const MlaAttentionParams& p, bool bf16_ops, int max_smem) {
  return IsBf16(p) && p.cache.latent_dim == kSplitLatent && p.cache.rope_dim == kSplitRope &&
         reinterpret_cast<uintptr_t>(p.cache.cache) % 16 == 0 &&
         SplitSmemBytes(bf16_ops) <= static_cast<size_t>(max_smem);
}

cudaError_t PlanGrouped(const MlaAttentionParams& p, GroupedPlan* plan) {
  if (p.cache.latent_dim <= 0 || p.cache.latent_dim > kMaxMlaLatentDim || p.cache.rope_dim < 0 ||
      p.num_splits < 0 || p.num_splits > kMaxMlaSplits || !MlaMmaVariantIsValid(p.mma_variant) ||
      (p.cache.type != LatentCacheType::kFloat32 && !IsBf16(p))) {
    return cudaErrorInvalidValue;
  }
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  const int dim = p.cache.latent_dim + p.cache.rope_dim;
  plan->num_groups = (p.num_heads + kGroupHeads - 1) / kGroupHeads;
  int variant = p.mma_variant == 0 ? kDefaultMmaVariant : p.mma_variant;
  const bool key_split = variant >= kKeySplitVariant;
  const bool bf16_ops = KeySplitBf16Ops(variant);
  GroupedKernelFn mma_kernel =
      key_split ? KeySplitKernelFor(variant) : MmaKernelFor(p.cache.latent_dim);
  if (key_split) {
    // Shapes (or devices) the key-split kernels do not take run variant 4.
    KernelFacts facts;
    e = FactsFor(mma_kernel, device, &facts);
    if (e != cudaSuccess) return e;
    if (!KeySplitFits(p, bf16_ops, facts.max_smem)) {
      variant = kMmaVariant;
      mma_kernel = MmaKernelFor(p.cache.latent_dim);
    }
  }
  plan->mma = UseMma(p, mma_kernel, device);
  plan->key_split = plan->mma && variant >= kKeySplitVariant;
  plan->bf16_ops = plan->key_split && bf16_ops;
  if (plan->mma) {
    plan->kernel = mma_kernel;
    plan->threads = kMmaThreads;
    plan->smem = plan->key_split ? SplitSmemBytes(bf16_ops) : MmaSmemBytes(dim);
  } else {
    plan->kernel = IsBf16(p) ? GroupedKernelFor<__nv_bfloat16>(p.cache.latent_dim)
                             : GroupedKernelFor<float>(p.cache.latent_dim);
    plan->threads = kGroupThreads;
    plan->smem = GroupedSmemBytes(dim);
  }
  KernelFacts facts;
  e = FactsFor(plan->kernel, device, &facts);
  if (e != cudaSuccess) return e;
  if (plan->smem > static_cast<size_t>(facts.max_smem)) return cudaErrorInvalidValue;
  plan->num_splits = p.num_splits;
  if (plan->num_splits == 0) {
    int per_sm = 0;
    e = BlocksPerSm(plan->kernel, device, plan->threads, plan->smem, &per_sm);
    if (e != cudaSuccess) return e;
    // Split until one wave of blocks covers every SM slot (rounding down: a partial second
    // wave would cost more than it fills).
    const int64_t blocks = static_cast<int64_t>(p.num_tokens) * plan->num_groups;
    const int64_t slots = static_cast<int64_t>(facts.sms) * (per_sm > 0 ? per_sm : 1);
    const int64_t want = blocks >= slots ? 1 : slots / blocks;
    plan->num_splits = static_cast<int>(want < kMaxMlaSplits ? want : kMaxMlaSplits);
  }
  // Variant 9: the splits of a (token, group) merge in a cluster, without the workspace (the
  // merge stores float4s of the output).
  if (plan->key_split && variant == kKeySplitClusterVariant && plan->num_splits >= 2 &&
      plan->num_splits <= kMlaClusterMergeMaxSplits &&
      reinterpret_cast<uintptr_t>(p.out_latent) % 16 == 0) {
    bool runs = false;
    e = ClusterMergeRuns(plan->num_splits, device, &runs);
    if (e != cudaSuccess) return e;
    if (runs) {
      plan->kernel = kClusterMergeKernel;
      plan->cluster = plan->num_splits;
      plan->workspace_bytes = 0;
      return cudaSuccess;
    }
  }
  plan->workspace_bytes = plan->num_splits == 1
                              ? 0
                              : static_cast<size_t>(p.num_tokens) * p.num_heads * plan->num_splits *
                                    (static_cast<size_t>(p.cache.latent_dim) + 2) * sizeof(float);
  return cudaSuccess;
}

}  // namespace

cudaError_t WriteLatentCacheF32(int64_t tokens, const float* latent, int64_t ld_latent,
                                const float* rope_key, int64_t ld_rope, const int32_t* slots,
                                const PagedLatentCache& cache, cudaStream_t stream) {
  if (tokens <= 0) return cudaSuccess;
  if (tokens > 0x7fffffff) return cudaErrorInvalidValue;
  if (cache.type == LatentCacheType::kBFloat16) {
    WriteLatentCacheKernel<__nv_bfloat16><<<static_cast<unsigned>(tokens), 128, 0, stream>>>(
        latent, ld_latent, rope_key, ld_rope, slots, cache);
  } else if (cache.type == LatentCacheType::kFloat32) {
    WriteLatentCacheKernel<float><<<static_cast<unsigned>(tokens), 128, 0, stream>>>(
        latent, ld_latent, rope_key, ld_rope, slots, cache);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t MlaAttentionPerHeadF32(const MlaAttentionParams& params, cudaStream_t stream) {
  if (params.num_tokens <= 0 || params.num_heads <= 0) return cudaSuccess;
  if (params.cache.latent_dim <= 0 || params.cache.latent_dim > kMaxMlaLatentDim ||
      params.cache.rope_dim < 0 || params.num_heads > 65535 ||
      params.cache.type != LatentCacheType::kFloat32) {
    return cudaErrorInvalidValue;
  }
  const size_t smem =
      (static_cast<size_t>(params.cache.latent_dim) + params.cache.rope_dim + kChunk) *
      sizeof(float);
  dim3 grid(static_cast<unsigned>(params.num_tokens), static_cast<unsigned>(params.num_heads));
  MlaAttentionPerHeadKernel<<<grid, kThreads, smem, stream>>>(params);
  return cudaGetLastError();
}

const char* MlaAttentionKernelName(const MlaAttentionParams& params) {
  GroupedPlan plan;
  if (PlanGrouped(params, &plan) != cudaSuccess) return "invalid";
  if (plan.cluster > 0) return "mma_bf16_key_split_cluster";
  if (plan.key_split) return "mma_bf16_key_split";
  if (plan.mma) return "mma_bf16";
  return IsBf16(params) ? "grouped_bf16" : "grouped_f32";
}

bool MlaAttentionBf16Operands(const MlaAttentionParams& params) {
  GroupedPlan plan;
  return PlanGrouped(params, &plan) == cudaSuccess && plan.bf16_ops;
}

cudaError_t MlaAttentionWorkspaceBytes(const MlaAttentionParams& params, size_t* bytes) {
  *bytes = 0;
  if (params.num_tokens <= 0 || params.num_heads <= 0) return cudaSuccess;
  GroupedPlan plan;
  const cudaError_t e = PlanGrouped(params, &plan);
  if (e == cudaSuccess) *bytes = plan.workspace_bytes;
  return e;
}

cudaError_t MlaAttentionF32(const MlaAttentionParams& params, cudaStream_t stream) {
  if (params.num_tokens <= 0 || params.num_heads <= 0) return cudaSuccess;
  GroupedPlan plan;
  cudaError_t e = PlanGrouped(params, &plan);
  if (e != cudaSuccess) return e;
  const int64_t blocks =
      static_cast<int64_t>(params.num_tokens) * plan.num_splits * plan.num_groups;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  void* workspace = params.workspace;
  const bool own_workspace = plan.workspace_bytes > 0 && workspace == nullptr;
  if (plan.workspace_bytes > 0 && !own_workspace && params.workspace_bytes < plan.workspace_bytes) {
    return cudaErrorInvalidValue;
  }
  if (own_workspace) {
    e = cudaMallocAsync(&workspace, plan.workspace_bytes, stream);
    if (e != cudaSuccess) return e;
  }
  float* ws_out = static_cast<float*>(workspace);
  float* ws_ml = ws_out == nullptr
                     ? nullptr
                     : ws_out + static_cast<size_t>(params.num_tokens) * params.num_heads *
                                    plan.num_splits * params.cache.latent_dim;
  const int dim = params.cache.latent_dim + params.cache.rope_dim;
  const bool aligned16 = reinterpret_cast<uintptr_t>(params.cache.cache) % 16 == 0;
  // fp32 rows: whole float4s; bf16 rows (tensor-core kernel): whole 8-element pieces. The
  // CUDA-core kernel widens bf16 with plain loads.
  const bool vec_loads = aligned16 && (plan.mma ? dim % 8 == 0 : !IsBf16(params) && dim % 4 == 0);
  if (plan.cluster > 0) {
    // Variant 9: clusters of plan.cluster blocks merge their splits themselves (no combine).
    cudaLaunchConfig_t c = {};
    cudaLaunchAttribute attr;
    c.gridDim = dim3(static_cast<unsigned>(blocks), 1, 1);
    c.blockDim = dim3(static_cast<unsigned>(plan.threads), 1, 1);
    c.dynamicSmemBytes = plan.smem;
    c.stream = stream;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(plan.cluster);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    c.attrs = &attr;
    c.numAttrs = 1;
    return cudaLaunchKernelEx(&c, plan.kernel, params, plan.num_groups, plan.num_splits, vec_loads,
                              static_cast<float*>(nullptr), static_cast<float*>(nullptr));
  }
  plan.kernel<<<static_cast<unsigned>(blocks), plan.threads, plan.smem, stream>>>(
      params, plan.num_groups, plan.num_splits, vec_loads, ws_out, ws_ml);
  e = cudaGetLastError();
  const int64_t token_heads = static_cast<int64_t>(params.num_tokens) * params.num_heads;
  if (e == cudaSuccess && plan.num_splits >= kWideCombineMinSplits) {
    const dim3 grid(
        static_cast<unsigned>(token_heads),
        static_cast<unsigned>((params.cache.latent_dim + kWideCombineCols - 1) / kWideCombineCols));
    MlaCombineWideKernel<<<grid, kWideCombineRows * kWideCombineCols, 0, stream>>>(
        ws_out, ws_ml, plan.num_splits, params.cache.latent_dim, params.out_latent);
    e = cudaGetLastError();
  } else if (e == cudaSuccess && plan.num_splits > 1) {
    MlaCombineKernel<<<static_cast<unsigned>(token_heads), 128, 0, stream>>>(
        ws_out, ws_ml, plan.num_splits, params.cache.latent_dim, params.out_latent);
    e = cudaGetLastError();
  }
  if (own_workspace) {
    const cudaError_t f = cudaFreeAsync(workspace, stream);
    if (e == cudaSuccess) e = f;
  }
  return e;
}

}  // namespace kernels
}  // namespace deepinfer
