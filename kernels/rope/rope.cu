// RoPE: one block per token, threads over (head, pair), each pair rotated by rope_pair.cuh.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/common/launch.cuh"
#include "kernels/norm/block_inv_rms.cuh"
#include "kernels/rope/rope.h"
#include "kernels/rope/rope_pair.cuh"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 128;

// Pair j of a rotary slice: its two indices and the rotated values, computed once here for both
// kernels so that the fused one gives ApplyRopeF32's bits.
struct RotatedPair {
  int64_t i0, i1;
  float y0, y1;
};

using rope::RopeCosSin;
using rope::RotatedFirst;
using rope::RotatedSecond;

__device__ __forceinline__ RotatedPair RotatePair(const float* v, int64_t j, int64_t half,
                                                  float pos, const float* inv_freq,
                                                  float attention_factor, bool interleaved) {
  float cs, sn;
  RopeCosSin(pos, inv_freq[j], attention_factor, &cs, &sn);
  RotatedPair r;
  r.i0 = interleaved ? 2 * j : j;
  r.i1 = interleaved ? 2 * j + 1 : j + half;
  const float x0 = v[r.i0], x1 = v[r.i1];
  r.y0 = RotatedFirst(x0, x1, cs, sn);
  r.y1 = RotatedSecond(x0, x1, cs, sn);
  return r;
}

// RmsNormRopeF32: a warp per row, kRopeWarpRows rows per block (kFewRowsWarpRows up to
// kRopeFewRows rows: more blocks for a decode token's heads). The norm is RmsNormF32's one-warp
// row kernel (kernels/norm/rms_norm.cu, RmsNormWarpRowsBody) step for step: lane l holds elements
// l + 32 s, the sum of squares adds slots w, w + 8, ... per virtual warp w, each reduced by the
// xor butterfly and added in warp order, so the normed values are RmsNormF32's bits. The rope
// slice starts at an even element, so pair (2j, 2j + 1) of it lies in lanes l and l ^ 1 at the
// same slot: each lane takes its partner's normed value by a shuffle and computes its own half
// with RotatePair's arithmetic. With a row a block (kFewRowsWarpRows: latency-bound decode rows)
// the lane's weights and inverse frequencies are loaded before the PDL wait (RmsNormRopePrefetch:
// weights of the model), and up to kEarlyCosSinSlots slots a lane the cos/sin (which depend on
// the position only) are computed before the norm's reduction; with kRopeWarpRows rows a block
// (bandwidth-bound prefill rows, where those registers would cost occupancy) the weights and
// inverse frequencies are read after it: RmsNormRopeWideBody for one call's rows (its cos/sin in
// shared memory, once a block, where every block's rows are one token's; RmsNormRopeBf16Body for
// bf16 rows, 2 a warp), RmsNormRopeBody<kPerLane, kRopeWarpRows> for a pair's.
constexpr int kRopeWarpRows = 8;
constexpr int64_t kRopeFewRows = 128;
constexpr int kFewRowsWarpRows = 1;
constexpr int kEarlyCosSinSlots = 16;

struct RmsNormRopeParams {
  int64_t rows = 0, heads = 0, dim = 0, rope_dim = 0;
  const float* x = nullptr;
  const __nv_bfloat16* x_bf16 = nullptr;  // set: the rows are these bf16 values, x is not read
  int64_t ldx = 0;
  const float* weight = nullptr;
  float eps = 0.0f;
  float* out = nullptr;
  __nv_bfloat16* out_bf16 = nullptr;  // set: the values go here rounded, out is not written
  int64_t ldout = 0;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  float attention_factor = 1.0f;
};

// The warp's row of outputs (lane l holding elements l + 32 s in v) into p.out, or p.out_bf16
// rounded.
template <int kPerLane>
__device__ __forceinline__ void StoreWarpRow(const RmsNormRopeParams& p, int64_t row,
                                             const float (&v)[kPerLane]) {
  const int lane = static_cast<int>(threadIdx.x & 31);
#pragma unroll
  for (int s = 0; s < kPerLane; ++s) {
    const int64_t i = lane + 32 * s;
    if (i >= p.dim) continue;
    if (p.out_bf16 != nullptr) {
      p.out_bf16[row * p.ldout + i] = __float2bfloat16_rn(v[s]);
    } else {
      p.out[row * p.ldout + i] = v[s];
    }
  }
}

// A warp's row after its loads (lane l holding elements l + 32 s in v): the norm with RmsNormF32's
// one-warp reduction, the rope slice turned (cos / sin from cos_sin, the token's table, where
// kTableCosSin; else computed here), the outputs stored. The weights and inverse frequencies are
// read after the reduction (bandwidth-bound prefill rows: no registers held for them).
template <int kPerLane, bool kTableCosSin>
__device__ __forceinline__ void NormRopeStoreRow(const RmsNormRopeParams& p, int64_t row,
                                                 float (&v)[kPerLane], const float2* cos_sin) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const float inv = WarpRowInvRms<kPerLane>(v, p.dim, p.eps);
  const int64_t base = p.dim - p.rope_dim;
  const float pos = static_cast<float>(p.positions[row / p.heads]);
  // The outputs into v first, then the stores: no store comes between the loads of weight and
  // inv_freq, so they are all in flight together.
