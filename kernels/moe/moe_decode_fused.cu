// The kernels stream bf16 weight rows with 16-byte loads (8 values per load), convert them to
// fp32 with a shift and multiply them with fp32 activations that come through L1 (a few KB per
// token; the stationary down: held in registers), all launched with programmatic dependent
// launch (kernels/common/launch.cuh): the routing, written by the kernel before gate_up, is read
// only after the wait, except in down kernels (the grid-strided down's L2 prefetch hint, the
// stationary down's chunk resolution; see there why that is safe).
//
// gate_up is grid-strided (the pipelined kernel below); down is the stationary kernel at one
// token where a thread's chunks fit, else the pipelined grid-strided one (MoeDecodeFusedF32).
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/common/kernel_facts.h"
#include "kernels/common/launch.cuh"
#include "kernels/common/streaming_load.cuh"
#include "kernels/moe/moe_decode_fused.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kUnroll = 8;

__device__ __forceinline__ void Bf16x8ToFloat(const uint4& v, float f[8]) {
  const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}

// s += dot(a[0..3], w[0..3]) + dot(b[0..3], w[4..7]) in that order.
__device__ __forceinline__ float Dot8(float s, const float4& a, const float4& b, const float w[8]) {
  s = fmaf(a.x, w[0], s);
  s = fmaf(a.y, w[1], s);
  s = fmaf(a.z, w[2], s);
  s = fmaf(a.w, w[3], s);
  s = fmaf(b.x, w[4], s);
  s = fmaf(b.y, w[5], s);
  s = fmaf(b.z, w[6], s);
  s = fmaf(b.w, w[7], s);
  return s;
}

__device__ __forceinline__ float WarpSum(float s) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

__device__ __forceinline__ bool ValidExpert(const MoeDecodeFusedParams& p, int32_t e) {
  return e >= 0 && e < p.num_experts;
}

// ---- The part table --------------------------------------------------------------------
//
// The grid-strided kernels first resolve the block's work into a table of unique parts in
// shared memory (warp 0, once per block): the shared parts first, then every routed expert once
// (the first token's column that chose it), each with its weights and, per token, its act row
// (null: the token did not choose it) and routing weight. gate_up's work is the (part, row)
// pairs, part major, one warp each, grid-strided; down's is the output features, one block each,
// grid-strided, the parts' rows of a feature flattened over the block's threads (each thread up
// to kDownLoads 16-byte loads in flight). Weights are read with L1::no_allocate so that the
// fp32 hidden / act rows stay in L1.
//
// Before its PDL wait the grid-strided down prefetches into L2 the rows of its first feature of
// every part. It reads topk_ids for that before its wait: the router that wrote them has
// completed, because down is launched only after every gate_up block passed its own wait. A
// prefetch is only a hint (a wrong address costs bandwidth, never a result), and the table is
// built from the routing after the wait.

constexpr int kDownThreads = 128;
constexpr int kDownWarps = kDownThreads / 32;
constexpr int kDownLoads = 12;

template <int kT>
struct PartTable {
  static constexpr int kMaxParts = kT * kMoeDecodeFusedMaxParts;
  int count;
  const uint16_t* gate[kMaxParts];  // gate row 0; the up rows follow at up[u]
  const uint16_t* up[kMaxParts];
  const uint16_t* down[kMaxParts];  // row f at down[u] + f * down_stride[u]
  int32_t down_stride[kMaxParts];
  float* act[kMaxParts][kT];  // token t's act row of this part, null: not chosen by t
  float coef[kMaxParts][kT];
};

