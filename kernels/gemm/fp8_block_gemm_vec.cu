// Fp8SmallMGemm's pipelined 1- and 2-row GEMV (see fp8_block_gemm.h, fp8_block_gemm_vec.h).
//
// Work: column tiles of kRows * (kWarps / ksplit) weight rows. In a tile, warp w takes the kRows
// rows of its group (w / ksplit) and, of every row, the 16-weight chunks q with
// q % (32 ksplit) == 32 (w % ksplit) + lane: kC of them a batch (round u: its chunks
// u * kC .. u * kC + kC - 1). Block b walks tiles b, b + gridDim.x, ...: the grid is one wave (as
// many blocks as fit on the device, fewer where there are fewer tiles, every block with the
// same number of tiles), so a warp's batches follow one another across its tiles, and it issues
// the loads of its next batch before it uses the current one: two batches in flight a lane.
// Each chunk's 16 products are summed in fp32 in order, scaled by the block scale and added to
// the lane's sum (the header's contract); at a tile's end the lanes' sums are added by shuffles
// (a fixed tree) and the ksplit warps' sums through shared memory in warp order
// (deterministic).
//
// Activations are read through L1 (every warp of an SM reads the same rows), fp32 rounded to
// bf16 two at a time (cvt.rn.bf16x2); the e4m3 weights are widened exactly through f16x2.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "kernels/common/kernel_facts.h"
#include "kernels/common/launch.cuh"
#include "kernels/common/streaming_load.cuh"
#include "kernels/gemm/fp8_block_gemm_vec.h"
#include "kernels/gemm/fp8_widen.cuh"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kLaneElems = 16;  // e4m3 weights in one 16-byte chunk
constexpr int kRows = 4;        // weight rows (output columns) a warp takes at once

struct GemvPlan {
  int ksplit;     // warps sharing a row group's k: 1, 2, 4 or 8
  int rounds;     // batches a warp takes per tile
  int64_t tiles;  // column tiles of kRows * kWarps / ksplit rows
};

// A lane's loads of one batch.
template <int kC>
struct Batch {
  uint4 w[kC][kRows];
  float s[kC][kRows];
};

// A warp's place in its walk: the tile and the round within it.
struct Cursor {
  int64_t tile;
  int round;
};

__device__ __forceinline__ void Advance(const GemvPlan& plan, Cursor& c) {
  if (++c.round == plan.rounds) {
    c.round = 0;
    c.tile += gridDim.x;
  }
}

// The first weight row of this warp's group in a tile.
__device__ __forceinline__ int64_t GroupRow0(const GemvPlan& plan, int64_t tile) {
  const int groups = kWarps / plan.ksplit;
  return (tile * groups + (threadIdx.x >> 5) / plan.ksplit) * kRows;
}

// This thread's chunk of round 0 (its chunks are this + u * 32 ksplit).
__device__ __forceinline__ int64_t FirstChunk(const GemvPlan& plan) {
  return static_cast<int64_t>((threadIdx.x >> 5) % plan.ksplit) * 32 + (threadIdx.x & 31);
}

__device__ __forceinline__ int64_t RoundChunk(const GemvPlan& plan, int round, int kC) {
  return FirstChunk(plan) + static_cast<int64_t>(round) * kC * 32 * plan.ksplit;
}

// *p (16 bytes, streamed past L1) where load, else zeros: one predicated load, no branch.
__device__ __forceinline__ uint4 LoadStreaming16If(const void* p, bool load) {
  uint4 v;
  asm("{\n\t.reg .pred q;\n\t"
      "setp.ne.b32 q, %5, 0;\n\t"
      "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
      "@q ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"(static_cast<int>(load)));
  return v;
}

// *p where load, else 0 (through L1: the 8 lanes of a block's chunks share it).
__device__ __forceinline__ float LoadFloatIf(const float* p, bool load) {
  float v;
  asm("{\n\t.reg .pred q;\n\t"
      "setp.ne.b32 q, %2, 0;\n\t"
      "mov.b32 %0, 0;\n\t"
      "@q ld.global.nc.f32 %0, [%1];\n\t}"
      : "=f"(v)
      : "l"(p), "r"(static_cast<int>(load)));
  return v;
}

