// MlaGroupedKernel: MlaAttentionF32 on CUDA cores (fp32 and FP8 caches, and bf16 shapes the
// tensor-core kernels do not take; mla_attention.cu describes it). Included only by
// mla_attention.cu.
#ifndef DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_GROUPED_CUH_
#define DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_GROUPED_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>

#include <cstdint>

#include "kernels/attention/mla_attention.h"
#include "kernels/attention/mla_decode_common.cuh"

namespace deepinfer {
namespace kernels {
namespace mla {

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

// LoadKeyChunk of an FP8 cache: entries dequantised to fp32 with plain loads (the latent's codes
// times the entry's scale, the bf16 rope key widened), as the host's DequantizeFp8LatentEntry.
template <>
__device__ __forceinline__ void LoadKeyChunk<Fp8Entry>(const MlaAttentionParams& p,
                                                       const int64_t* rows, float4* dst, int d4,
                                                       int dim, bool vec_loads) {
  const int latent = p.cache.latent_dim;
  int j = threadIdx.x / d4, f = threadIdx.x - j * d4;
  for (int i = threadIdx.x; i < kKeyChunk * d4; i += kGroupThreads) {
    const int64_t row = rows[j];
    if (row < 0) {
      dst[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    } else {
      const uint8_t* src = static_cast<const uint8_t*>(p.cache.cache) + row;
      const float scale = *reinterpret_cast<const float*>(src + p.cache.fp8_scale_offset);
      const __nv_bfloat16* rope =
          reinterpret_cast<const __nv_bfloat16*>(src + p.cache.fp8_rope_offset);
      float v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int c = f * 4 + u;
        if (c < latent) {
          const __half_raw h = __nv_cvt_fp8_to_halfraw(src[c], __NV_E4M3);
          v[u] = __half2float(__half(h)) * scale;
        } else if (c < dim) {
          v[u] = __bfloat162float(rope[c - latent]);
        } else {
          v[u] = 0.0f;
        }
      }
      dst[i] = make_float4(v[0], v[1], v[2], v[3]);
    }
    f += kGroupThreads;
    while (f >= d4) {
      f -= d4;
      ++j;
    }
  }
  CopyAsyncCommit();
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

}  // namespace mla
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_GROUPED_CUH_