#pragma unroll
  for (int s = 0; s < kPerLane; ++s) {
    const int64_t i = lane + 32 * s;
    float o = i < p.dim ? p.weight[i] * (v[s] * inv) : 0.0f;
    const float partner = __shfl_xor_sync(0xffffffffu, o, 1);
    if (i < p.dim && i >= base) {
      float cs, sn;
      if constexpr (kTableCosSin) {
        const float2 c = cos_sin[(i - base) / 2];
        cs = c.x, sn = c.y;
      } else {
        RopeCosSin(pos, p.inv_freq[(i - base) / 2], p.attention_factor, &cs, &sn);
      }
      o = (i & 1) == 0 ? RotatedFirst(o, partner, cs, sn) : RotatedSecond(partner, o, cs, sn);
    }
    v[s] = o;
  }
  // Every lane's loads came before this point, so writing in place (out == x) is safe.
  StoreWarpRow<kPerLane>(p, row, v);
}

// The cos / sin of the rope pairs of token t into table (a thread a pair), then a barrier: every
// thread of the block calls it.
__device__ __forceinline__ void TokenCosSin(const RmsNormRopeParams& p, int64_t t, float2* table) {
  const float pos = static_cast<float>(p.positions[t]);
  for (int64_t j = threadIdx.x; j < p.rope_dim / 2; j += blockDim.x) {
    float cs, sn;
    RopeCosSin(pos, p.inv_freq[j], p.attention_factor, &cs, &sn);
    table[j] = make_float2(cs, sn);
  }
  __syncthreads();
}

// One call's fp32 rows at kRopeWarpRows rows a block (bandwidth-bound prefill rows).
// kTokenBlocks (heads a multiple of kRopeWarpRows, so each block's rows are one token's: a
// query's heads): the block first computes that token's cos / sin into shared memory (once for
// its 8 rows instead of in each row's rope slice, in double precision), then loads its rows;
// no sincos is live beside a row's values, which keeps the registers a thread needs (and so the
// rows in flight an SM holds) at what the norm needs. The same RopeCosSin either way: the same
// bits.
template <int kPerLane, bool kTokenBlocks>
__device__ void RmsNormRopeWideBody(RmsNormRopeParams p) {
  __shared__ float2 cos_sin[kTokenBlocks ? 16 * kPerLane : 1];  // rope_dim <= dim <= 32 kPerLane
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kRopeWarpRows;
  const int64_t row = first + threadIdx.x / 32;
  if constexpr (kTokenBlocks) TokenCosSin(p, first / p.heads, cos_sin);
  if (row >= p.rows) return;  // the whole warp: no barrier or shuffle below misses a lane
  const float* xr = p.x + row * p.ldx;
  float v[kPerLane];
#pragma unroll
  for (int s = 0; s < kPerLane; ++s) {
    const int64_t i = lane + 32 * s;
    v[s] = i < p.dim ? xr[i] : 0.0f;
  }
  NormRopeStoreRow<kPerLane, kTokenBlocks>(p, row, v, cos_sin);
}

// RmsNormRopeBf16's body: kBf16WarpRows rows a warp, kRopeWarpRows warps a block, each row read
// as 4-byte words of two bf16 values (word t of lane l: elements 2 (l + 32 t) and the next), all
// of the warp's rows' words loaded before the first row's arithmetic: a row's bf16 words take
// half the registers of its fp32 values, so an SM holds twice the rows in flight for the same
// registers. Each row's words are then moved by shuffles to RmsNormRopeWideBody's layout
// (element l + 32 s in lane l) and that body's arithmetic runs on them (kTokenBlocks: heads a
// multiple of the block's rows).
constexpr int kBf16WarpRows = 2;
constexpr int kBf16BlockRows = kRopeWarpRows * kBf16WarpRows;

