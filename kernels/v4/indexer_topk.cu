// IndexerTopKF32: the scores kernel and the top-k kernel.
//
// Scores (ScoreBody): a block of 256 threads per (token, 128 candidates). The token's query
// heads and the candidates' keys (from the token's paged stream: each candidate's start in
// shared memory when its key lies in one block, else through the block table per element) go
// through shared memory in chunks of 64 heads x 32 dims and
// 128 keys x 32 dims; thread (y, x) accumulates the dot products of heads 8y .. 8y + 7 with
// candidates x + 32j (j < 4) over the dims in order (4-wide shared loads, each element's products
// taken in dim order). A chunk of heads' terms relu(dot) * key_scale * w_h goes to shared memory
// and thread c adds its candidate's terms in head order, so the sum is CpuV4Ops's sum, term for
// term (IndexerScoreOrder). Candidates at or past the token's visible count are not scored.
//
// Tensor-core scores (ScoreTcBody, IndexerScoreOrder::kTensorCoreBf16): see ScoreTcBody.
// Tokens whose visible candidates number at most topk are not scored by either kernel: the top-k
// takes all of them without reading a score.
//
// Top-k (TopkBody): a block of 512 threads per token over its scores in the workspace. Scores map
// to order-preserving 32-bit keys (NaN above +inf, -0 as +0); four passes of a 256-bin histogram
// over one byte of the keys (most significant first, among the keys matching the bytes chosen so
// far; warp-aggregated shared atomics) find the k-th largest key T and how many keys equal to T
// are taken. One more pass in index order writes the chosen indices: a block-wide prefix sum of
// the pair (key above T, key equal to T) per chunk of 512 gives each chosen candidate its place,
// so the output is ascending without a sort, and of the keys equal to T the lowest indices are
// taken.
#include <cuda_bf16.h>
#include <math.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/attention/mma_sm80.cuh"
#include "kernels/common/kernel_facts.h"
#include "kernels/common/launch.cuh"
#include "kernels/v4/indexer_topk.h"

