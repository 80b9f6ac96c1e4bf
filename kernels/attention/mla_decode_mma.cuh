// MlaBf16MmaKernel: the tensor-core MLA decode kernel for bf16 caches (mma_variant 4; the shapes
// the key-split kernel does not take), and the MMA sizes the key-split kernel shares. Included
// only by mla_attention.cu.
#ifndef DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_MMA_CUH_
#define DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_MMA_CUH_

#include <cuda_bf16.h>
#include <math.h>

#include <cstdint>

#include "kernels/attention/mla_attention.h"
#include "kernels/attention/mla_decode_common.cuh"

namespace deepinfer {
namespace kernels {
namespace mla {

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
// SM. Its instruction count per chunk is the kernel's bound (docs/cuda/bf16-and-kv-cache.md; deeper
// rings and 16-key chunks, the removed variants 1-3, measured slower): each key row is copied by
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

// Writes a (token, 16-head group, split) block's result from its MMA accumulators (rows g and
// g + 8 of the fragments, kNT 8-column tiles from col0): with one split the normalised output,
// else the unnormalised partial and, from warp 0's threads with tq 0, (max in natural-log units,
// sum) for the split combine. kCheckColumns: the latent may end inside a tile.
template <int kNT, bool kCheckColumns>
__device__ __forceinline__ void WriteSplitResult(const MlaAttentionParams& p, int64_t t, int h0,
                                                 int warp, int g, int tq, int col0, int latent,
                                                 int num_splits, int split,
                                                 const float (&acc)[kNT][4],
                                                 const float (&run_max)[2], const float (&sum)[2],
                                                 float* ws_out, float* ws_ml) {
#pragma unroll
  for (int n = 0; n < kNT; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = h0 + g + (e >> 1) * 8, c = col0 + n * 8 + 2 * tq + (e & 1);
      if (h >= p.num_heads || (kCheckColumns && c >= latent)) continue;
      const int64_t th = t * p.num_heads + h;
      if (num_splits == 1) {
        p.out_latent[th * latent + c] = acc[n][e] / sum[e >> 1];
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
      ml[1] = sum[r];
    }
  }
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

  WriteSplitResult<kNT, true>(p, t, h0, warp, g, tq, col0, latent, num_splits, split, acc, run_max,
                              run_sum, ws_out, ws_ml);
}

}  // namespace mla
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_MMA_CUH_
