// MLA decode attention for a few tokens (mla_decode_small.h).
//
// Grid (cluster size S, head groups, tokens), cluster (S, 1, 1): the S blocks of a cluster share
// one (token, group of kHeads heads); block r (its rank) takes the r-th of S contiguous shares of
// the token's context, and each of its kWarps warps a contiguous share of that. A warp runs the
// online softmax over its keys by itself, kBatch keys per step:
//   keys    lane l holds latent columns 16 l .. 16 l + 15 (two 16-byte loads of the bf16 row)
//           and rope columns 2 l, 2 l + 1 (one 4-byte load) of each key, straight from global
//           memory into registers; the next step's keys are loaded while this step computes,
//           and the block-table lookups are done one per lane, 32 keys (one lookup) ahead;
//   scores  each lane's 18 products per (head, key) in fp32, summed over the warp by an xor
//           butterfly (every lane ends with the same bits, so all lanes keep the same softmax
//           state), scaled into base 2 (log2 e folded into the scale);
//   value   O[head, lane's 16 columns] = alpha O + sum_k p_k v_k, the keys' latent as the value,
//           from the same registers.
// Then the warps' (m, l, O) are merged in shared memory, and after a cluster barrier block r
// merges columns r * 512 / S .. of every block's (m, l, O) through distributed shared memory
// (S reads per output value, in rank order) and writes the normalised output. No workspace, no
// second kernel, no atomics: the summation order is fixed, so results are the same bits on
// every run. The keys are exact bf16 and all math is fp32 (as MlaAttentionF32's CUDA-core
// kernels), so this matches the fp32 reference as closely as they do.
//
// An FP8 cache (kFp8E4M3) runs the same kernel with kFp8 set; only the loads differ: lane l
// loads its 16 latent codes (one 16-byte load), the entry's scale s (the same word for every
// lane: one transaction) and its rope pair (bf16 bits at the rope offset), and at the start of
// the step that uses them turns each code q into the bf16 value bf16(e4m3_to_float(q) * s)
// (one fp32 product, nearest even): GatherFp8LatentCacheBf16's value. From there the step is the
// bf16 cache's, so the output equals the bf16 form's over the gathered copy bit for bit (same
// cluster and heads per block).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/attention/mla_decode_small.h"
#include "kernels/attention/mla_decode_small_mma.h"
#include "kernels/common/kernel_facts.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kLatent = kMlaDecodeSmallLatent;
constexpr int kRope = kMlaDecodeSmallRope;
constexpr int kLanePairs = kLatent / 32 / 2;  // bf16 pairs of latent per lane: 8
constexpr int kLaneWords = kLanePairs + 1;    // + the lane's rope pair
constexpr int kMaxCluster = kMlaDecodeSmallMaxCluster;
static_assert(kLatent == 32 * 16 && kRope == 32 * 2, "lane layout: 16 latent + 2 rope columns");

// Keys per warp step: 4, or 2 with 4 heads (registers: the query and O grow with the heads).
template <int kHeads>
__host__ __device__ constexpr int BatchFor() {
  return kHeads >= 4 ? 2 : 4;
}

// Shared memory in floats: warp partials O [kWarps][kHeads][kLatent] and (m, l)
// [kWarps][kHeads][2], the block's O [kHeads][kLatent] and (m, l) [kHeads][2], then the cluster
// merge's (m, l) per block [kHeads][kMaxCluster][2], weights [kHeads][kMaxCluster] and
// denominators [kHeads] (padded to 4).
template <int kHeads>
struct SmemLayout {
  static constexpr int kWarpO = 0;
  static constexpr int kWarpMl = kWarpO + kWarps * kHeads * kLatent;
  static constexpr int kBlockO = kWarpMl + kWarps * kHeads * 2;
  static constexpr int kBlockMl = kBlockO + kHeads * kLatent;
  static constexpr int kMergeMl = kBlockMl + ((kHeads * 2 + 3) / 4) * 4;
  static constexpr int kMergeW = kMergeMl + kHeads * kMaxCluster * 2;
  static constexpr int kDenom = kMergeW + kHeads * kMaxCluster;
  static constexpr int kFloats = kDenom + ((kHeads + 3) / 4) * 4;
  static_assert(kBlockO % 4 == 0, "the block's O is read as float4");
};