namespace deepinfer {
namespace kernels {
namespace indexer {

constexpr int kScoreThreads = 256;
constexpr int kCands = 128;             // candidates per block
constexpr int kHeadChunk = 64;          // heads per pass over the dims
constexpr int kDimChunk = 32;           // dims per shared-memory tile
constexpr int kTileLd = kDimChunk + 4;  // floats per tile row: 16-byte rows in distinct banks
constexpr int kHeadsPerThread = kHeadChunk / (kScoreThreads / 32);  // 8
constexpr int kCandsPerThread = kCands / 32;                        // 4
static_assert(kCands <= kScoreThreads, "a thread per candidate sums the terms");

// The token's candidates that count: min(visible, candidates, max_candidates), at least 0.
__device__ __forceinline__ int64_t VisibleCount(const IndexerTopKParams& p, int64_t t) {
  const int64_t v = min(p.visible[t], p.candidates[t]);
  return max(int64_t{0}, min(v, p.max_candidates));
}

// Whether a token with v visible candidates needs its scores: not when the top-k takes them all.
__device__ __forceinline__ bool NeedsScores(const IndexerTopKParams& p, int64_t v) {
  return v > p.topk;
}

__device__ __forceinline__ float* Scores(const IndexerTopKParams& p, int64_t t) {
  return static_cast<float*>(p.workspace) + t * p.max_candidates;
}

// a * b + c, rounded as the order asks: twice (kSequential) or once (kFma).
template <bool kFma>
__device__ __forceinline__ float MulAdd(float a, float b, float c) {
  return kFma ? fmaf(a, b, c) : __fadd_rn(c, __fmul_rn(a, b));
}

template <bool kFma>
__device__ void ScoreBody(IndexerTopKParams p) {
  __shared__ union {
    struct {
      float q[kHeadChunk][kTileLd];
      float k[kCands][kTileLd];
    } tile;
    float terms[kHeadChunk][kCands + 1];
  } smem;
  // Each candidate's first key element in the stream, where its dim floats lie in one block
  // (block_floats a multiple of dim), else -1 (read element by element through the table).
  __shared__ int64_t row_start[kCands];
  const int64_t t = blockIdx.x, c0 = static_cast<int64_t>(blockIdx.y) * kCands;
  const int64_t v = VisibleCount(p, t);
  if (c0 >= v || !NeedsScores(p, v)) return;
  const int64_t H = p.heads, D = p.dim;
  const int tid = threadIdx.x, hy = tid / 32, cx = tid % 32;
  const V4PagedRows& ks = p.keys;
  const int32_t* table = ks.block_tables + int64_t{ks.token_seq[t]} * ks.table_stride;
  const int64_t P = ks.block_floats;
  const bool whole = P % D == 0;
  const int64_t ncand = min(int64_t{kCands}, v - c0);
  for (int i = tid; i < kCands; i += kScoreThreads) {
    const int64_t e = (c0 + i) * D;
    row_start[i] = whole && i < ncand ? int64_t{table[e / P]} * P + e % P : -1;
  }
  // Element d of candidate cl's key.
  auto key = [&](int cl, int64_t d) {
    if (whole) return ks.data[row_start[cl] + d];
    const int64_t e = (c0 + cl) * D + d;
    return ks.data[int64_t{table[e / P]} * P + e % P];
  };
  float score = 0.0f;  // candidate c0 + tid's, for tid < kCands

#pragma unroll 1
  for (int64_t h0 = 0; h0 < H; h0 += kHeadChunk) {
    float dot[kHeadsPerThread][kCandsPerThread] = {};
#pragma unroll 1
    for (int64_t d0 = 0; d0 < D; d0 += kDimChunk) {
      __syncthreads();  // the previous tile (or terms) is no longer read
#pragma unroll
      for (int i = 0; i < kHeadChunk * kDimChunk / kScoreThreads; ++i) {
        const int idx = tid + i * kScoreThreads, hl = idx / kDimChunk, dd = idx % kDimChunk;
        const int64_t h = h0 + hl, d = d0 + dd;
        smem.tile.q[hl][dd] = h < H && d < D ? p.q[(t * H + h) * D + d] : 0.0f;
      }
#pragma unroll
      for (int i = 0; i < kCands * kDimChunk / kScoreThreads; ++i) {
        const int idx = tid + i * kScoreThreads, cl = idx / kDimChunk, dd = idx % kDimChunk;
        const int64_t d = d0 + dd;
        smem.tile.k[cl][dd] = cl < ncand && d < D ? key(cl, d) : 0.0f;
      }
      __syncthreads();
      const int dn = static_cast<int>(min(int64_t{kDimChunk}, D - d0));
#pragma unroll 2
      for (int dd = 0; dd < dn; dd += 4) {
        float4 qv[kHeadsPerThread], kv[kCandsPerThread];
#pragma unroll
        for (int i = 0; i < kHeadsPerThread; ++i) {
          qv[i] = *reinterpret_cast<const float4*>(&smem.tile.q[hy * kHeadsPerThread + i][dd]);
        }
#pragma unroll
        for (int j = 0; j < kCandsPerThread; ++j) {
          kv[j] = *reinterpret_cast<const float4*>(&smem.tile.k[cx + 32 * j][dd]);
        }
        // Dims dd .. dd + 3 in order; past the dim (a tail of fewer than 4) nothing is added.
        const int e_end = min(4, dn - dd);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (e >= e_end) break;
#pragma unroll
          for (int i = 0; i < kHeadsPerThread; ++i) {
            const float qe = e == 0 ? qv[i].x : e == 1 ? qv[i].y : e == 2 ? qv[i].z : qv[i].w;
#pragma unroll
            for (int j = 0; j < kCandsPerThread; ++j) {
              const float ke = e == 0 ? kv[j].x : e == 1 ? kv[j].y : e == 2 ? kv[j].z : kv[j].w;
              dot[i][j] = MulAdd<kFma>(qe, ke, dot[i][j]);
            }
          }
        }
      }
    }
    __syncthreads();  // the tiles are no longer read: terms reuses their space
#pragma unroll
    for (int i = 0; i < kHeadsPerThread; ++i) {
      const int hl = hy * kHeadsPerThread + i;
      const int64_t h = h0 + hl;
      if (h >= H) break;
      const float w = __fmul_rn(p.weights[t * H + h], p.weight_scale);
#pragma unroll
      for (int j = 0; j < kCandsPerThread; ++j) {
        const float relu = dot[i][j] < 0.0f ? 0.0f : dot[i][j];
        smem.terms[hl][cx + 32 * j] = __fmul_rn(__fmul_rn(relu, p.key_scale), w);
      }
    }
    __syncthreads();
    if (tid < kCands) {
      const int64_t nh = min(int64_t{kHeadChunk}, H - h0);
      for (int64_t hl = 0; hl < nh; ++hl) score = __fadd_rn(score, smem.terms[hl][tid]);
    }
  }
  if (tid < ncand) Scores(p, t)[c0 + tid] = score;
}

// Tensor-core scores (kTensorCoreBf16): a block of 8 warps per (token, 128 candidates). Per
// chunk of 64 heads and 64 dims, the heads' query rows and the candidates' key rows go to shared
// memory rounded to bf16 (zero past the heads, the dim and the candidates); warp w computes the
// dot products of heads 16 (w % 4) .. + 15 with candidates 64 (w / 4) .. + 63 (mma.sync m16n8k16,
// Q as A, the key rows as B, fp32 accumulators over the dims). The heads' terms then go through
// shared memory and thread c adds its candidate's in head order, as ScoreBody does.
constexpr int kTcCands = 128;
constexpr int kTcHeads = 64;
constexpr int kTcDim = 64;                  // dims per shared-memory tile
constexpr int kTcLd = kTcDim + 8;           // bf16 row stride: ldmatrix's 8 rows in distinct banks
constexpr int kTcWarpCands = kTcCands / 2;  // candidates per warp
constexpr int kTcTiles = kTcWarpCands / 8;  // n-tiles per warp
static_assert(kTcCands <= kScoreThreads, "a thread per candidate sums the terms");
static_assert(kScoreThreads == 32 * (kTcHeads / 16) * 2, "4 head groups x 2 candidate halves");

__device__ void ScoreTcBody(IndexerTopKParams p) {
  __shared__ __align__(16) union {
    struct {
      __nv_bfloat16 q[kTcHeads][kTcLd];
      __nv_bfloat16 k[kTcCands][kTcLd];
    } tile;
    float terms[kTcHeads][kTcCands + 1];
  } smem;
  __shared__ int64_t row_start[kTcCands];
  const int64_t t = blockIdx.x, c0 = static_cast<int64_t>(blockIdx.y) * kTcCands;
  const int64_t v = VisibleCount(p, t);
  if (c0 >= v || !NeedsScores(p, v)) return;
  const int64_t H = p.heads, D = p.dim;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int hw = warp % 4, cw = warp / 4, g = lane / 4, tq = lane % 4;
  const V4PagedRows& ks = p.keys;
  const int32_t* table = ks.block_tables + int64_t{ks.token_seq[t]} * ks.table_stride;
  const int64_t P = ks.block_floats;
  const bool whole = P % D == 0;
  const int64_t ncand = min(int64_t{kTcCands}, v - c0);
  for (int i = tid; i < kTcCands; i += kScoreThreads) {
    const int64_t e = (c0 + i) * D;
    row_start[i] = whole && i < ncand ? int64_t{table[e / P]} * P + e % P : -1;
  }
  auto key = [&](int cl, int64_t d) {
    if (whole) return ks.data[row_start[cl] + d];
    const int64_t e = (c0 + cl) * D + d;
    return ks.data[int64_t{table[e / P]} * P + e % P];
  };
  // This lane's ldmatrix rows (see kernels/v4/sink_attention_mma.cuh: the same fragments).
  const int q_row = hw * 16 + (lane & 15), q_col = (lane >> 4) * 8;
  const int k_row = cw * kTcWarpCands + (lane & 7) + (lane >> 4) * 8, k_col = ((lane >> 3) & 1) * 8;
  float score = 0.0f;  // candidate c0 + tid's, for tid < kTcCands

#pragma unroll 1
  for (int64_t h0 = 0; h0 < H; h0 += kTcHeads) {
    float acc[kTcTiles][4] = {};
#pragma unroll 1
    for (int64_t d0 = 0; d0 < D; d0 += kTcDim) {
      __syncthreads();  // the previous tile (or terms) is no longer read
#pragma unroll 4
      for (int i = 0; i < kTcHeads * kTcDim / kScoreThreads; ++i) {
        const int idx = tid + i * kScoreThreads, hl = idx / kTcDim, dd = idx % kTcDim;
        const int64_t h = h0 + hl, d = d0 + dd;
        smem.tile.q[hl][dd] = __float2bfloat16_rn(h < H && d < D ? p.q[(t * H + h) * D + d] : 0.0f);
      }
#pragma unroll 4
      for (int i = 0; i < kTcCands * kTcDim / kScoreThreads; ++i) {
        const int idx = tid + i * kScoreThreads, cl = idx / kTcDim, dd = idx % kTcDim;
        const int64_t d = d0 + dd;
        smem.tile.k[cl][dd] = __float2bfloat16_rn(cl < ncand && d < D ? key(cl, d) : 0.0f);
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kTcDim / 16; ++kk) {
        uint32_t a[4];
        sm80::LdMatrixX4<false>(a, &smem.tile.q[q_row][kk * 16 + q_col]);
#pragma unroll
        for (int np = 0; np < kTcTiles / 2; ++np) {
          uint32_t b[4];
          sm80::LdMatrixX4<false>(b, &smem.tile.k[k_row + np * 16][kk * 16 + k_col]);
          sm80::MmaBf16(acc[2 * np], a, b[0], b[1]);
          sm80::MmaBf16(acc[2 * np + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the tiles are no longer read: terms reuses their space
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int hl = hw * 16 + g + 8 * r;
      const int64_t h = h0 + hl;
      if (h >= H) continue;
      const float w = __fmul_rn(p.weights[t * H + h], p.weight_scale);
#pragma unroll
      for (int nt = 0; nt < kTcTiles; ++nt) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float dot = acc[nt][2 * r + c];
          const float relu = dot < 0.0f ? 0.0f : dot;
          smem.terms[hl][cw * kTcWarpCands + nt * 8 + 2 * tq + c] =
              __fmul_rn(__fmul_rn(relu, p.key_scale), w);
        }
      }
    }
    __syncthreads();
    if (tid < kTcCands) {
      const int64_t nh = min(int64_t{kTcHeads}, H - h0);
      for (int64_t hl = 0; hl < nh; ++hl) score = __fadd_rn(score, smem.terms[hl][tid]);
    }
  }
  if (tid < ncand) Scores(p, t)[c0 + tid] = score;
}

constexpr int kTopkThreads = 512;
constexpr int kTopkWarps = kTopkThreads / 32;

// Keys whose unsigned order is the scores' order: NaN above everything, -0 equal to +0.
__device__ __forceinline__ uint32_t OrderKey(float f) {
  if (f != f) return 0xFFFFFFFFu;
  if (f == 0.0f) f = 0.0f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// The exclusive prefix sum of x over the block's threads in order; *total: the sum of all.
// Every thread calls it; warp_sums holds kTopkWarps + 1 values.
__device__ __forceinline__ uint32_t BlockExclusiveSum(uint32_t x, uint32_t* total,
                                                      uint32_t* warp_sums) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint32_t incl = x;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const uint32_t w = lane < kTopkWarps ? warp_sums[lane] : 0u;
    uint32_t winc = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, winc, o);
      if (lane >= o) winc += y;
    }
    if (lane < kTopkWarps) warp_sums[lane] = winc - w;
    if (lane == kTopkWarps - 1) warp_sums[kTopkWarps] = winc;
  }
  __syncthreads();
  const uint32_t result = warp_sums[warp] + incl - x;
  *total = warp_sums[kTopkWarps];
  __syncthreads();  // every thread has read warp_sums before the next call writes it
  return result;
}

__device__ void TopkBody(IndexerTopKParams p) {
  __shared__ uint32_t hist[256];
  __shared__ uint32_t warp_sums[kTopkWarps + 1];
  __shared__ uint32_t chosen_digit, chosen_above;
  const int64_t t = blockIdx.x;
  const int64_t v = VisibleCount(p, t);
  const int64_t k = min(p.topk, v);
  int32_t* sel = p.selected + t * p.topk;
  const int tid = threadIdx.x;
  if (k == v) {  // every visible candidate
    for (int64_t i = tid; i < p.topk; i += kTopkThreads) {
      sel[i] = i < v ? static_cast<int32_t>(i) : -1;
    }
    return;
  }
  const float* scores = Scores(p, t);
  const int lane = tid % 32, warp = tid / 32;
  uint32_t prefix = 0, mask = 0;
  uint32_t remaining = static_cast<uint32_t>(k);  // still to take among keys matching prefix
#pragma unroll 1
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kTopkThreads) hist[i] = 0;
    __syncthreads();
    // Scores of one magnitude share their top bytes, so most keys of a pass may fall in one
    // bin: the lanes of a warp with the same bin add their count in one atomic.
#pragma unroll 1
    for (int64_t base = 0; base < v; base += kTopkThreads) {
      const int64_t i = base + tid;
      const uint32_t key = i < v ? OrderKey(scores[i]) : 0u;
      const bool counts = i < v && (key & mask) == prefix;
      const uint32_t bin = (key >> shift) & 0xFFu;
      const unsigned active = __ballot_sync(0xffffffffu, counts);
      if (counts) {
        const unsigned peers = __match_any_sync(active, bin);
        if (lane == __ffs(peers) - 1) atomicAdd(&hist[bin], static_cast<uint32_t>(__popc(peers)));
      }
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l holds bins 8l .. 8l + 7; the digit is the bin b where the keys in bins above b
      // number fewer than `remaining` and those in b and above at least that many.
      uint32_t c[8], sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        c[j] = hist[8 * lane + j];
        sum += c[j];
      }
      uint32_t incl = sum;  // the keys in this lane's bins and every higher lane's
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t y = __shfl_down_sync(0xffffffffu, incl, o);
        if (lane + o < 32) incl += y;
      }
      uint32_t above = incl - sum;
      if (above < remaining && remaining <= incl) {
#pragma unroll
        for (int j = 7; j >= 0; --j) {
          if (above + c[j] >= remaining) {
            chosen_digit = static_cast<uint32_t>(8 * lane + j);
            chosen_above = above;
            break;
          }
          above += c[j];
        }
      }
    }
    __syncthreads();
    prefix |= chosen_digit << shift;
    mask |= 0xFFu << shift;
    remaining -= chosen_above;
  }
  // prefix is the k-th largest key T; `remaining` of the keys equal to T are taken, the lowest
  // indices first, with every key above T.
  uint32_t above_base = 0, equal_base = 0;