template <int kPerLane, bool kTokenBlocks>
__device__ void RmsNormRopeBf16Body(RmsNormRopeParams p) {
  constexpr int kWords = kPerLane / 2;
  __shared__ float2 cos_sin[kTokenBlocks ? 16 * kPerLane : 1];
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kBf16BlockRows;
  const int64_t row0 = first + (threadIdx.x / 32) * kBf16WarpRows;
  if constexpr (kTokenBlocks) TokenCosSin(p, first / p.heads, cos_sin);
  if (row0 >= p.rows) return;  // the whole warp
  uint32_t w[kBf16WarpRows][kWords];
#pragma unroll
  for (int r = 0; r < kBf16WarpRows; ++r) {
    const uint32_t* xr = reinterpret_cast<const uint32_t*>(p.x_bf16 + (row0 + r) * p.ldx);
#pragma unroll
    for (int t = 0; t < kWords; ++t) {
      const int64_t word = lane + 32 * t;
      w[r][t] = row0 + r < p.rows && 2 * word < p.dim ? xr[word] : 0u;
    }
  }
  const bool odd = (lane & 1) != 0;
#pragma unroll
  for (int r = 0; r < kBf16WarpRows; ++r) {
    if (row0 + r >= p.rows) return;  // the whole warp
    // Element l + 64 t is half (l & 1) of lane l / 2's word t; element l + 32 + 64 t the same
    // half of lane 16 + l / 2's.
    float v[kPerLane];
#pragma unroll
    for (int t = 0; t < kWords; ++t) {
      const uint32_t a = __shfl_sync(0xffffffffu, w[r][t], lane >> 1);
      const uint32_t b = __shfl_sync(0xffffffffu, w[r][t], 16 + (lane >> 1));
      v[2 * t] = __uint_as_float(odd ? a & 0xffff0000u : a << 16);
      v[2 * t + 1] = __uint_as_float(odd ? b & 0xffff0000u : b << 16);
    }
    NormRopeStoreRow<kPerLane, kTokenBlocks>(p, row0 + r, v, cos_sin);
  }
}

// A lane's weights and inverse frequencies (0 outside the row / the rope slice), prefetched with a
// row a block; nothing with kRopeWarpRows rows a block.
template <int kPerLane>
struct NormRopeWeights {
  float weight[kPerLane];
  float inv_freq[kPerLane];
};
struct NoNormRopeWeights {};
template <int kPerLane, int kWarpRows>
using PrefetchedNormRope = std::conditional_t<kWarpRows == kFewRowsWarpRows,
                                              NormRopeWeights<kPerLane>, NoNormRopeWeights>;

// One launch's calls: blocks [0, first_blocks) take part[0]'s rows, the others part[1]'s
// (RmsNormRopePairF32; a single call's part[1] has no rows).
struct RmsNormRopeLaunch {
  RmsNormRopeParams part[2];
  int64_t first_blocks = 0;
};

// This warp's call and row in it.
template <int kWarpRows>
__device__ __forceinline__ RmsNormRopeParams PartOf(const RmsNormRopeLaunch& l, int64_t* row) {
  const bool second = blockIdx.x >= l.first_blocks;
  const int64_t block = static_cast<int64_t>(blockIdx.x) - (second ? l.first_blocks : 0);
  *row = block * kWarpRows + threadIdx.x / 32;
  return second ? l.part[1] : l.part[0];
}

template <int kPerLane, int kWarpRows>
__device__ PrefetchedNormRope<kPerLane, kWarpRows> RmsNormRopePrefetch(RmsNormRopeLaunch l) {
  PrefetchedNormRope<kPerLane, kWarpRows> c;
  if constexpr (kWarpRows == kFewRowsWarpRows) {
    const int lane = static_cast<int>(threadIdx.x & 31);
    int64_t row;
    const RmsNormRopeParams p = PartOf<kWarpRows>(l, &row);
    const int64_t base = p.dim - p.rope_dim;
#pragma unroll
    for (int s = 0; s < kPerLane; ++s) {
      const int64_t i = lane + 32 * s;
      const bool in_row = row < p.rows && i < p.dim;
      c.weight[s] = in_row ? __ldg(p.weight + i) : 0.0f;
      c.inv_freq[s] = in_row && i >= base ? __ldg(p.inv_freq + (i - base) / 2) : 0.0f;
    }
  }
  return c;
}