// kBatch keys of one warp step: lane words 0..7 latent pairs, 8 the rope pair (zeros past the
// warp's keys).
template <int kBatch>
struct KeyBatch {
  uint32_t w[kBatch][kLaneWords];
};

// kBatch keys of one warp step as an FP8 cache holds them: the lane's 16 latent codes (code 4i + b
// in byte b of codes[i]), the entry's scale and the lane's rope pair (bf16 bits; all zeros past
// the warp's keys).
template <int kBatch>
struct Fp8KeyBatch {
  uint32_t codes[kBatch][4];
  float scale[kBatch];
  uint32_t rope[kBatch];
};

// What a lane holds of a step's keys between their load and their use.
template <int kBatch, bool kFp8>
using LoadedKeys = typename std::conditional<kFp8, Fp8KeyBatch<kBatch>, KeyBatch<kBatch>>::type;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

constexpr int kDim = kLatent + kRope;
constexpr int kQPerLane = 2 * kLaneWords;  // 18 query values per lane and head
constexpr int kCols4 = kLatent / 4;        // float4 columns of an output row

// A bf16 pair (element 2i in the low half) as two floats: exact.
__device__ __forceinline__ float2 Bf16Pair(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

// Offset of key j's entry in the cache: in elements (bf16) or bytes (FP8), `stride` a row.
__device__ __forceinline__ int64_t KeyRow(const int32_t* table, int j, int block_size,
                                          int64_t stride) {
  return (static_cast<int64_t>(table[j / block_size]) * block_size + j % block_size) * stride;
}

// Keys k0 .. k0 + kBatch - 1 of the warp (row offsets lane-distributed in rows: key k's at lane
// k % 32); keys at or past n are zeros and touch no memory.
template <int kBatch>
__device__ __forceinline__ KeyBatch<kBatch> LoadKeys(const __nv_bfloat16* cache, int64_t rows,
                                                     int k0, int n, int lane) {
  KeyBatch<kBatch> b;
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    const int k = k0 + u;
    const int64_t row = __shfl_sync(0xffffffffu, rows, k & 31);
    if (k < n) {
      const __nv_bfloat16* e = cache + row + lane * 16;
      const uint4 a = __ldg(reinterpret_cast<const uint4*>(e));
      const uint4 c = __ldg(reinterpret_cast<const uint4*>(e + 8));
      b.w[u][0] = a.x;
      b.w[u][1] = a.y;
      b.w[u][2] = a.z;
      b.w[u][3] = a.w;
      b.w[u][4] = c.x;
      b.w[u][5] = c.y;
      b.w[u][6] = c.z;
      b.w[u][7] = c.w;
      b.w[u][8] = __ldg(reinterpret_cast<const unsigned int*>(cache + row + kLatent + lane * 2));
    } else {
#pragma unroll
      for (int i = 0; i < kLaneWords; ++i) b.w[u][i] = 0u;
    }
  }
  return b;
}

// The same keys of an FP8 cache (byte offsets in rows): codes, scale and rope pair, as stored.
template <int kBatch>
__device__ __forceinline__ Fp8KeyBatch<kBatch> LoadKeys(const uint8_t* cache, int64_t rows, int k0,
                                                        int n, int lane, int rope_offset,
                                                        int scale_offset) {
  Fp8KeyBatch<kBatch> b;
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    const int k = k0 + u;
    const int64_t row = __shfl_sync(0xffffffffu, rows, k & 31);
    if (k < n) {
      const uint8_t* e = cache + row;
      const uint4 a = __ldg(reinterpret_cast<const uint4*>(e + lane * 16));
      b.codes[u][0] = a.x;
      b.codes[u][1] = a.y;
      b.codes[u][2] = a.z;
      b.codes[u][3] = a.w;
      b.scale[u] = __ldg(reinterpret_cast<const float*>(e + scale_offset));
      b.rope[u] = __ldg(reinterpret_cast<const unsigned int*>(e + rope_offset + lane * 4));
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) b.codes[u][i] = 0u;
      b.scale[u] = 0.0f;
      b.rope[u] = 0u;
    }
  }
  return b;
}