#pragma unroll 1
  for (int64_t base = 0; base < v; base += kTopkThreads) {
    const int64_t i = base + tid;
    const uint32_t key = i < v ? OrderKey(scores[i]) : 0u;
    const bool above = i < v && key > prefix, equal = i < v && key == prefix;
    uint32_t total;
    // Counts within a chunk of 512 fit 16 bits: (above, equal) packed in one sum.
    const uint32_t before =
        BlockExclusiveSum((above ? 0x10000u : 0u) | (equal ? 1u : 0u), &total, warp_sums);
    const uint32_t above_before = above_base + (before >> 16);
    const uint32_t equal_before = equal_base + (before & 0xFFFFu);
    if (above || (equal && equal_before < remaining)) {
      sel[above_before + min(equal_before, remaining)] = static_cast<int32_t>(i);
    }
    above_base += total >> 16;
    equal_base += total & 0xFFFFu;
  }
  for (int64_t i = k + tid; i < p.topk; i += kTopkThreads) sel[i] = -1;
}

}  // namespace indexer

bool IndexerTopKTensorCoreRuns() {
  const KernelFacts f = KernelFactsForCurrentDevice(
      reinterpret_cast<const void*>(EntryKernel<indexer::ScoreTcBody, indexer::kScoreThreads>()),
      0);
  return f.error == cudaSuccess && f.ptx_version >= 80;
}