// Run by one whole warp.
template <int kT>
__device__ void BuildPartTable(const MoeDecodeFusedParams& p, PartTable<kT>* tab) {
  const int lane = threadIdx.x % 32;
  const int K = p.top_k, S = p.shared_parts, P = K + S, H = p.hidden_size, I = p.inter;
  for (int s = lane; s < S; s += 32) {
    tab->gate[s] = p.shared_gate_up + int64_t{s} * I * H;
    tab->up[s] = p.shared_gate_up + (int64_t{S} + s) * I * H;
    tab->down[s] = p.shared_down + int64_t{s} * I;
    tab->down_stride[s] = S * I;
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      tab->act[s][t] = p.act + (int64_t{t} * P + K + s) * I;
      tab->coef[s][t] = 1.0f;
    }
  }
  int count = S;
  for (int c0 = 0; c0 < kT * K; c0 += 32) {
    const int c = c0 + lane;
    bool live = false;
    int32_t e = -1;
    int part[kT];
    if (c < kT * K) {
      const int t = c / K;
      e = p.topk_ids[c];
      live = ValidExpert(p, e);
#pragma unroll
      for (int u = 0; u < kT; ++u) {
        part[u] = -1;
        for (int j = 0; j < K; ++j) {
          if (p.topk_ids[u * K + j] == e) part[u] = j;
        }
        if (u < t && part[u] >= 0) live = false;  // an earlier token's column has this expert
      }
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, live);
    if (live) {
      const int u = count + __popc(ballot & ((1u << lane) - 1u));
      const int32_t slot = p.slot_of_expert[e];
      tab->gate[u] = p.gate_up[slot];
      tab->up[u] = p.gate_up[slot] + int64_t{I} * H;
      tab->down[u] = p.down[slot];
      tab->down_stride[u] = I;
#pragma unroll
      for (int t = 0; t < kT; ++t) {
        tab->act[u][t] = part[t] >= 0 ? p.act + (int64_t{t} * P + part[t]) * I : nullptr;
        tab->coef[u][t] = part[t] >= 0 ? p.topk_weights[t * K + part[t]] : 0.0f;
      }
    }
    count += __popc(ballot);
  }
  if (lane == 0) tab->count = count;
}

// Thread c < shared_parts + tokens * top_k prefetches part c's row of the block's first feature.
template <int kT>
__device__ NoPrefetchResult DownPrefetch(MoeDecodeFusedParams p) {
  const int f = blockIdx.x, c = threadIdx.x;
  const int K = p.top_k, S = p.shared_parts, I = p.inter;
  const uint32_t row_bytes = static_cast<uint32_t>(I) * 2;
  if (f >= p.hidden_size) return {};
  if (c < S) {
    PrefetchL2(p.shared_down + int64_t{f} * S * I + int64_t{c} * I, row_bytes);
  } else if (c < S + kT * K) {
    const int32_t e = __ldcg(p.topk_ids + (c - S));
    if (!ValidExpert(p, e)) return {};
    const int32_t slot = __ldg(p.slot_of_expert + e);
    if (slot >= 0) PrefetchL2(p.down[slot] + int64_t{f} * I, row_bytes);
  }
  return {};
}

// ---- The pipelined grid-strided kernels -----------------------------------------------------
//
// The load round trips overlapped instead of taken one after another:
//
// * gate_up: a warp whose first item is a shared part's row pair loads that pair's first chunk
//   (8 16-byte loads per lane and row) into registers BEFORE the PDL wait (shared weights are
//   written by no kernel), and computes it right after the wait without the part table: warp 0
//   builds the table while its own loads are in flight, the other warps do not wait for it. After
//   the one __syncthreads each warp issues the first chunk of its next item before it computes
//   the current one, so a warp always has a row pair in flight.
// * down: a block's features are a sequence; the first batch of loads of feature n + 1 is issued
//   before feature n is summed, and a feature's per-warp sums go to shared memory without a
//   __syncthreads (one at the end, then the warps' sums in order), so the warps
//   of a block never wait for each other between features.

// First chunk of a gate / up row pair: lane's vectors lane + 32 n, n < kUnroll.
struct GateUpChunk {
  uint4 g[kUnroll], u[kUnroll];
};

// Vectors v0 + 32 n (< kv) of the rows at gate / up.
__device__ __forceinline__ void LoadGateUpChunk(const uint16_t* gate, const uint16_t* up, int v0,
                                                int kv, GateUpChunk* c) {
#pragma unroll
  for (int n = 0; n < kUnroll; ++n) {
    const int v = v0 + n * 32;
    c->g[n] = v < kv ? LoadStreaming16(gate + 8 * v) : make_uint4(0, 0, 0, 0);
    c->u[n] = v < kv ? LoadStreaming16(up + 8 * v) : make_uint4(0, 0, 0, 0);
  }
}