// Two e4m3 codes (the first in the low byte) times the scale, as a bf16 pair (the first in the
// low half): e4m3 -> half -> float is exact, then one fp32 product per value, rounded to
// nearest-even bf16 (GatherFp8LatentCacheBf16's DequantBf16).
__device__ __forceinline__ uint32_t DequantPair(uint32_t two_codes, float scale) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  const __nv_bfloat162 v = __floats2bfloat162_rn(__fmul_rn(f.x, scale), __fmul_rn(f.y, scale));
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The bf16 keys a step computes with.
template <int kBatch>
__device__ __forceinline__ KeyBatch<kBatch> StepKeys(const KeyBatch<kBatch>& b) {
  return b;
}

template <int kBatch>
__device__ __forceinline__ KeyBatch<kBatch> StepKeys(const Fp8KeyBatch<kBatch>& b) {
  KeyBatch<kBatch> k;
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      k.w[u][2 * i] = DequantPair(b.codes[u][i], b.scale[u]);
      k.w[u][2 * i + 1] = DequantPair(b.codes[u][i] >> 16, b.scale[u]);
    }
    k.w[u][kLanePairs] = b.rope[u];
  }
  return k;
}

#endif  // __CUDA_ARCH__ >= 900

// kFp8: the cache is kFp8E4M3 (MlaDecodeSmallSupported checked its layout), else kBFloat16.
template <int kHeads, bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) MlaDecodeSmallKernel(MlaAttentionParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  constexpr int kBatch = BatchFor<kHeads>();
  using L = SmemLayout<kHeads>;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  cg::cluster_group cluster = cg::this_cluster();
  const int splits = static_cast<int>(cluster.num_blocks());
  const int split = static_cast<int>(cluster.block_rank());
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h0 = blockIdx.y * kHeads;
  const int64_t t = blockIdx.z;
  const int heads = p.num_heads;

  // The query's lane columns for each head (0 for heads past the last).
  float q[kHeads][kQPerLane];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    const int hh = h0 + h;
    if (hh < heads) {
      const float4* ql =
          reinterpret_cast<const float4*>(p.q_latent + (t * heads + hh) * kLatent + lane * 16);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 x = ql[i];
        q[h][4 * i] = x.x;
        q[h][4 * i + 1] = x.y;
        q[h][4 * i + 2] = x.z;
        q[h][4 * i + 3] = x.w;
      }
      const float* qr = p.q_rope + t * p.q_rope_token_stride + hh * p.q_rope_head_stride + lane * 2;
      q[h][16] = qr[0];
      q[h][17] = qr[1];
    } else {
#pragma unroll
      for (int i = 0; i < kQPerLane; ++i) q[h][i] = 0.0f;
    }
  }

  // This warp's keys: [kb, kb + n) of the token's sequence.
  const int len = p.context_len[t];
  const int32_t* table =
      p.block_tables + static_cast<int64_t>(p.token_seq[t]) * p.max_blocks_per_seq;
  const int bs = p.cache.block_size;
  const int per_split = (len + splits - 1) / splits;
  const int cb = min(len, split * per_split), ce = min(len, cb + per_split);
  // Warp shares in whole steps, so that only the last warp with keys has a partial step.
  const int per_warp = ((ce - cb + kWarps - 1) / kWarps + kBatch - 1) / kBatch * kBatch;
  const int kb = min(ce, cb + warp * per_warp);
  const int n = min(ce, kb + per_warp) - kb;
  const float scale2 = p.softmax_scale * 1.4426950408889634f;
  const int64_t stride = kFp8 ? static_cast<int64_t>(p.cache.fp8_entry_bytes) : int64_t{kDim};
  const int rope_offset = p.cache.fp8_rope_offset, scale_offset = p.cache.fp8_scale_offset;
  auto load = [&](int64_t rows, int k0) {
    if constexpr (kFp8) {
      return LoadKeys<kBatch>(static_cast<const uint8_t*>(p.cache.cache), rows, k0, n, lane,
                              rope_offset, scale_offset);
    } else {
      return LoadKeys<kBatch>(static_cast<const __nv_bfloat16*>(p.cache.cache), rows, k0, n, lane);
    }
  };

  // Row offsets of keys 32 g + lane (rows_cur: this step's group g, rows_next: g + 1).
  int64_t rows_cur = lane < n ? KeyRow(table, kb + lane, bs, stride) : 0;
  int64_t rows_next = 32 + lane < n ? KeyRow(table, kb + 32 + lane, bs, stride) : 0;

  float o[kHeads][2 * kLanePairs];
  float m[kHeads], l[kHeads];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.0f;