template <int kPerLane, int kWarpRows>
__device__ void RmsNormRopeBody(const PrefetchedNormRope<kPerLane, kWarpRows>& c,
                                RmsNormRopeLaunch l) {
  constexpr bool kFew = kWarpRows == kFewRowsWarpRows;
  constexpr bool kEarly = kFew && kPerLane <= kEarlyCosSinSlots;
  const int lane = static_cast<int>(threadIdx.x & 31);
  int64_t row;
  const RmsNormRopeParams p = PartOf<kWarpRows>(l, &row);
  if (row >= p.rows) return;  // the whole warp: no barrier or shuffle below misses a lane
  const float* xr = p.x + row * p.ldx;
  const float pos = static_cast<float>(p.positions[row / p.heads]);
  float v[kPerLane];
#pragma unroll
  for (int s = 0; s < kPerLane; ++s) {
    const int64_t i = lane + 32 * s;
    v[s] = i < p.dim ? xr[i] : 0.0f;
  }
  const int64_t base = p.dim - p.rope_dim;
  float cs[kEarly ? kPerLane : 1], sn[kEarly ? kPerLane : 1];
  if constexpr (kEarly) {
#pragma unroll
    for (int s = 0; s < kPerLane; ++s) {
      const int64_t i = lane + 32 * s;
      cs[s] = 0.0f, sn[s] = 0.0f;
      if (i < p.dim && i >= base)
        RopeCosSin(pos, c.inv_freq[s], p.attention_factor, &cs[s], &sn[s]);
    }
  }
  const float inv = WarpRowInvRms<kPerLane>(v, p.dim, p.eps);
  // The outputs into v first, then the stores: no store comes between the loads of the weights
  // and inverse frequencies where they were not prefetched, so they are all in flight together.
#pragma unroll
  for (int s = 0; s < kPerLane; ++s) {
    const int64_t i = lane + 32 * s;
    float weight = 0.0f;
    if constexpr (kFew) {
      weight = c.weight[s];
    } else {
      if (i < p.dim) weight = p.weight[i];
    }
    float o = i < p.dim ? weight * (v[s] * inv) : 0.0f;
    const float partner = __shfl_xor_sync(0xffffffffu, o, 1);
    if (i < p.dim && i >= base) {
      float cos_s, sin_s;
      if constexpr (kEarly) {
        cos_s = cs[s], sin_s = sn[s];
      } else {
        float inv_freq;
        if constexpr (kFew) {
          inv_freq = c.inv_freq[s];
        } else {
          inv_freq = p.inv_freq[(i - base) / 2];
        }
        RopeCosSin(pos, inv_freq, p.attention_factor, &cos_s, &sin_s);
      }
      o = (i & 1) == 0 ? RotatedFirst(o, partner, cos_s, sin_s)
                       : RotatedSecond(partner, o, cos_s, sin_s);
    }
    v[s] = o;
  }
  // Every lane's loads came before this point, so writing in place (out == x) is safe.
  StoreWarpRow<kPerLane>(p, row, v);
}

// Token blockIdx.x's pairs (head, pair) from blockIdx.y * kThreads + threadIdx.x on, strided by
// the grid's threads along y.
__device__ void RopeBody(int64_t heads, float* x, int64_t token_stride, int64_t head_stride,
                         int64_t rope_dim, const int32_t* positions, const float* inv_freq,
                         float attention_factor, bool interleaved) {
  const int64_t t = blockIdx.x;
  const int64_t half = rope_dim / 2;
  const float pos = static_cast<float>(positions[t]);
  for (int64_t w = int64_t{blockIdx.y} * kThreads + threadIdx.x; w < heads * half;
       w += int64_t{kThreads} * gridDim.y) {
    const int64_t h = w / half, j = w % half;
    float* v = x + t * token_stride + h * head_stride;
    const RotatedPair r = RotatePair(v, j, half, pos, inv_freq, attention_factor, interleaved);
    v[r.i0] = r.y0;
    v[r.i1] = r.y1;
  }
}

// The fused kernel's block: RmsNormF32's (256 threads, the same partition of the row and the
// same reduction, so the same bits).
constexpr int kNormThreads = 256;

__device__ __forceinline__ void StoreEntry(float x, float* dst) { *dst = x; }
__device__ __forceinline__ void StoreEntry(float x, __nv_bfloat16* dst) {
  *dst = __float2bfloat16_rn(x);
}

// NormRopeWriteLatentCacheF32's work for token t, by one block of kNormThreads threads.
template <typename T>
__device__ void NormRopeCacheToken(const NormRopeCacheParams& p, int64_t t) {
  __shared__ float partial[kNormThreads / 32];
  __shared__ float inv_rms;
  const int64_t latent = p.latent_dim, half = p.rope_dim / 2;
  const float* kv = p.kv + t * p.ld_kv;
  T* dst = static_cast<T*>(p.cache) + static_cast<int64_t>(p.slots[t]) * (latent + p.rope_dim);
  const float pos = static_cast<float>(p.positions[t]);
  // Query rope first: independent of the norm, it overlaps the reduction's wait.
  for (int64_t w = threadIdx.x; w < p.q_heads * half; w += kNormThreads) {
    const int64_t h = w / half, j = w % half;
    float* v = p.q + t * p.q_token_stride + h * p.q_head_stride;
    const RotatedPair r =
        RotatePair(v, j, half, pos, p.inv_freq, p.attention_factor, p.interleaved);
    v[r.i0] = r.y0;
    v[r.i1] = r.y1;
  }
  // The shared rope key, straight into the cache entry.
  for (int64_t j = threadIdx.x; j < half; j += kNormThreads) {
    const RotatedPair r =
        RotatePair(kv + latent, j, half, pos, p.inv_freq, p.attention_factor, p.interleaved);
    StoreEntry(r.y0, dst + latent + r.i0);
    StoreEntry(r.y1, dst + latent + r.i1);
  }
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < latent; i += kNormThreads) ss += kv[i] * kv[i];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kNormThreads / 32; ++w) total += partial[w];
    inv_rms = 1.0f / sqrtf(total / static_cast<float>(latent) + p.eps);
  }
  __syncthreads();
  const float inv = inv_rms;
  for (int64_t i = threadIdx.x; i < latent; i += kNormThreads) {
    StoreEntry(p.norm_weight[i] * (kv[i] * inv), dst + i);
  }
}