template <int kT>
__device__ __forceinline__ void AccumulateGateUpChunk(const GateUpChunk& c, int v0, int kv,
                                                      const float* hidden, int H,
                                                      float* const act[kT], float ag[kT],
                                                      float au[kT]) {
#pragma unroll
  for (int n = 0; n < kUnroll; ++n) {
    const int v = v0 + n * 32;
    if (v >= kv) break;
    float gf[8], uf[8];
    Bf16x8ToFloat(c.g[n], gf);
    Bf16x8ToFloat(c.u[n], uf);
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      if (act[t] == nullptr) continue;
      const float4* x = reinterpret_cast<const float4*>(hidden + int64_t{t} * H);
      const float4 a = __ldg(x + 2 * v), b = __ldg(x + 2 * v + 1);
      ag[t] = Dot8(ag[t], a, b, gf);
      au[t] = Dot8(au[t], a, b, uf);
    }
  }
}

// Row j's item (rows at gate / up, act rows act[t]) with its first chunk already in `first`:
// the remaining chunks, the butterflies and act[t][j].
template <int kT>
__device__ __forceinline__ void FinishGateUpItem(const MoeDecodeFusedParams& p,
                                                 const GateUpChunk& first, const uint16_t* gate,
                                                 const uint16_t* up, float* const act[kT], int j) {
  const int H = p.hidden_size, kv = H / 8, lane = threadIdx.x % 32;
  float ag[kT], au[kT];
#pragma unroll
  for (int t = 0; t < kT; ++t) ag[t] = au[t] = 0.0f;
  AccumulateGateUpChunk<kT>(first, lane, kv, p.hidden, H, act, ag, au);
  for (int v0 = lane + 32 * kUnroll; v0 < kv; v0 += 32 * kUnroll) {
    GateUpChunk c;
    LoadGateUpChunk(gate, up, v0, kv, &c);
    AccumulateGateUpChunk<kT>(c, v0, kv, p.hidden, H, act, ag, au);
  }
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    if (act[t] == nullptr) continue;
    float gs = WarpSum(ag[t]), us = WarpSum(au[t]);
    if (p.swiglu_limit > 0.0f) {
      gs = fminf(gs, p.swiglu_limit);
      us = fminf(fmaxf(us, -p.swiglu_limit), p.swiglu_limit);
    }
    // expf (not __expf), as SiluMulF32.
    if (lane == t) act[t][j] = gs / (1.0f + expf(-gs)) * us;
  }
}

// Item i < shared_parts * inter: shared part i / inter's row pair i % inter (the table's order).
__device__ __forceinline__ void SharedGateUpRows(const MoeDecodeFusedParams& p, int i,
                                                 const uint16_t** gate, const uint16_t** up) {
  const int S = p.shared_parts, I = p.inter, H = p.hidden_size;
  const int s = i / I, j = i - s * I;
  *gate = p.shared_gate_up + (int64_t{s} * I + j) * H;
  *up = p.shared_gate_up + ((int64_t{S} + s) * I + j) * H;
}

// The warp's first item's first chunk, if that item is a shared part's (else zeros, unused);
// the rest of such a row pair is prefetched into L2.
template <int kT>
__device__ GateUpChunk GateUpPipelinedPrefetch(MoeDecodeFusedParams p) {
  GateUpChunk c;
  const int i = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kv = p.hidden_size / 8;
  if (i < p.shared_parts * p.inter) {
    const uint16_t *gate, *up;
    SharedGateUpRows(p, i, &gate, &up);
    LoadGateUpChunk(gate, up, lane, kv, &c);
    if (lane == 0 && kv > 32 * kUnroll) {
      const uint32_t rest = static_cast<uint32_t>(kv - 32 * kUnroll) * 16;
      PrefetchL2(gate + 8 * 32 * kUnroll, rest);
      PrefetchL2(up + 8 * 32 * kUnroll, rest);
    }
  } else {
#pragma unroll
    for (int n = 0; n < kUnroll; ++n) c.g[n] = c.u[n] = make_uint4(0, 0, 0, 0);
  }
  return c;
}