size_t IndexerTopKWorkspaceBytes(const IndexerTopKParams& p) {
  return static_cast<size_t>(std::max<int64_t>(p.tokens, 0)) *
         static_cast<size_t>(std::max<int64_t>(p.max_candidates, 0)) * sizeof(float);
}

cudaError_t IndexerTopKF32(const IndexerTopKParams& p, cudaStream_t stream) {
  constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
  if (p.tokens < 0 || p.max_candidates < 0 || p.max_candidates > kMaxInt32 ||
      p.tokens > kMaxInt32) {
    return cudaErrorInvalidValue;
  }
  if (p.tokens == 0) return cudaSuccess;
  if (p.heads < 1 || p.dim < 1 || p.topk < 1 || p.topk > kMaxInt32 || p.q == nullptr ||
      p.weights == nullptr || p.keys.data == nullptr || p.keys.block_floats < 1 ||
      p.keys.block_tables == nullptr || p.keys.table_stride < 0 || p.keys.token_seq == nullptr ||
      p.candidates == nullptr || p.visible == nullptr || p.selected == nullptr) {
    return cudaErrorInvalidValue;
  }
  const bool tc = p.order == IndexerScoreOrder::kTensorCoreBf16;
  if (tc && !IndexerTopKTensorCoreRuns()) return cudaErrorInvalidValue;
  const int64_t per_block = tc ? indexer::kTcCands : indexer::kCands;
  const int64_t cand_blocks = (p.max_candidates + per_block - 1) / per_block;
  if (cand_blocks > 65535) return cudaErrorInvalidValue;
  if (p.max_candidates > 0 &&
      (p.workspace == nullptr || p.workspace_bytes < IndexerTopKWorkspaceBytes(p))) {
    return cudaErrorInvalidValue;
  }
  if (cand_blocks > 0) {
    const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(cand_blocks));
    const cudaError_t e =
        tc ? LaunchAfterPrecedingGrids<indexer::ScoreTcBody, indexer::kScoreThreads>(grid, 0,
                                                                                     stream, p)
        : p.order == IndexerScoreOrder::kFma
            ? LaunchAfterPrecedingGrids<indexer::ScoreBody<true>, indexer::kScoreThreads>(grid, 0,
                                                                                          stream, p)
            : LaunchAfterPrecedingGrids<indexer::ScoreBody<false>, indexer::kScoreThreads>(
                  grid, 0, stream, p);
    if (e != cudaSuccess) return e;
  }
  return LaunchAfterPrecedingGrids<indexer::TopkBody, indexer::kTopkThreads>(
      dim3(static_cast<unsigned>(p.tokens)), 0, stream, p);
}

}  // namespace kernels
}  // namespace deepinfer