#pragma unroll
    for (int c = 0; c < 2 * kLanePairs; ++c) o[h][c] = 0.0f;
  }

  LoadedKeys<kBatch, kFp8> loaded = load(rows_cur, 0);
  for (int k0 = 0; k0 < n; k0 += kBatch) {
    const int k1 = k0 + kBatch;
    // kBatch divides 32: a step never straddles two groups of row offsets.
    const LoadedKeys<kBatch, kFp8> nxt = load((k1 & 31) == 0 ? rows_next : rows_cur, k1);
    const KeyBatch<kBatch> cur = StepKeys(loaded);

    // Scores, base 2; -inf past the warp's keys (key k0 is always in range).
    float s[kHeads][kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < kLaneWords; ++i) {
          const float2 k = Bf16Pair(cur.w[u][i]);
          acc = fmaf(q[h][2 * i], k.x, acc);
          acc = fmaf(q[h][2 * i + 1], k.y, acc);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        s[h][u] = k0 + u < n ? acc * scale2 : -INFINITY;
      }
    }
    // Online softmax: the step's probabilities into s.
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      float mx = m[h];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) mx = fmaxf(mx, s[h][u]);
      const float alpha = exp2f(m[h] - mx);  // 0 on the first step (m = -inf, mx finite)
      float sum = 0.0f;
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        s[h][u] = exp2f(s[h][u] - mx);
        sum += s[h][u];
      }
      l[h] = fmaf(l[h], alpha, sum);
      m[h] = mx;