template <int kT>
__device__ void GateUpPipelinedBody(const GateUpChunk& prefetched, MoeDecodeFusedParams p) {
  __shared__ PartTable<kT> tab;
  const int K = p.top_k, P = K + p.shared_parts, I = p.inter, H = p.hidden_size;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int stride = gridDim.x * kWarps;
  int i = blockIdx.x * kWarps + warp;
  if (warp == 0) BuildPartTable<kT>(p, &tab);
  if (i < p.shared_parts * I) {
    const uint16_t *gate, *up;
    SharedGateUpRows(p, i, &gate, &up);
    const int s = i / I;
    float* act[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) act[t] = p.act + (int64_t{t} * P + K + s) * I;
    FinishGateUpItem<kT>(p, prefetched, gate, up, act, i - s * I);
    i += stride;
  }
  __syncthreads();
  const int items = tab.count * I, kv = H / 8;
  GateUpChunk cur;
  if (i < items) {
    const int u = i / I, j = i - u * I;
    LoadGateUpChunk(tab.gate[u] + int64_t{j} * H, tab.up[u] + int64_t{j} * H, lane, kv, &cur);
  }
  for (; i < items; i += stride) {
    const int next = i + stride;
    GateUpChunk nxt;
    if (next < items) {
      const int u = next / I, j = next - u * I;
      LoadGateUpChunk(tab.gate[u] + int64_t{j} * H, tab.up[u] + int64_t{j} * H, lane, kv, &nxt);
    }
    const int u = i / I, j = i - u * I;
    float* act[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) act[t] = tab.act[u][t];
    FinishGateUpItem<kT>(p, cur, tab.gate[u] + int64_t{j} * H, tab.up[u] + int64_t{j} * H, act, j);
    cur = nxt;
  }
}

// Most features one down block handles (its per-warp sums in shared memory).
constexpr int kMaxDownFeatures = 64;

struct DownBatch {
  uint4 w[kDownLoads];
};

// Feature f's loads x0 + n * kDownThreads (x = u * kv + v: part u's vector v).
template <int kT>
__device__ __forceinline__ void LoadDownBatch(const PartTable<kT>& tab, int f, int x0, int kv,
                                              DownBatch* b) {
  int u = x0 / kv, v = x0 - u * kv;
#pragma unroll
  for (int n = 0; n < kDownLoads; ++n) {
    b->w[n] = u < tab.count ? LoadStreaming16(tab.down[u] + int64_t{f} * tab.down_stride[u] + 8 * v)
                            : make_uint4(0, 0, 0, 0);
    v += kDownThreads;
    while (v >= kv) {
      v -= kv;
      ++u;
    }
  }
}

template <int kT>
__device__ __forceinline__ void AccumulateDownBatch(const PartTable<kT>& tab, const DownBatch& b,
                                                    int x0, int kv, float acc[kT]) {
  int u = x0 / kv, v = x0 - u * kv;
#pragma unroll
  for (int n = 0; n < kDownLoads; ++n) {
    if (u >= tab.count) break;
    float wf[8];
    Bf16x8ToFloat(b.w[n], wf);
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const float4* a = reinterpret_cast<const float4*>(tab.act[u][t]);
      if (a == nullptr) continue;
      const float s = Dot8(0.0f, a[2 * v], a[2 * v + 1], wf);
      acc[t] = fmaf(tab.coef[u][t], s, acc[t]);
    }
    v += kDownThreads;
    while (v >= kv) {
      v -= kv;
      ++u;
    }
  }
}

template <int kT>
__device__ void DownPipelinedBody(const NoPrefetchResult&, MoeDecodeFusedParams p) {
  __shared__ PartTable<kT> tab;
  __shared__ float partial[kMaxDownFeatures][kDownWarps][kT];
  if (threadIdx.x < 32) BuildPartTable<kT>(p, &tab);
  __syncthreads();
  const int H = p.hidden_size, kv = p.inter / 8, total = tab.count * kv;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int first = blockIdx.x, stride = gridDim.x;
  constexpr int kBatch = kDownThreads * kDownLoads;
  DownBatch cur;
  if (first < H) LoadDownBatch<kT>(tab, first, threadIdx.x, kv, &cur);
  int n = 0;
  for (int f = first; f < H; f += stride, ++n) {
    DownBatch nxt;
    if (f + stride < H) LoadDownBatch<kT>(tab, f + stride, threadIdx.x, kv, &nxt);
    float acc[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) acc[t] = 0.0f;
    AccumulateDownBatch<kT>(tab, cur, threadIdx.x, kv, acc);
    for (int x0 = threadIdx.x + kBatch; x0 < total; x0 += kBatch) {
      DownBatch b;
      LoadDownBatch<kT>(tab, f, x0, kv, &b);
      AccumulateDownBatch<kT>(tab, b, x0, kv, acc);
    }
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const float sum = WarpSum(acc[t]);
      if (lane == 0) partial[n][warp][t] = sum;
    }
    cur = nxt;
  }
  __syncthreads();
  for (int c = threadIdx.x; c < n * kT; c += kDownThreads) {
    const int m = c / kT, t = c - m * kT;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kDownWarps; ++w) sum += partial[m][w][t];
    p.out[int64_t{t} * H + first + int64_t{m} * stride] = sum;
  }
}