// The batch at c (zeros where !valid, past the row's end or past n: those sums are not
// written).
template <int kC>
__device__ __forceinline__ void LoadBatch(const Fp8SmallMGemmParams& p, const GemvPlan& plan,
                                          const Cursor& c, bool valid, Batch<kC>& b) {
  const int64_t chunks = p.k / kLaneElems;
  const int64_t stride = 32 * plan.ksplit;
  const int64_t j0 = GroupRow0(plan, c.tile);
  const int64_t q0 = RoundChunk(plan, c.round, kC);
  const uint8_t* wrow[kRows];
  const float* srow[kRows];
  bool row_ok[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t j = j0 + r;
    row_ok[r] = valid && j < p.n;
    wrow[r] = p.w.data + j * p.w.ldw;
    srow[r] = p.w.scales + Fp8ScaleRow(j, p.w.split_rows) * p.w.scale_ld;
  }
#pragma unroll
  for (int u = 0; u < kC; ++u) {
    const int64_t q = q0 + u * stride;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      b.w[u][r] = LoadStreaming16If(wrow[r] + q * kLaneElems, row_ok[r] && q < chunks);
    }
  }
#pragma unroll
  for (int u = 0; u < kC; ++u) {
    const int64_t q = q0 + u * stride;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      b.s[u][r] = LoadFloatIf(srow[r] + q * kLaneElems / kFp8BlockSize, row_ok[r] && q < chunks);
    }
  }
}

// lo and hi rounded to bf16 (nearest even), packed (lo in the low half).
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &h, sizeof(u));
  return u;
}

// 16 activations of row `row` from column col as floats, rounded to bf16.
template <bool kBf16A>
__device__ __forceinline__ void LoadAct16(const void* a, int64_t lda, int64_t row, int64_t col,
                                          float (&x)[kLaneElems]) {
  uint32_t packed[8];
  if constexpr (kBf16A) {
    const uint4* ptr =
        reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a) + row * lda + col);
    const uint4 v0 = __ldg(ptr), v1 = __ldg(ptr + 1);
    packed[0] = v0.x, packed[1] = v0.y, packed[2] = v0.z, packed[3] = v0.w;
    packed[4] = v1.x, packed[5] = v1.y, packed[6] = v1.z, packed[7] = v1.w;
  } else {
    const float4* ptr =
        reinterpret_cast<const float4*>(static_cast<const float*>(a) + row * lda + col);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 v = __ldg(ptr + q);
      packed[2 * q] = PackBf16(v.x, v.y);
      packed[2 * q + 1] = PackBf16(v.z, v.w);
    }
  }
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    x[2 * q] = __uint_as_float(packed[q] << 16);
    x[2 * q + 1] = __uint_as_float(packed[q] & 0xFFFF0000u);
  }
}

template <int M, bool kBf16A, int kC>
__device__ __forceinline__ void UseBatch(const Batch<kC>& b, const Fp8SmallMGemmParams& p,
                                         int64_t row0, int rows, const GemvPlan& plan,
                                         const Cursor& c, float (&acc)[M][kRows]) {
  const int64_t chunks = p.k / kLaneElems;
  const int64_t stride = 32 * plan.ksplit;
  const int64_t q0 = RoundChunk(plan, c.round, kC);
#pragma unroll
  for (int u = 0; u < kC; ++u) {
    const int64_t q = q0 + u * stride;
    if (q >= chunks) break;
    float x[M][kLaneElems];
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if (i < rows) {
        LoadAct16<kBf16A>(p.a, p.lda, row0 + i, q * kLaneElems, x[i]);
      } else {
#pragma unroll
        for (int e = 0; e < kLaneElems; ++e) x[i][e] = 0.0f;
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float wf[kLaneElems];
      DecodeFp8x16(b.w[u][r], wf);
#pragma unroll
      for (int i = 0; i < M; ++i) {
        float sum = 0.0f;
#pragma unroll
        for (int e = 0; e < kLaneElems; ++e) sum = fmaf(x[i][e], wf[e], sum);
        acc[i][r] = fmaf(sum, b.s[u][r], acc[i][r]);
      }
    }
  }
}