#pragma unroll
      for (int c = 0; c < 2 * kLanePairs; ++c) o[h][c] *= alpha;
    }
    // O += P V over the lane's latent columns.
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
#pragma unroll
      for (int i = 0; i < kLanePairs; ++i) {
        const float2 v = Bf16Pair(cur.w[u][i]);
#pragma unroll
        for (int h = 0; h < kHeads; ++h) {
          o[h][2 * i] = fmaf(s[h][u], v.x, o[h][2 * i]);
          o[h][2 * i + 1] = fmaf(s[h][u], v.y, o[h][2 * i + 1]);
        }
      }
    }
    if ((k1 & 31) == 0) {  // the next step starts group k1 / 32: look up the one after it
      rows_cur = rows_next;
      rows_next = k1 + 32 + lane < n ? KeyRow(table, kb + k1 + 32 + lane, bs, stride) : 0;
    }
    loaded = nxt;
  }

  // The warps' partials (a warp without keys: m = -inf, l = 0, O = 0).
  float* warp_o = smem + L::kWarpO;
  float* warp_ml = smem + L::kWarpMl;
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    float4* dst = reinterpret_cast<float4*>(warp_o + (warp * kHeads + h) * kLatent + lane * 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      dst[i] = make_float4(o[h][4 * i], o[h][4 * i + 1], o[h][4 * i + 2], o[h][4 * i + 3]);
    }
    if (lane == 0) {
      warp_ml[(warp * kHeads + h) * 2] = m[h];
      warp_ml[(warp * kHeads + h) * 2 + 1] = l[h];
    }
  }
  __syncthreads();

  // The block's partial: warps merged in warp order; weight 0 for warps without keys.
  float* block_o = smem + L::kBlockO;
  float* block_ml = smem + L::kBlockMl;
  for (int i = threadIdx.x; i < kHeads * kCols4; i += kThreads) {
    const int h = i / kCols4, c4 = i % kCols4;
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, warp_ml[(w * kHeads + h) * 2]);
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float lw = warp_ml[(w * kHeads + h) * 2 + 1];
      const float wt = lw > 0.0f ? exp2f(warp_ml[(w * kHeads + h) * 2] - mx) : 0.0f;
      const float4 x = reinterpret_cast<const float4*>(warp_o + (w * kHeads + h) * kLatent)[c4];
      acc.x = fmaf(wt, x.x, acc.x);
      acc.y = fmaf(wt, x.y, acc.y);
      acc.z = fmaf(wt, x.z, acc.z);
      acc.w = fmaf(wt, x.w, acc.w);
      sum = fmaf(wt, lw, sum);
    }
    reinterpret_cast<float4*>(block_o)[h * kCols4 + c4] = acc;
    if (c4 == 0) {
      block_ml[2 * h] = mx;
      block_ml[2 * h + 1] = sum;
    }
  }
  cluster.sync();  // every block's partial is complete and visible to the cluster

  // This block's columns of the output: every block's partial, in rank order.
  float* merge_ml = smem + L::kMergeMl;
  float* merge_w = smem + L::kMergeW;
  float* denom = smem + L::kDenom;
  if (threadIdx.x < kHeads * splits) {
    const int h = threadIdx.x / splits, s = threadIdx.x % splits;
    const float* remote = cluster.map_shared_rank(block_ml, s);
    merge_ml[(h * kMaxCluster + s) * 2] = remote[2 * h];
    merge_ml[(h * kMaxCluster + s) * 2 + 1] = remote[2 * h + 1];
  }
  __syncthreads();
  if (threadIdx.x < kHeads) {
    const int h = threadIdx.x;
    const float* ml = merge_ml + h * kMaxCluster * 2;
    float mx = -INFINITY;
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, ml[2 * s]);
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float wt = ml[2 * s + 1] > 0.0f ? exp2f(ml[2 * s] - mx) : 0.0f;
      merge_w[h * kMaxCluster + s] = wt;
      sum = fmaf(wt, ml[2 * s + 1], sum);
    }
    denom[h] = sum;
  }
  __syncthreads();
  const int slice4 = kCols4 / splits;
  for (int i = threadIdx.x; i < kHeads * slice4; i += kThreads) {
    const int h = i / slice4, c4 = split * slice4 + i % slice4;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = 0; s < splits; ++s) {
      const float wt = merge_w[h * kMaxCluster + s];
      const float4 x =
          reinterpret_cast<const float4*>(cluster.map_shared_rank(block_o, s))[h * kCols4 + c4];
      acc.x = fmaf(wt, x.x, acc.x);
      acc.y = fmaf(wt, x.y, acc.y);
      acc.z = fmaf(wt, x.z, acc.z);
      acc.w = fmaf(wt, x.w, acc.w);
    }
    const int hh = h0 + h;
    if (hh < heads) {
      const float d = denom[h];
      reinterpret_cast<float4*>(p.out_latent + (t * heads + hh) * kLatent)[c4] =
          make_float4(acc.x / d, acc.y / d, acc.z / d, acc.w / d);
    }
  }
  // No block leaves while others read its shared memory.
  cluster.sync();
#endif  // __CUDA_ARCH__ >= 900
}

using KernelFn = void (*)(MlaAttentionParams);

KernelFn KernelFor(int heads_per_block, bool fp8) {
  switch (heads_per_block) {
    case 1:
      return fp8 ? MlaDecodeSmallKernel<1, true> : MlaDecodeSmallKernel<1, false>;
    case 2:
      return fp8 ? MlaDecodeSmallKernel<2, true> : MlaDecodeSmallKernel<2, false>;
    default:
      return fp8 ? MlaDecodeSmallKernel<4, true> : MlaDecodeSmallKernel<4, false>;
  }
}

bool IsFp8(const MlaAttentionParams& p) { return p.cache.type == LatentCacheType::kFp8E4M3; }