// ---- The stationary down -------------------------------------------------------------------
//
// The pipelined gate_up; a down kernel at one token that keeps each thread's activations in
// registers for the whole kernel instead of reading them through L1 for every feature. A
// feature's parts are flattened into chunks of 8 values, x = u * kv + v (part u: the routed
// choices in k order, then the shared parts, i.e. act row u; vector v of kv = inter / 8), and
// thread i owns the chunks x = i + n * kStatThreads, n < kChunks, the same for every feature:
// their 8 act values (fp32), routing weight, row-0 weight pointer and row stride are resolved
// once, so a weight load is one address multiply-add and no table look-up. The block owns a
// contiguous range of ceil(hidden / grid) features (one block of 512 threads per SM), kFeat at a
// time, the next kFeat features' loads issued before the current ones are summed.
//
// Before the PDL wait the kernel resolves its chunks (topk_ids, topk_weights, the slot and
// pointer tables) and issues its first kFeat features' weight loads into registers. The
// routing is read there as a value, not only as a hint: the router that wrote it has completed,
// because down is launched only after every gate_up block passed its own wait, which returns
// after the router grid (the kernel before gate_up) completed; the weights are written by no
// kernel. Only act, gate_up's output, is read after the wait.
//
// Sums: per thread coef * dot8 over its chunks in n order, a butterfly per warp, the warps in
// order (deterministic; a replay equals the eager run; another order than the pipelined down's).

constexpr int kStatThreads = 512;
constexpr int kStatWarps = kStatThreads / 32;
constexpr int kMaxStatFeatures = 64;
constexpr int kMaxStatChunks = 5;

// A thread's chunks: row 0's 8 weights (null: no chunk, or an invalid expert), the elements
// between rows, the routing weight (1 for a shared part) and act row u's 8 values.
template <int kChunks>
struct StatChunks {
  const uint16_t* w[kChunks];
  int32_t stride[kChunks];
  float coef[kChunks];
};

template <int kChunks, int kFeat>
struct StatPrefetched {
  StatChunks<kChunks> c;
  uint4 w[kFeat][kChunks];  // features f0 .. f0 + kFeat - 1 (zeros past the block's range)
};

// The block's contiguous feature range [*first, *end).
__device__ __forceinline__ void StatFeatures(int hidden, int* first, int* end) {
  const int per_block = (hidden + gridDim.x - 1) / gridDim.x;
  *first = blockIdx.x * per_block;
  *end = min(hidden, *first + per_block);
}

template <int kChunks, int kFeat>
__device__ __forceinline__ void LoadStatStep(const StatChunks<kChunks>& c, int f, int end,
                                             uint4 w[kFeat][kChunks]) {
#pragma unroll
  for (int i = 0; i < kFeat; ++i)
#pragma unroll
    for (int n = 0; n < kChunks; ++n) {
      w[i][n] = c.w[n] != nullptr && f + i < end
                    ? LoadStreaming16(c.w[n] + static_cast<int64_t>(f + i) * c.stride[n])
                    : make_uint4(0, 0, 0, 0);
    }
}

template <int kChunks, int kFeat>
__device__ StatPrefetched<kChunks, kFeat> DownStationaryPrefetch(MoeDecodeFusedParams p) {
  StatPrefetched<kChunks, kFeat> r;
  const int K = p.top_k, S = p.shared_parts, I = p.inter, kv = I / 8;
#pragma unroll
  for (int n = 0; n < kChunks; ++n) {
    const int x = threadIdx.x + n * kStatThreads, u = x / kv, v = x - u * kv;
    r.c.w[n] = nullptr;
    r.c.stride[n] = 0;
    r.c.coef[n] = 0.0f;
    if (u < K) {
      const int32_t e = __ldcg(p.topk_ids + u);
      if (ValidExpert(p, e)) {
        const int32_t slot = __ldg(p.slot_of_expert + e);
        if (slot >= 0) {
          r.c.w[n] = p.down[slot] + 8 * v;
          r.c.stride[n] = I;
          r.c.coef[n] = __ldcg(p.topk_weights + u);
        }
      }
    } else if (u < K + S) {
      r.c.w[n] = p.shared_down + int64_t{u - K} * I + 8 * v;
      r.c.stride[n] = S * I;
      r.c.coef[n] = 1.0f;
    }
  }
  int first, end;
  StatFeatures(p.hidden_size, &first, &end);
  LoadStatStep<kChunks, kFeat>(r.c, first, end, r.w);
  return r;
}