// v[0 .. N) of every lane summed over the warp, N a power of two <= 32, in log2(32) exchanges
// that halve the values a lane carries (the lanes whose bit O is set keep the upper half) until
// one is left, then xor butterflies: lane l ends with the sum of value l >> (5 - log2 N) in v[0].
template <int N, int O, int S>
__device__ __forceinline__ void SumTransposed(float (&v)[S], int lane) {
  if constexpr (N > 1) {
    constexpr int kHalf = N / 2;
    const bool upper = (lane & O) != 0;
#pragma unroll
    for (int t = 0; t < kHalf; ++t) {
      const float send = upper ? v[t] : v[t + kHalf];
      const float keep = upper ? v[t + kHalf] : v[t];
      v[t] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, O);
    }
    SumTransposed<kHalf, O / 2>(v, lane);
  } else {
#pragma unroll
    for (int o = O; o > 0; o >>= 1) v[0] += __shfl_xor_sync(0xFFFFFFFFu, v[0], o);
  }
}

// The tile's sums, acc then reset: value i * kRows + r (activation row i, weight row r) of the
// group is written by one lane of its first warp. Every thread of the block calls it at the same
// tile (its __syncthreads).
template <int M>
__device__ __forceinline__ void FinishTile(float (&acc)[M][kRows], float (*partial)[M * kRows],
                                           const Fp8SmallMGemmParams& p, int64_t row0, int rows,
                                           const GemvPlan& plan, int64_t tile) {
  constexpr int kN = M * kRows;
  static_assert(kN == 4 || kN == 8, "the lanes' values");
  constexpr int kShift = kN == 4 ? 3 : 2;  // lane >> kShift: the value a lane ends with
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float v[kN];
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      v[i * kRows + r] = acc[i][r];
      acc[i][r] = 0.0f;
    }
  }
  SumTransposed<kN, 16>(v, lane);
  const int idx = lane >> kShift;
  const bool holder = (lane & ((1 << kShift) - 1)) == 0;
  if (plan.ksplit > 1) {
    if (holder) partial[warp][idx] = v[0];
    __syncthreads();
  }
  const int i = idx / kRows, r = idx % kRows;
  const int64_t j = GroupRow0(plan, tile) + r;
  if (warp % plan.ksplit == 0 && holder && i < rows && j < p.n) {
    float sum = v[0];
    if (plan.ksplit > 1) {
      sum = partial[warp][idx];
      for (int w = 1; w < plan.ksplit; ++w) sum += partial[warp + w][idx];
    }
    float* out = p.c + (row0 + i) * p.ldc + j;
    *out = p.accumulate ? *out + sum : sum;
  }
}

// Before the wait: the first batch (weights and scales only).
template <int kC>
__device__ Batch<kC> GemvPrefetch(Fp8SmallMGemmParams p, int64_t row0, int rows, GemvPlan plan) {
  Batch<kC> b;
  LoadBatch<kC>(p, plan, Cursor{blockIdx.x, 0}, blockIdx.x < plan.tiles, b);
  return b;
}