size_t SmemBytes(int heads_per_block) {
  switch (heads_per_block) {
    case 1:
      return SmemLayout<1>::kFloats * sizeof(float);
    case 2:
      return SmemLayout<2>::kFloats * sizeof(float);
    default:
      return SmemLayout<4>::kFloats * sizeof(float);
  }
}

// Per (heads per block, cache type, device), queried once: whether the kernel has its sm_90 code,
// the device launches clusters and gives the block its shared memory (KernelFactsFor raises the
// dynamic limit), and non-portable cluster sizes (16) are allowed.
struct ClusterFacts {
  cudaError_t error = cudaSuccess;
  bool clusters = false;
};

ClusterFacts FactsFor(int heads_per_block, bool fp8, int device) {
  static std::mutex mu;
  static std::map<std::tuple<int, bool, int>, ClusterFacts>* facts =
      new std::map<std::tuple<int, bool, int>, ClusterFacts>();
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(heads_per_block, fp8, device);
  auto it = facts->find(key);
  if (it != facts->end()) return it->second;
  ClusterFacts f;
  const KernelFn kernel = KernelFor(heads_per_block, fp8);
  const int smem = static_cast<int>(SmemBytes(heads_per_block));
  const KernelFacts k = KernelFactsFor(reinterpret_cast<const void*>(kernel), device, smem);
  int cluster_launch = 0;
  f.error = k.error;
  if (f.error == cudaSuccess) {
    f.error = cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device);
  }
  f.clusters =
      f.error == cudaSuccess && cluster_launch != 0 && k.ptx_version >= 90 && k.max_smem >= smem;
  if (f.clusters) {
    f.error = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  }
  if (f.error != cudaSuccess) cudaGetLastError();  // reported through the return value
  facts->emplace(key, f);
  return f;
}

cudaLaunchConfig_t LaunchConfig(const MlaAttentionParams& p, int cluster, int heads_per_block,
                                cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(static_cast<unsigned>(cluster),
                   static_cast<unsigned>((p.num_heads + heads_per_block - 1) / heads_per_block),
                   static_cast<unsigned>(p.num_tokens));
  c.blockDim = dim3(kThreads, 1, 1);
  c.dynamicSmemBytes = SmemBytes(heads_per_block);
  c.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = static_cast<unsigned>(cluster);
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  c.attrs = attr;
  c.numAttrs = 1;
  return c;
}

// How many clusters of `cluster` blocks of this kernel the device runs at once (0: it cannot
// schedule one; non-portable sizes may not fit); once per (heads per block, cache type, cluster,
// device).
cudaError_t MaxActiveClusters(const MlaAttentionParams& p, int cluster, int heads_per_block,
                              int device, int* out) {
  static std::mutex mu;
  static std::map<std::tuple<int, bool, int, int>, int>* cache =
      new std::map<std::tuple<int, bool, int, int>, int>();
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(heads_per_block, IsFp8(p), cluster, device);
  auto it = cache->find(key);
  if (it == cache->end()) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t c = LaunchConfig(p, cluster, heads_per_block, nullptr, &attr);
    int n = 0;
    const cudaError_t e =
        cudaOccupancyMaxActiveClusters(&n, KernelFor(heads_per_block, IsFp8(p)), &c);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return e;
    }
    it = cache->emplace(key, n).first;
  }
  *out = it->second;
  return cudaSuccess;
}

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

bool MlaDecodeSmallSupported(const MlaAttentionParams& p) {
  // FP8: the lanes' 16-byte code loads and 4-byte rope loads need 16-byte aligned entries and a
  // 4-byte aligned rope offset.
  const bool fp8_ok =
      IsFp8(p) && Fp8LatentCacheLayoutValid(p.cache) && p.cache.fp8_rope_offset % 4 == 0;
  if ((p.cache.type != LatentCacheType::kBFloat16 && !fp8_ok) || p.cache.latent_dim != kLatent ||
      p.cache.rope_dim != kRope || p.cache.block_size <= 0 || !Aligned16(p.cache.cache) ||
      !Aligned16(p.q_latent) || !Aligned16(p.out_latent) || p.num_tokens < 1 ||
      p.num_tokens > 65535 || p.num_heads < 1) {
    return false;
  }
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const ClusterFacts f = FactsFor(1, IsFp8(p), device);
  return f.error == cudaSuccess && f.clusters;
}