template <int kChunks, int kFeat>
__device__ void DownStationaryBody(const StatPrefetched<kChunks, kFeat>& pre,
                                   MoeDecodeFusedParams p) {
  __shared__ float partial[kMaxStatFeatures][kStatWarps];
  const StatChunks<kChunks>& c = pre.c;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // Chunk x's act values are act[8x .. 8x + 7] (act row u = x / kv, token 0).
  float4 lo[kChunks], hi[kChunks];
#pragma unroll
  for (int n = 0; n < kChunks; ++n) {
    const float4* a = reinterpret_cast<const float4*>(p.act) + 2 * (threadIdx.x + n * kStatThreads);
    lo[n] = c.w[n] != nullptr ? __ldcg(a) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    hi[n] = c.w[n] != nullptr ? __ldcg(a + 1) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  int first, end;
  StatFeatures(p.hidden_size, &first, &end);
  uint4 cur[kFeat][kChunks];
#pragma unroll
  for (int i = 0; i < kFeat; ++i)
#pragma unroll
    for (int n = 0; n < kChunks; ++n) cur[i][n] = pre.w[i][n];
  for (int f = first; f < end; f += kFeat) {
    uint4 nxt[kFeat][kChunks];
    LoadStatStep<kChunks, kFeat>(c, f + kFeat, end, nxt);
#pragma unroll
    for (int i = 0; i < kFeat; ++i) {
      float acc = 0.0f;
#pragma unroll
      for (int n = 0; n < kChunks; ++n) {
        if (c.w[n] == nullptr) continue;
        float wf[8];
        Bf16x8ToFloat(cur[i][n], wf);
        acc = fmaf(c.coef[n], Dot8(0.0f, lo[n], hi[n], wf), acc);
      }
      const float sum = WarpSum(acc);
      if (lane == 0 && f + i < end) partial[f + i - first][warp] = sum;
    }
#pragma unroll
    for (int i = 0; i < kFeat; ++i)
#pragma unroll
      for (int n = 0; n < kChunks; ++n) cur[i][n] = nxt[i][n];
  }
  __syncthreads();
  for (int m = threadIdx.x; m < end - first; m += kStatThreads) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kStatWarps; ++w) sum += partial[m][w];
    p.out[first + m] = sum;
  }
}

// The pipelined gate_up on about one pass over the SMs (as many blocks per SM as fit).
template <int kT>
cudaError_t LaunchGateUp(const MoeDecodeFusedParams& p, int sms, cudaStream_t stream) {
  constexpr auto kGateUp =
      PrefetchEntryKernel<GateUpPipelinedPrefetch<kT>, GateUpPipelinedBody<kT>, kThreads>();
  static const int gate_up_per_sm =
      BlocksPerSm(reinterpret_cast<const void*>(kGateUp), kThreads, /*fallback=*/4);
  const int64_t max_parts = int64_t{kT} * p.top_k + p.shared_parts;
  const int64_t gate_up_warps =
      BalancedUnits(max_parts * p.inter, int64_t{sms} * gate_up_per_sm * kWarps);
  const int64_t gate_up_blocks = (gate_up_warps + kWarps - 1) / kWarps;
  return LaunchPrefetchThenAfterPrecedingGrids<GateUpPipelinedPrefetch<kT>, GateUpPipelinedBody<kT>,
                                               kThreads>(
      dim3(static_cast<unsigned>(gate_up_blocks)), 0, stream, p);
}