template <typename T>
__device__ void NormRopeCacheBody(NormRopeCacheParams p) {
  NormRopeCacheToken<T>(p, blockIdx.x);
}

// NormRopeCacheAbsorbQueryF32: blocks [0, tokens) run NormRopeCacheToken, the others the W_uk
// product, G lanes a weight row as SmallMGemmBf16's kRowPerGroup (same lanes, same chunk order,
// same shuffle sums, so the same bits), each lane at most kAbsorbChunks 16-byte chunks of it,
// all loaded before the wait (W_uk is never written during a step).
constexpr int kAbsorbChunks = 2;

struct AbsorbChunks {
  uint4 q[kAbsorbChunks];
};

// This thread's weight row of the product: token t, head h, row j (j >= latent_dim: none).
struct AbsorbRow {
  int64_t t, h, j;
};

template <int G>
__device__ __forceinline__ AbsorbRow AbsorbRowOf(const NormRopeCacheParams& p,
                                                 const AbsorbQueryParams& a) {
  constexpr int kRowsPerBlock = kNormThreads / G;
  const int64_t blocks_per_head = (a.latent_dim + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t b = static_cast<int64_t>(blockIdx.x) - p.tokens;
  AbsorbRow r;
  r.t = b / (a.heads * blocks_per_head);
  const int64_t in_token = b % (a.heads * blocks_per_head);
  r.h = in_token / blocks_per_head;
  r.j = in_token % blocks_per_head * kRowsPerBlock + threadIdx.x / G;
  return r;
}

template <int G>
__device__ AbsorbChunks AbsorbPrefetch(NormRopeCacheParams p, AbsorbQueryParams a) {
  AbsorbChunks c = {};
  if (blockIdx.x < p.tokens) return c;
  const AbsorbRow r = AbsorbRowOf<G>(p, a);
  if (r.j >= a.latent_dim) return c;
  const uint16_t* wr = a.w + (r.h * a.latent_dim + r.j) * a.nope_dim;
#pragma unroll
  for (int u = 0; u < kAbsorbChunks; ++u) {
    const int64_t k0 = 8 * (threadIdx.x % G) + u * 8 * G;
    if (k0 < a.nope_dim) c.q[u] = __ldg(reinterpret_cast<const uint4*>(wr + k0));
  }
  return c;
}

__device__ __forceinline__ float RoundBf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

template <typename T, int G>
__device__ void NormRopeCacheAbsorbBody(const AbsorbChunks& c, NormRopeCacheParams p,
                                        AbsorbQueryParams a) {
  if (blockIdx.x < p.tokens) {
    NormRopeCacheToken<T>(p, blockIdx.x);
    return;
  }
  const AbsorbRow r = AbsorbRowOf<G>(p, a);
  float acc = 0.0f;
  if (r.j < a.latent_dim) {
    const float* q = a.q_nope + r.t * a.q_token_stride + r.h * a.q_head_stride;
#pragma unroll
    for (int u = 0; u < kAbsorbChunks; ++u) {
      const int64_t k0 = 8 * (threadIdx.x % G) + u * 8 * G;
      if (k0 >= a.nope_dim) continue;
      // Plain loads: the token's rope slices are rotated in place by this grid's other blocks.
      const float4 x = *reinterpret_cast<const float4*>(q + k0);
      const float4 y = *reinterpret_cast<const float4*>(q + k0 + 4);
      const float av[8] = {RoundBf16(x.x), RoundBf16(x.y), RoundBf16(x.z), RoundBf16(x.w),
                           RoundBf16(y.x), RoundBf16(y.y), RoundBf16(y.z), RoundBf16(y.w)};
      const uint4 w = c.q[u];
      const float wv[8] = {__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u),
                           __uint_as_float(w.y << 16), __uint_as_float(w.y & 0xffff0000u),
                           __uint_as_float(w.z << 16), __uint_as_float(w.z & 0xffff0000u),
                           __uint_as_float(w.w << 16), __uint_as_float(w.w & 0xffff0000u)};
#pragma unroll
      for (int e = 0; e < 8; ++e) acc = fmaf(av[e], wv[e], acc);
    }
  }
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (r.j < a.latent_dim && threadIdx.x % G == 0) {
    a.out[(r.t * a.heads + r.h) * a.latent_dim + r.j] = acc;
  }
}