MlaDecodeSmallForm MlaDecodeSmallFormFor(const MlaAttentionParams& params,
                                         const MlaDecodeSmallOptions& options) {
  return options.form == MlaDecodeSmallForm::kTensorCore && !IsFp8(params) &&
                 params.num_heads > 0 &&
                 params.num_heads % mla_decode_small_internal::kMmaHeads == 0 &&
                 mla_decode_small_internal::MmaKernelRuns()
             ? MlaDecodeSmallForm::kTensorCore
             : MlaDecodeSmallForm::kCudaCore;
}

cudaError_t MlaDecodeSmallShape(const MlaAttentionParams& params,
                                const MlaDecodeSmallOptions& options, int* cluster,
                                int* heads_per_block) {
  const int want_cluster = options.cluster_size, want_heads = options.heads_per_block;
  if (!MlaDecodeSmallSupported(params) || want_cluster < 0 || want_cluster > kMaxCluster ||
      (want_cluster & (want_cluster - 1)) != 0 ||
      (want_heads != 0 && want_heads != 1 && want_heads != 2 && want_heads != 4) ||
      (options.form != MlaDecodeSmallForm::kCudaCore &&
       options.form != MlaDecodeSmallForm::kTensorCore)) {
    return cudaErrorInvalidValue;
  }
  if (MlaDecodeSmallFormFor(params, options) == MlaDecodeSmallForm::kTensorCore) {
    if (params.num_heads / mla_decode_small_internal::kMmaHeads > 65535) {
      return cudaErrorInvalidValue;
    }
    const cudaError_t e = mla_decode_small_internal::MmaCluster(params, want_cluster, cluster);
    if (e == cudaSuccess) *heads_per_block = mla_decode_small_internal::kMmaHeads;
    return e;
  }
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  // Candidates in order of preference: the most blocks per (token, head group) first, then the
  // fewest heads per block (more blocks); the first whose clusters all run at once wins, else
  // the last (fewest clusters) that the device can schedule at all.
  int found_cluster = 0, found_heads = 0;
  for (const int c : {8, 4, 2, 1, 16}) {
    if (want_cluster != 0 ? c != want_cluster : c == 16) continue;
    for (const int h : {1, 2, 4}) {
      if (want_heads != 0 && h != want_heads) continue;
      const ClusterFacts f = FactsFor(h, IsFp8(params), device);
      if (f.error != cudaSuccess) return f.error;
      if (!f.clusters) return cudaErrorInvalidValue;
      if ((params.num_heads + h - 1) / h > 65535) continue;
      int active = 0;
      e = MaxActiveClusters(params, c, h, device, &active);
      if (e != cudaSuccess) return e;
      if (active == 0) continue;
      found_cluster = c;
      found_heads = h;
      const int64_t clusters =
          static_cast<int64_t>(params.num_tokens) * ((params.num_heads + h - 1) / h);
      if (clusters <= active) {
        *cluster = c;
        *heads_per_block = h;
        return cudaSuccess;
      }
    }
  }
  if (found_cluster == 0) return cudaErrorNotSupported;
  *cluster = found_cluster;
  *heads_per_block = found_heads;
  return cudaSuccess;
}

cudaError_t MlaDecodeSmall(const MlaAttentionParams& params, const MlaDecodeSmallOptions& options,
                           cudaStream_t stream) {
  if (params.num_tokens <= 0 || params.num_heads <= 0) return cudaSuccess;
  int cluster = 0, heads_per_block = 0;
  cudaError_t e = MlaDecodeSmallShape(params, options, &cluster, &heads_per_block);
  if (e != cudaSuccess) return e;
  if (heads_per_block == mla_decode_small_internal::kMmaHeads) {
    return mla_decode_small_internal::MmaLaunch(params, cluster, stream);
  }
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t c = LaunchConfig(params, cluster, heads_per_block, stream, &attr);
  e = cudaLaunchKernelEx(&c, KernelFor(heads_per_block, IsFp8(params)), params);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace deepinfer