// The pipelined pair: gate_up, then the grid-strided down on as many blocks per SM as fit, at
// least enough that none has more than kMaxDownFeatures features.
template <int kT>
cudaError_t LaunchPipelined(const MoeDecodeFusedParams& p, cudaStream_t stream) {
  constexpr auto kDown =
      PrefetchEntryKernel<DownPrefetch<kT>, DownPipelinedBody<kT>, kDownThreads>();
  static const int down_per_sm =
      BlocksPerSm(reinterpret_cast<const void*>(kDown), kDownThreads, /*fallback=*/4);
  int sms = 0;
  cudaError_t err = CurrentDeviceSms(&sms);
  if (err != cudaSuccess) return err;
  int64_t down_blocks = BalancedUnits(p.hidden_size, int64_t{sms} * down_per_sm);
  down_blocks = std::max<int64_t>(
      down_blocks, (int64_t{p.hidden_size} + kMaxDownFeatures - 1) / kMaxDownFeatures);
  err = LaunchGateUp<kT>(p, sms, stream);
  if (err != cudaSuccess) return err;
  return LaunchPrefetchThenAfterPrecedingGrids<DownPrefetch<kT>, DownPipelinedBody<kT>,
                                               kDownThreads>(
      dim3(static_cast<unsigned>(down_blocks)), 0, stream, p);
}

// One token: the pipelined gate_up, then the stationary down on one block per SM (its blocks of
// kStatThreads fit once), at least ceil(hidden / kMaxStatFeatures) blocks.
template <int kChunks, int kFeat>
cudaError_t LaunchStationaryOneToken(const MoeDecodeFusedParams& p, cudaStream_t stream) {
  int sms = 0;
  cudaError_t err = CurrentDeviceSms(&sms);
  if (err != cudaSuccess) return err;
  const int64_t H = p.hidden_size;
  const int64_t per_block = std::min<int64_t>(kMaxStatFeatures, (H + sms - 1) / sms);
  const int64_t down_blocks = (H + per_block - 1) / per_block;
  err = LaunchGateUp<1>(p, sms, stream);
  if (err != cudaSuccess) return err;
  return LaunchPrefetchThenAfterPrecedingGrids<DownStationaryPrefetch<kChunks, kFeat>,
                                               DownStationaryBody<kChunks, kFeat>, kStatThreads>(
      dim3(static_cast<unsigned>(down_blocks)), 0, stream, p);
}

// The stationary down where a thread's chunks fit (one token; kMaxStatChunks per thread), else
// the pipelined pair.
cudaError_t Launch(const MoeDecodeFusedParams& p, cudaStream_t stream) {
  const int64_t chunks = int64_t{p.top_k + p.shared_parts} * (p.inter / 8);
  if (p.num_tokens == 1 && chunks <= 3 * kStatThreads) {
    return LaunchStationaryOneToken<3, 2>(p, stream);
  }
  if (p.num_tokens == 1 && chunks <= kMaxStatChunks * kStatThreads) {
    return LaunchStationaryOneToken<kMaxStatChunks, 1>(p, stream);
  }
  return p.num_tokens == 1 ? LaunchPipelined<1>(p, stream) : LaunchPipelined<2>(p, stream);
}

}  // namespace

int64_t MoeDecodeFusedActFloats(int32_t num_tokens, int32_t top_k, int32_t shared_parts,
                                int32_t inter) {
  return int64_t{num_tokens} * (top_k + shared_parts) * inter;
}

cudaError_t MoeDecodeFusedF32(const MoeDecodeFusedParams& p, cudaStream_t stream) {
  // top_k == 0: a dense MLP (shared parts only); no routing, expert table or expert is read.
  const bool routed = p.top_k > 0;
  const bool sizes_ok = p.num_tokens >= 1 && p.num_tokens <= kMoeDecodeFusedMaxTokens &&
                        p.top_k >= 0 && p.shared_parts >= 0 && p.top_k + p.shared_parts >= 1 &&
                        p.top_k + p.shared_parts <= kMoeDecodeFusedMaxParts &&
                        (!routed || p.num_experts >= 1) && p.hidden_size > 0 &&
                        p.hidden_size % 8 == 0 && p.inter > 0 && p.inter % 8 == 0;
  const bool pointers_ok =
      p.hidden != nullptr && p.act != nullptr && p.out != nullptr &&
      (!routed || (p.topk_ids != nullptr && p.topk_weights != nullptr &&
                   p.slot_of_expert != nullptr && p.gate_up != nullptr && p.down != nullptr)) &&
      (p.shared_parts == 0 || (p.shared_gate_up != nullptr && p.shared_down != nullptr)) &&
      reinterpret_cast<uintptr_t>(p.hidden) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(p.act) % 16 == 0;
  if (!sizes_ok || !pointers_ok) return cudaErrorInvalidValue;
  return Launch(p, stream);
}

}  // namespace kernels
}  // namespace deepinfer