template <typename T, int G>
cudaError_t LaunchNormRopeCacheAbsorb(const NormRopeCacheParams& p, const AbsorbQueryParams& a,
                                      cudaStream_t stream) {
  constexpr int64_t kRowsPerBlock = kNormThreads / G;
  const int64_t blocks =
      p.tokens + p.tokens * a.heads * ((a.latent_dim + kRowsPerBlock - 1) / kRowsPerBlock);
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  return LaunchPrefetchThenAfterPrecedingGrids<AbsorbPrefetch<G>, NormRopeCacheAbsorbBody<T, G>,
                                               kNormThreads>(static_cast<unsigned>(blocks), 0,
                                                             stream, p, a);
}

template <typename T>
cudaError_t LaunchNormRopeCacheAbsorbForK(const NormRopeCacheParams& p, const AbsorbQueryParams& a,
                                          cudaStream_t stream) {
  // SmallMGemmBf16's group width for k = nope_dim.
  if (a.nope_dim >= 256) return LaunchNormRopeCacheAbsorb<T, 32>(p, a, stream);
  if (a.nope_dim >= 128) return LaunchNormRopeCacheAbsorb<T, 16>(p, a, stream);
  return LaunchNormRopeCacheAbsorb<T, 8>(p, a, stream);
}

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

bool NormRopeCacheParamsValid(const NormRopeCacheParams& p) {
  return p.tokens <= 0x7fffffff && p.rope_dim % 2 == 0 && p.latent_dim > 0 && p.rope_dim >= 0 &&
         (p.q_heads == 0 || p.q != nullptr);
}

}  // namespace

cudaError_t ApplyRopeF32(int64_t tokens, int64_t heads, float* x, int64_t token_stride,
                         int64_t head_stride, int64_t rope_dim, const int32_t* positions,
                         const float* inv_freq, float attention_factor, bool interleaved,
                         cudaStream_t stream) {
  if (tokens <= 0 || heads <= 0 || rope_dim <= 0) return cudaSuccess;
  if (rope_dim % 2 != 0 || tokens > 0x7fffffff) return cudaErrorInvalidValue;
  // A few tokens (decode) spread their pairs over blocks along y, up to kRopeSpreadBlocks blocks
  // in all: one 128-thread block would evaluate a token's 64 heads x 32 pairs (DeepSeek-V4's query)
  // in 16 rounds of double-precision sincos per thread. Each pair's arithmetic is unchanged.
  constexpr int64_t kRopeSpreadBlocks = 256;
  const int64_t pair_blocks = (heads * (rope_dim / 2) + kThreads - 1) / kThreads;
  const int64_t per_token = std::max<int64_t>(
      1, std::min<int64_t>(pair_blocks, (kRopeSpreadBlocks + tokens - 1) / tokens));
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(per_token));
  return LaunchAfterPrecedingGrids<RopeBody, kThreads>(grid, 0, stream, heads, x, token_stride,
                                                       head_stride, rope_dim, positions, inv_freq,
                                                       attention_factor, interleaved);
}

bool RmsNormRopeSupported(int64_t tokens, int64_t heads, int64_t dim, int64_t rope_dim) {
  return tokens >= 0 && heads >= 1 && dim >= 1 && dim <= kRmsNormRopeMaxDim && rope_dim >= 2 &&
         rope_dim <= dim && rope_dim % 2 == 0 && (dim - rope_dim) % 2 == 0 &&
         tokens * heads <= int64_t{0x7fffffff} * kRopeWarpRows;
}