template <int M, bool kBf16A, int kC>
__device__ void GemvBody(const Batch<kC>& first, Fp8SmallMGemmParams p, int64_t row0, int rows,
                         GemvPlan plan) {
  // Two buffers: a tile's sums are read before any warp passes the next tile's barrier, and the
  // tile after that writes the first buffer again.
  __shared__ float partial[2][kWarps][M * kRows];
  const int64_t my_tiles =
      blockIdx.x < plan.tiles ? (plan.tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const int64_t iters = my_tiles * plan.rounds;
  float acc[M][kRows];
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[i][r] = 0.0f;
  }
  Batch<kC> even = first, odd;
  Cursor cur{blockIdx.x, 0};
  int buf = 0;
  // Two batches an iteration, so that the buffers alternate without copies.
  for (int64_t it = 0; it < iters; it += 2) {
    Cursor next = cur;
    Advance(plan, next);
    LoadBatch<kC>(p, plan, next, it + 1 < iters, odd);
    UseBatch<M, kBf16A, kC>(even, p, row0, rows, plan, cur, acc);
    if (cur.round == plan.rounds - 1) {
      FinishTile<M>(acc, partial[buf], p, row0, rows, plan, cur.tile);
      buf ^= 1;
    }
    if (it + 1 >= iters) break;
    cur = next;
    Advance(plan, next);
    LoadBatch<kC>(p, plan, next, it + 2 < iters, even);
    UseBatch<M, kBf16A, kC>(odd, p, row0, rows, plan, cur, acc);
    if (cur.round == plan.rounds - 1) {
      FinishTile<M>(acc, partial[buf], p, row0, rows, plan, cur.tile);
      buf ^= 1;
    }
    cur = next;
  }
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The k split with the least modelled time for `slots` resident blocks: tiles per block times
// (a lane's chunks of the tile + half a chunk for its sums), the larger split on a tie (more,
// shorter tiles); `forced` (1, 2, 4 or 8) instead if set.
GemvPlan PlanFor(int64_t n, int64_t chunks, int kC, int64_t slots, int forced) {
  GemvPlan best{1, 1, 1};
  int64_t best_cost = -1;
  for (int ksplit = 1; ksplit <= kWarps; ksplit *= 2) {
    if (forced >= 1 && forced <= kWarps && (forced & (forced - 1)) == 0 && ksplit != forced) {
      continue;
    }
    const int64_t per_lane = CeilDiv(chunks, 32 * ksplit);
    const int64_t rounds = CeilDiv(per_lane, kC);
    const int64_t tiles = CeilDiv(n, kRows * (kWarps / ksplit));
    const int64_t cost = CeilDiv(tiles, slots) * (2 * per_lane + 1);
    if (best_cost < 0 || cost <= best_cost) {
      best_cost = cost;
      best = GemvPlan{ksplit, static_cast<int>(rounds), tiles};
    }
  }
  return best;
}

// Blocks an SM the entry is compiled for (its registers capped to fit them; the most each form
// takes without spilling, sm_90): one row with one chunk a batch 3 (80 registers), one row with
// two or two rows with one 2 (128), two rows with two 1.
template <int M, int kC>
constexpr int MinBlocks() {
  return M == 1 ? (kC == 1 ? 3 : 2) : (kC == 1 ? 2 : 1);
}

template <int M, bool kBf16A, int kC>
cudaError_t LaunchGemv(const Fp8SmallMGemmParams& p, int64_t row0, int rows, cudaStream_t stream) {
  constexpr auto kKernel =
      PrefetchEntryKernelAtOccupancy<&GemvPrefetch<kC>, &GemvBody<M, kBf16A, kC>, kThreads,
                                     MinBlocks<M, kC>()>();
  const void* kernel = reinterpret_cast<const void*>(kKernel);
  const KernelFacts facts = KernelFactsForCurrentDevice(kernel, 0);
  if (facts.error != cudaSuccess) return facts.error;
  static const int per_sm = BlocksPerSm(kernel, kThreads, 1);
  const int64_t slots = static_cast<int64_t>(std::max(facts.sms, 1)) * per_sm;
  const GemvPlan plan = PlanFor(p.n, p.k / kLaneElems, kC, slots, p.gemv_ksplit);
  const int64_t blocks = BalancedUnits(plan.tiles, slots);
  return LaunchPrefetchThenAfterPrecedingGridsAtOccupancy<
      &GemvPrefetch<kC>, &GemvBody<M, kBf16A, kC>, kThreads, MinBlocks<M, kC>()>(
      dim3(static_cast<unsigned>(blocks)), 0, stream, p, row0, rows, plan);
}

template <int M, bool kBf16A>
cudaError_t LaunchForChunks(const Fp8SmallMGemmParams& p, int64_t row0, int rows,
                            int chunks_per_batch, cudaStream_t stream) {
  return chunks_per_batch <= 1 ? LaunchGemv<M, kBf16A, 1>(p, row0, rows, stream)
                               : LaunchGemv<M, kBf16A, 2>(p, row0, rows, stream);
}

template <bool kBf16A>
cudaError_t LaunchForRows(const Fp8SmallMGemmParams& p, int64_t row0, int rows,
                          int chunks_per_batch, cudaStream_t stream) {
  return rows <= 1 ? LaunchForChunks<1, kBf16A>(p, row0, rows, chunks_per_batch, stream)
                   : LaunchForChunks<2, kBf16A>(p, row0, rows, chunks_per_batch, stream);
}

}  // namespace

cudaError_t Fp8PipelinedGemv(const Fp8SmallMGemmParams& p, int64_t row0, int rows,
                             int chunks_per_batch, cudaStream_t stream) {
  if (rows < 1 || rows > 2) return cudaErrorInvalidValue;
  return p.a_bf16 ? LaunchForRows<true>(p, row0, rows, chunks_per_batch, stream)
                  : LaunchForRows<false>(p, row0, rows, chunks_per_batch, stream);
}

}  // namespace kernels
}  // namespace deepinfer
