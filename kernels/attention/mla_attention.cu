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
// MlaCombineKernel merges them (FlashDecoding). All accumulation is fp32.
//
// MlaAttentionPerHeadF32, the earlier kernel: one block per (token, head), keys scored one warp
// per key, online softmax rescaling per-thread latent accumulators.
#include <math.h>

#include <cstdint>

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
__device__ __forceinline__ void CopyAsync16(float4* dst, const float4* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(src) : "memory");
#else
  *dst = *src;
#endif
}

__device__ __forceinline__ void CopyAsyncCommit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most kPending of this thread's committed copy groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CopyAsyncWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
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
__device__ __forceinline__ void LoadKeyChunk(const MlaAttentionParams& p, const int64_t* rows,
                                             float4* dst, int d4, int dim, bool vec_loads) {
  int j = threadIdx.x / d4, f = threadIdx.x - j * d4;
  for (int i = threadIdx.x; i < kKeyChunk * d4; i += kGroupThreads) {
    const int64_t row = rows[j];
    const float* src = p.cache.cache + row;
    if (row < 0) {
      dst[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // keys past the end: P V needs no mask
    } else if (vec_loads) {
      CopyAsync16(dst + i, reinterpret_cast<const float4*>(src) + f);
    } else {
      const int c = f * 4;
      float4 v = make_float4(src[c], 0.0f, 0.0f, 0.0f);
      if (c + 1 < dim) v.y = src[c + 1];
      if (c + 2 < dim) v.z = src[c + 2];
      if (c + 3 < dim) v.w = src[c + 3];
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

// Block index = (token * num_splits + split) * num_groups + group: the head groups of one
// (token, split) run side by side and share its keys through L2.
// Two blocks per SM up to latent 512; wider latents need more shared memory than that leaves.
template <int kColIters>
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
  const int64_t len = p.context_len[t];
  // Splits cover whole chunks; trailing splits of a short context are empty.
  const int64_t per_split = (len + num_splits - 1) / num_splits;
  const int64_t span = (per_split + kKeyChunk - 1) / kKeyChunk * kKeyChunk;
  const int64_t begin = split * span;
  const int64_t end = len < begin + span ? len : begin + span;

  if (num_splits > 1 && begin >= end) {
    if (tid < kGroupHeads && h0 + tid < p.num_heads) {
      float* ml = ws_ml + ((t * p.num_heads + h0 + tid) * num_splits + split) * 2;
      ml[0] = -INFINITY;
      ml[1] = 0.0f;
    }
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
  LoadKeyChunk(p, rows, kbuf, d4, dim, vec_loads);
  int chunk = 0;
  for (int64_t j0 = begin; j0 < end; j0 += kKeyChunk, ++chunk) {
    const float4* k4 = kbuf + (chunk & 1) * kKeyChunk * d4;
    const bool has_next = j0 + kKeyChunk < end;
    // The other buffer was last read before the previous iteration's closing barrier.
    if (has_next) {
      LoadKeyChunk(p, rows + ((chunk + 1) % kRowSlots) * kKeyChunk,
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

// One block per (token, head): out = sum_s w_s O_s / sum_s w_s l_s, w_s = exp(m_s - max m).
__global__ void MlaCombineKernel(const float* ws_out, const float* ws_ml, int num_splits,
                                 int latent, float* out) {
  __shared__ float weight[kMaxMlaSplits];
  __shared__ float denom;
  const int64_t th = blockIdx.x;
  const float* ml = ws_ml + th * num_splits * 2;
  if (threadIdx.x < 32) {
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
    if (threadIdx.x == 0) denom = sum;
  }
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

using GroupedKernelFn = void (*)(MlaAttentionParams, int, int, bool, float*, float*);

GroupedKernelFn GroupedKernelFor(int latent_dim) {
  switch ((latent_dim + kGroupThreads - 1) / kGroupThreads) {
    case 1:
      return MlaGroupedKernel<1>;
    case 2:
      return MlaGroupedKernel<2>;
    case 3:
      return MlaGroupedKernel<3>;
    default:
      static_assert(kMaxColIters == 4, "one instantiation per column count");
      return MlaGroupedKernel<4>;
  }
}

struct GroupedPlan {
  GroupedKernelFn kernel = nullptr;
  size_t smem = 0;
  int num_groups = 0;
  int num_splits = 0;
  size_t workspace_bytes = 0;
};

cudaError_t PlanGrouped(const MlaAttentionParams& p, GroupedPlan* plan) {
  if (p.cache.latent_dim <= 0 || p.cache.latent_dim > kMaxMlaLatentDim || p.cache.rope_dim < 0 ||
      p.num_splits < 0 || p.num_splits > kMaxMlaSplits) {
    return cudaErrorInvalidValue;
  }
  plan->kernel = GroupedKernelFor(p.cache.latent_dim);
  plan->smem = GroupedSmemBytes(p.cache.latent_dim + p.cache.rope_dim);
  plan->num_groups = (p.num_heads + kGroupHeads - 1) / kGroupHeads;
  int device = 0, max_smem = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  e = cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e != cudaSuccess) return e;
  if (plan->smem > static_cast<size_t>(max_smem)) return cudaErrorInvalidValue;
  e = cudaFuncSetAttribute(plan->kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(plan->smem));
  if (e != cudaSuccess) return e;
  plan->num_splits = p.num_splits;
  if (plan->num_splits == 0) {
    int sms = 0, per_sm = 0;
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e != cudaSuccess) return e;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, plan->kernel, kGroupThreads,
                                                      plan->smem);
    if (e != cudaSuccess) return e;
    // Split until one wave of blocks covers every SM slot (rounding down: a partial second
    // wave would cost more than it fills).
    const int64_t blocks = static_cast<int64_t>(p.num_tokens) * plan->num_groups;
    const int64_t slots = static_cast<int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
    const int64_t want = blocks >= slots ? 1 : slots / blocks;
    plan->num_splits = static_cast<int>(want < kMaxMlaSplits ? want : kMaxMlaSplits);
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
  WriteLatentCacheKernel<<<static_cast<unsigned>(tokens), 128, 0, stream>>>(
      latent, ld_latent, rope_key, ld_rope, slots, cache);
  return cudaGetLastError();
}

cudaError_t MlaAttentionPerHeadF32(const MlaAttentionParams& params, cudaStream_t stream) {
  if (params.num_tokens <= 0 || params.num_heads <= 0) return cudaSuccess;
  if (params.cache.latent_dim <= 0 || params.cache.latent_dim > kMaxMlaLatentDim ||
      params.cache.rope_dim < 0 || params.num_heads > 65535) {
    return cudaErrorInvalidValue;
  }
  const size_t smem =
      (static_cast<size_t>(params.cache.latent_dim) + params.cache.rope_dim + kChunk) *
      sizeof(float);
  dim3 grid(static_cast<unsigned>(params.num_tokens), static_cast<unsigned>(params.num_heads));
  MlaAttentionPerHeadKernel<<<grid, kThreads, smem, stream>>>(params);
  return cudaGetLastError();
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
  const bool vec_loads =
      dim % 4 == 0 && reinterpret_cast<uintptr_t>(params.cache.cache) % sizeof(float4) == 0;
  plan.kernel<<<static_cast<unsigned>(blocks), kGroupThreads, plan.smem, stream>>>(
      params, plan.num_groups, plan.num_splits, vec_loads, ws_out, ws_ml);
  e = cudaGetLastError();
  if (e == cudaSuccess && plan.num_splits > 1) {
    MlaCombineKernel<<<static_cast<unsigned>(static_cast<int64_t>(params.num_tokens) *
                                             params.num_heads),
                       128, 0, stream>>>(ws_out, ws_ml, plan.num_splits, params.cache.latent_dim,
                                         params.out_latent);
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