namespace {

template <int kPerLane, int kWarpRows>
cudaError_t LaunchRmsNormRopeRows(const RmsNormRopeParams& a, const RmsNormRopeParams& b,
                                  cudaStream_t stream) {
  RmsNormRopeLaunch l;
  l.part[0] = a;
  l.part[1] = b;
  l.first_blocks = (a.rows + kWarpRows - 1) / kWarpRows;
  const int64_t blocks = l.first_blocks + (b.rows + kWarpRows - 1) / kWarpRows;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  const unsigned grid = static_cast<unsigned>(blocks);
  return LaunchPrefetchThenAfterPrecedingGrids<RmsNormRopePrefetch<kPerLane, kWarpRows>,
                                               RmsNormRopeBody<kPerLane, kWarpRows>,
                                               kWarpRows * 32>(grid, 0, stream, l);
}

// One call's rows in the 8-warp bodies: bf16 rows RmsNormRopeBf16Body (16 rows a block), fp32
// rows RmsNormRopeWideBody (8), each with the token's cos / sin table where every block's rows
// are one token's.
template <int kPerLane>
cudaError_t LaunchRmsNormRopeWide(const RmsNormRopeParams& a, cudaStream_t stream) {
  const bool bf16 = a.x_bf16 != nullptr;
  const int64_t block_rows = bf16 ? kBf16BlockRows : kRopeWarpRows;
  const int64_t blocks = (a.rows + block_rows - 1) / block_rows;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  const unsigned grid = static_cast<unsigned>(blocks);
  constexpr int kThreads = kRopeWarpRows * 32;
  if (a.heads % block_rows == 0) {
    return bf16 ? LaunchAfterPrecedingGrids<RmsNormRopeBf16Body<kPerLane, true>, kThreads>(
                      grid, 0, stream, a)
                : LaunchAfterPrecedingGrids<RmsNormRopeWideBody<kPerLane, true>, kThreads>(
                      grid, 0, stream, a);
  }
  return bf16 ? LaunchAfterPrecedingGrids<RmsNormRopeBf16Body<kPerLane, false>, kThreads>(grid, 0,
                                                                                          stream, a)
              : LaunchAfterPrecedingGrids<RmsNormRopeWideBody<kPerLane, false>, kThreads>(
                    grid, 0, stream, a);
}

template <int kPerLane>
cudaError_t LaunchRmsNormRopeFor(const RmsNormRopeParams& a, const RmsNormRopeParams& b,
                                 RopeRows rows_shape, cudaStream_t stream) {
  // bf16 rows (one call): RmsNormRopeBf16Body at every row count.
  if (a.x_bf16 == nullptr && rows_shape == RopeRows::kAuto && a.rows + b.rows <= kRopeFewRows)
    return LaunchRmsNormRopeRows<kPerLane, kFewRowsWarpRows>(a, b, stream);
  if (b.rows == 0) return LaunchRmsNormRopeWide<kPerLane>(a, stream);
  return LaunchRmsNormRopeRows<kPerLane, kRopeWarpRows>(a, b, stream);
}

// The register layout's slots a lane for rows of dim values.
int PerLaneOf(int64_t dim) { return dim <= 256 ? 8 : dim <= 512 ? 16 : dim <= 1024 ? 32 : 64; }

// a's rows, then b's (rows 0: none), in one launch; a.dim and b.dim of one PerLaneOf.
cudaError_t LaunchRmsNormRope(const RmsNormRopeParams& a, const RmsNormRopeParams& b,
                              RopeRows rows_shape, cudaStream_t stream) {
  switch (PerLaneOf(a.dim)) {
    case 8:
      return LaunchRmsNormRopeFor<8>(a, b, rows_shape, stream);
    case 16:
      return LaunchRmsNormRopeFor<16>(a, b, rows_shape, stream);
    case 32:
      return LaunchRmsNormRopeFor<32>(a, b, rows_shape, stream);
    default:
      return LaunchRmsNormRopeFor<64>(a, b, rows_shape, stream);
  }
}

}  // namespace

cudaError_t RmsNormRopeF32(int64_t tokens, int64_t heads, int64_t dim, const float* x, int64_t ldx,
                           const float* weight, float eps, float* out, int64_t ldout,
                           int64_t rope_dim, const int32_t* positions, const float* inv_freq,
                           float attention_factor, cudaStream_t stream, RopeRows rows_shape) {
  if (!RmsNormRopeSupported(tokens, heads, dim, rope_dim)) return cudaErrorInvalidValue;
  if (tokens == 0) return cudaSuccess;
  RmsNormRopeParams p;
  p.rows = tokens * heads, p.heads = heads, p.dim = dim, p.rope_dim = rope_dim;
  p.x = x, p.ldx = ldx, p.weight = weight, p.eps = eps, p.out = out, p.ldout = ldout;
  p.positions = positions, p.inv_freq = inv_freq, p.attention_factor = attention_factor;
  return LaunchRmsNormRope(p, RmsNormRopeParams{}, rows_shape, stream);
}

cudaError_t RmsNormRopeToBf16(int64_t tokens, int64_t heads, int64_t dim, const float* x,
                              int64_t ldx, const float* weight, float eps, uint16_t* out,
                              int64_t ldout, int64_t rope_dim, const int32_t* positions,
                              const float* inv_freq, float attention_factor, cudaStream_t stream,
                              RopeRows rows_shape) {
  if (!RmsNormRopeSupported(tokens, heads, dim, rope_dim)) return cudaErrorInvalidValue;
  if (tokens == 0) return cudaSuccess;
  if (out == nullptr) return cudaErrorInvalidValue;
  RmsNormRopeParams p;
  p.rows = tokens * heads, p.heads = heads, p.dim = dim, p.rope_dim = rope_dim;
  p.x = x, p.ldx = ldx, p.weight = weight, p.eps = eps;
  p.out_bf16 = reinterpret_cast<__nv_bfloat16*>(out), p.ldout = ldout;
  p.positions = positions, p.inv_freq = inv_freq, p.attention_factor = attention_factor;
  return LaunchRmsNormRope(p, RmsNormRopeParams{}, rows_shape, stream);
}

cudaError_t RmsNormRopeBf16(int64_t tokens, int64_t heads, int64_t dim, const uint16_t* x,
                            int64_t ldx, const float* weight, float eps, uint16_t* out,
                            int64_t ldout, int64_t rope_dim, const int32_t* positions,
                            const float* inv_freq, float attention_factor, cudaStream_t stream) {
  if (!RmsNormRopeSupported(tokens, heads, dim, rope_dim)) return cudaErrorInvalidValue;
  if (tokens == 0) return cudaSuccess;
  if (x == nullptr || out == nullptr || (x == out && ldx != ldout) || ldx % 2 != 0 ||
      reinterpret_cast<uintptr_t>(x) % 4 != 0) {
    return cudaErrorInvalidValue;
  }
  RmsNormRopeParams p;
  p.rows = tokens * heads, p.heads = heads, p.dim = dim, p.rope_dim = rope_dim;
  p.x_bf16 = reinterpret_cast<const __nv_bfloat16*>(x), p.ldx = ldx, p.weight = weight;
  p.eps = eps, p.out_bf16 = reinterpret_cast<__nv_bfloat16*>(out), p.ldout = ldout;
  p.positions = positions, p.inv_freq = inv_freq, p.attention_factor = attention_factor;
  return LaunchRmsNormRope(p, RmsNormRopeParams{}, RopeRows::kWide, stream);
}

bool RmsNormRopePairSupported(const RmsNormRopeRows& a, const RmsNormRopeRows& b,
                              int64_t rope_dim) {
  return RmsNormRopeSupported(a.tokens, a.heads, a.dim, rope_dim) &&
         RmsNormRopeSupported(b.tokens, b.heads, b.dim, rope_dim) &&
         PerLaneOf(a.dim) == PerLaneOf(b.dim) && a.x != nullptr && b.x != nullptr &&
         a.out != nullptr && b.out != nullptr;
}

cudaError_t RmsNormRopePairF32(const RmsNormRopeRows& a, const RmsNormRopeRows& b, float eps,
                               int64_t rope_dim, const int32_t* positions, const float* inv_freq,
                               float attention_factor, cudaStream_t stream, RopeRows rows_shape) {
  if (!RmsNormRopePairSupported(a, b, rope_dim)) return cudaErrorInvalidValue;
  RmsNormRopeParams p[2];
  for (int i = 0; i < 2; ++i) {
    const RmsNormRopeRows& r = i == 0 ? a : b;
    p[i].rows = r.tokens * r.heads, p[i].heads = r.heads, p[i].dim = r.dim;
    p[i].rope_dim = rope_dim;
    p[i].x = r.x, p[i].ldx = r.ldx, p[i].weight = r.weight, p[i].eps = eps;
    p[i].out = r.out, p[i].ldout = r.ldout;
    p[i].positions = positions, p[i].inv_freq = inv_freq;
    p[i].attention_factor = attention_factor;
  }
  if (p[0].rows + p[1].rows == 0) return cudaSuccess;
  return LaunchRmsNormRope(p[0], p[1], rows_shape, stream);
}

cudaError_t NormRopeWriteLatentCacheF32(const NormRopeCacheParams& p, cudaStream_t stream) {
  if (p.tokens <= 0) return cudaSuccess;
  if (!NormRopeCacheParamsValid(p)) return cudaErrorInvalidValue;
  const unsigned grid = static_cast<unsigned>(p.tokens);
  if (p.cache_bf16) {
    return LaunchAfterPrecedingGrids<NormRopeCacheBody<__nv_bfloat16>, kNormThreads>(grid, 0,
                                                                                     stream, p);
  }
  return LaunchAfterPrecedingGrids<NormRopeCacheBody<float>, kNormThreads>(grid, 0, stream, p);
}

bool NormRopeCacheAbsorbQuerySupported(const NormRopeCacheParams& p, const AbsorbQueryParams& a) {
  return NormRopeCacheParamsValid(p) && p.tokens >= 1 && p.tokens <= 4 && p.q != nullptr &&
         p.q_heads > 0 && a.heads >= 1 && a.heads <= 65535 && a.latent_dim >= 1 &&
         a.latent_dim <= (int64_t{1} << 20) && a.nope_dim >= 64 && a.nope_dim <= 512 &&
         a.nope_dim % 8 == 0 && a.q_nope != nullptr && a.w != nullptr && a.out != nullptr &&
         Aligned16(a.q_nope) && Aligned16(a.w) && a.q_token_stride % 4 == 0 &&
         a.q_head_stride % 4 == 0;
}

cudaError_t NormRopeCacheAbsorbQueryF32(const NormRopeCacheParams& p, const AbsorbQueryParams& a,
                                        cudaStream_t stream) {
  if (!NormRopeCacheAbsorbQuerySupported(p, a)) return cudaErrorInvalidValue;
  if (p.cache_bf16) return LaunchNormRopeCacheAbsorbForK<__nv_bfloat16>(p, a, stream);
  return LaunchNormRopeCacheAbsorbForK<float>(p, a, stream);
}

}  // namespace kernels
}  // namespace deepinfer
