// GroupedGemmBf16Pipelined (grouped_gemm_pipelined.h).
//
// Work: items = (slot, feature tile) pairs, slot-major, item i taken by block i % grid (a
// persistent grid, one block per SM). An item holds kTileRows = 32 weight rows: features
// 32 t .. 32 t + 31 (kF32), or, for the fused SiLU-mul, gate features 16 t .. 16 t + 15 and
// their 16 up features, interleaved by 8 so that each 16-row MMA tile holds 8 gate rows and the
// matching 8 up rows: the C fragment's rows g and g + 8 are then gate and up of one feature, in
// one thread's registers. Each item runs one pass per kPassRows of its slot's rows (one pass at
// decode sizes up to ~128 tokens), each pass a sequence of kChunkK-wide k chunks (Shape: 256 or
// 512, GroupedGemmBf16PipelinedParams::variant).
//
// Pipeline: every (item, pass, k chunk) step is one stage of a kStages ring in shared memory:
// the chunk's 32 weight rows (512 or 1024 contiguous bytes each, copied by one or two warps'
// instructions, so DRAM sees runs of that length) and up to kPassRows x rows, copied with
// 16-byte cp.async (row pitch chunk + 16 bytes: ldmatrix reads 8 rows without bank conflicts). A
// producer cursor runs kStages - 1 steps ahead of the consumer across item boundaries, so the
// copies never drain between items. Per step each of the 8 warps multiplies the two 16-row weight
// tiles (the MMA's A operand, features as M) with the pass's active 8-row x tiles (B, rows as N)
// over its own kChunkK / 8 of the chunk's k: padding costs at most 7 rows of MMA work, no weight
// bytes. At the end of a pass the warps' partial sums meet in shared memory, are added in warp
// order (fixed: the same bits every run) and written to global memory (fp32 y, or bf16 silu(gate) *
// up).
//
// v1 of this kernel (128-row items, 64-wide chunks: 128-byte runs per row, 4 warps each owning
// 32 features over the whole chunk) measured 2.4x slower than the planned cuBLAS path on the
// H200 (1.4-1.7 TB/s; docs/kernels.md).
//
// x rows past the slot's end and weight rows past n are not copied (their stale shared values
// reach only outputs that are not stored); k past the end is zero-filled (it would reach every
// output).
#include <cuda_bf16.h>
#include <math.h>

#include <algorithm>

#include "kernels/attention/mma_sm80.cuh"
#include "kernels/common/kernel_facts.h"
#include "kernels/common/launch.cuh"
#include "kernels/moe/grouped_gemm_pipelined.h"

namespace deepinfer {
namespace kernels {
namespace {

using sm80::CopyAsync16;
using sm80::CopyAsyncCommit;
using sm80::CopyAsyncWait;
using sm80::LdMatrixX4;
using sm80::MmaBf16;
using sm80::SharedAddr;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMTiles = 2;               // 16-row weight tiles per item
constexpr int kTileRows = kMTiles * 16;  // weight rows per item: 32

// A pipeline shape: k per stage, x rows per pass, stages.
template <int kChunkKArg, int kPassRowsArg, int kStagesArg>
struct Shape {
  static constexpr int kChunkK = kChunkKArg;
  static constexpr int kPassRows = kPassRowsArg;
  static constexpr int kStages = kStagesArg;
  static constexpr int kWarpKSteps = kChunkK / 16 / kWarps;  // 16-wide k steps per warp
  static constexpr int kLd = kChunkK + 8;                    // shared row pitch, elements
  static constexpr int kNTiles = kPassRows / 8;              // 8-row x tiles per pass
  static constexpr int kStageElems = (kTileRows + kPassRows) * kLd;
  static constexpr int kPiecesPerRow = kChunkK / 8;  // 16-byte pieces
  static constexpr int kWPieces = kTileRows * kPiecesPerRow / kThreads;
  static constexpr int kXPieces = kPassRows * kPiecesPerRow / kThreads;
  // The warps' partial sums at the end of a pass: [warp][m][n][e][lane] floats.
  static constexpr int kReduceFloats = kWarps * kMTiles * kNTiles * 4 * 32;
  static constexpr size_t kSmemBytes =
      size_t{kStages} * kStageElems * sizeof(uint16_t) + kReduceFloats * sizeof(float);
  static_assert(kWarpKSteps % 2 == 0, "one x4 ldmatrix of x covers two k steps");
  static_assert(kPiecesPerRow % 32 == 0, "a warp instruction copies 512 contiguous bytes");
  static_assert(kTileRows * kPiecesPerRow % kThreads == 0 &&
                    kPassRows * kPiecesPerRow % kThreads == 0 && kPassRows % 8 == 0,
                "whole copy rounds");
  static_assert(kSmemBytes <= 227 * 1024, "fits the sm_90 shared memory of one block");
};
// Variant 1 (the default): 512-byte runs, 24-row passes, 7 stages (96 KB of weights in flight).
using Shape256 = Shape<256, 24, 7>;
// Variant 2: 1 KB runs, 16-row passes, 4 stages (96 KB in flight).
using Shape512 = Shape<512, 16, 4>;

// The launch's parameters plus what the host derived from them.
struct Job {
  GroupedGemmBf16PipelinedParams p;
  int32_t tiles;    // feature tiles per slot
  int32_t items;    // num_slots * tiles
  int32_t kchunks;  // ceil(k / kChunkK)
  int32_t inter;    // kSiluMulBf16: n / 2
  bool silu;
};

// Weight row (feature) behind shared tile row r of feature tile t, -1 past the end.
__device__ __forceinline__ int FeatureOf(const Job& j, int t, int r) {
  if (!j.silu) {
    const int f = t * kTileRows + r;
    return f < j.p.n ? f : -1;
  }
  const int base = t * (kTileRows / 2) + (r / 16) * 8 + (r & 7);
  if (base >= j.inter) return -1;
  return (r & 8) ? j.inter + base : base;
}

// Where a walk over this block's steps stands: item (>= items: done), its slot and feature
// tile, the pass's first row, the slot's end row, the k chunk, the slot's weights.
struct Cursor {
  int item, slot, tile, row0, row_end, kc;
  const uint16_t* w;
};

// From c->item on, the first item whose slot has rows (or c->item >= items).
__device__ __forceinline__ void SeekItem(const Job& j, Cursor* c) {
  for (; c->item < j.items; c->item += gridDim.x) {
    const int slot = c->item / j.tiles;
    const int b = min(j.p.slot_offsets[slot], j.p.max_rows);
    const int e = min(j.p.slot_offsets[slot + 1], j.p.max_rows);
    if (e > b) {
      c->slot = slot;
      c->tile = c->item - slot * j.tiles;
      c->row0 = b;
      c->row_end = e;
      c->kc = 0;
      c->w = j.p.weights[slot];
      return;
    }
  }
}

template <class S>
__device__ __forceinline__ void Advance(const Job& j, Cursor* c) {
  if (++c->kc < j.kchunks) return;
  c->kc = 0;
  c->row0 += S::kPassRows;
  if (c->row0 < c->row_end) return;
  c->item += gridDim.x;
  SeekItem(j, c);
}

// The copies of step c into the stage at shared address `stage`: piece id of the W tile is row
// id / kPiecesPerRow, 16-byte piece id % kPiecesPerRow, so a warp instruction copies 512
// contiguous bytes of one row.
template <class S>
__device__ __forceinline__ void LoadStep(const Job& j, const Cursor& c, uint32_t stage) {
  const uint16_t* w = c.w;
  const int k0 = c.kc * S::kChunkK;
#pragma unroll
  for (int i = 0; i < S::kWPieces; ++i) {
    const int id = threadIdx.x + i * kThreads;
    const int r = id / S::kPiecesPerRow, piece = id % S::kPiecesPerRow;
    const int f = FeatureOf(j, c.tile, r), kk = k0 + piece * 8;
    if (f < 0) continue;
    const bool in_k = kk < j.p.k;
    CopyAsync16(stage + (r * S::kLd + piece * 8) * 2,
                in_k ? w + static_cast<int64_t>(f) * j.p.k + kk : w, in_k);
  }
  const int rows = c.row_end - c.row0;
#pragma unroll
  for (int i = 0; i < S::kXPieces; ++i) {
    const int id = threadIdx.x + i * kThreads;
    const int r = id / S::kPiecesPerRow, piece = id % S::kPiecesPerRow;
    const int kk = k0 + piece * 8;
    if (r >= rows) continue;
    const bool in_k = kk < j.p.k;
    CopyAsync16(stage + ((kTileRows + r) * S::kLd + piece * 8) * 2,
                in_k ? j.p.x + static_cast<int64_t>(c.row0 + r) * j.p.k + kk : j.p.x, in_k);
  }
}

// acc[m][n] += W tile m x x tile n over this warp's k steps of the stage's chunk; n < active.
template <class S>
__device__ __forceinline__ void ComputeStep(uint32_t stage, int active,
                                            float acc[kMTiles][S::kNTiles][4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int sp = 0; sp < S::kWarpKSteps; sp += 2) {
    const int ks0 = warp * S::kWarpKSteps + sp;
    // A fragments of k steps ks0 and ks0 + 1: matrices rows 8 (mat & 1) + 0..7, k 8 (mat >> 1).
    uint32_t a[2][kMTiles][4];
#pragma unroll
    for (int s = 0; s < 2; ++s) {
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        const int row = m * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        LdMatrixX4<false>(a[s][m], stage + (row * S::kLd + (ks0 + s) * 16 + (lane >> 4) * 8) * 2);
      }
    }
#pragma unroll
    for (int n = 0; n < S::kNTiles; ++n) {
      if (n >= active) break;
      // B fragments of x tile n: matrices k 8 mat + 0..7 from k step ks0 on (mat 0, 1: ks0).
      uint32_t b[4];
      LdMatrixX4<false>(
          b, stage + ((kTileRows + n * 8 + (lane & 7)) * S::kLd + ks0 * 16 + (lane >> 3) * 8) * 2);
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        MmaBf16(acc[m][n], a[0][m], b[0], b[1]);
        MmaBf16(acc[m][n], a[1][m], b[2], b[3]);
      }
    }
  }
}

// expf (not __expf), as SiluMulF32ToBf16 and SiluMulBf16.
__device__ __forceinline__ float SiluMul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// The end of a pass: every warp's partial C fragments into red, then each output (C fragment
// element (m, n, e) of lane l: weight row 16 m + g + 8 (e >> 1), x row 8 n + 2 tq + (e & 1),
// g = l / 4, tq = l % 4) summed over the warps in order and stored; the accumulators cleared.
// Called by every thread; red is written again only after the next step's barrier.
template <class S>
__device__ __forceinline__ void StorePass(const Job& j, const Cursor& c, int active,
                                          float acc[kMTiles][S::kNTiles][4], float* red) {
  constexpr int kN = S::kNTiles;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto at = [&](int w, int m, int n, int e, int l) {
    return (((w * kMTiles + m) * kN + n) * 4 + e) * 32 + l;
  };
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int n = 0; n < kN; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (n < active) red[at(warp, m, n, e, lane)] = acc[m][n][e];
        acc[m][n][e] = 0.0f;
      }
    }
  }
  __syncthreads();
  auto sum = [&](int m, int n, int e, int l) {
    float v = red[at(0, m, n, e, l)];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v += red[at(w, m, n, e, l)];
    return v;
  };
  if (j.silu) {
    // (m, n, h, l): gate = element h, up = element 2 + h of the fragment.
    for (int idx = threadIdx.x; idx < kMTiles * kN * 2 * 32; idx += kThreads) {
      const int l = idx % 32, h = (idx / 32) % 2, n = (idx / 64) % kN, m = idx / 64 / kN;
      if (n >= active) continue;
      const int f = c.tile * (kTileRows / 2) + m * 8 + l / 4;
      const int row = c.row0 + n * 8 + 2 * (l % 4) + h;
      if (f < j.inter && row < c.row_end) {
        j.p.act[static_cast<int64_t>(row) * j.inter + f] = __bfloat16_as_ushort(
            __float2bfloat16_rn(SiluMul(sum(m, n, h, l), sum(m, n, 2 + h, l))));
      }
    }
  } else {
    for (int idx = threadIdx.x; idx < kMTiles * kN * 4 * 32; idx += kThreads) {
      const int l = idx % 32, e = (idx / 32) % 4, n = (idx / 128) % kN, m = idx / 128 / kN;
      if (n >= active) continue;
      const int f = c.tile * kTileRows + m * 16 + l / 4 + (e >> 1) * 8;
      const int row = c.row0 + n * 8 + 2 * (l % 4) + (e & 1);
      if (f < j.p.n && row < c.row_end) {
        j.p.y[static_cast<int64_t>(row) * j.p.n + f] = sum(m, n, e, l);
      }
    }
  }
}

__device__ __forceinline__ void PrefetchL2(const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

// Before the wait for the preceding kernels: the first kStages - 1 chunks of this block's first
// item's weight rows into L2 (kThreads / kTileRows threads a row; the weights are written by
// no kernel).
template <class S>
__device__ int PrefetchFirstItem(Job j) {
  constexpr int kRowThreads = kThreads / kTileRows;
  const int item = blockIdx.x;
  if (item >= j.items) return 0;
  const int slot = item / j.tiles;
  const uint16_t* w = j.p.weights[slot];
  const int f = FeatureOf(j, item - slot * j.tiles, threadIdx.x / kRowThreads);
  if (w == nullptr || f < 0) return 0;
  const char* row = reinterpret_cast<const char*>(w + static_cast<int64_t>(f) * j.p.k);
  const int bytes = min(j.p.k, (S::kStages - 1) * S::kChunkK) * 2;
  for (int off = (threadIdx.x % kRowThreads) * 128; off < bytes; off += kRowThreads * 128) {
    PrefetchL2(row + off);
  }
  return 0;
}

template <class S>
__device__ void PipelinedBody(int /*prefetched*/, Job j) {
  extern __shared__ float4 smem4[];
  const uint32_t base = SharedAddr(smem4);
  float* red = reinterpret_cast<float*>(reinterpret_cast<char*>(smem4) +
                                        size_t{S::kStages} * S::kStageElems * sizeof(uint16_t));
  auto stage_addr = [&](int s) {
    return base + static_cast<uint32_t>(s * S::kStageElems * sizeof(uint16_t));
  };
  Cursor load{static_cast<int>(blockIdx.x), 0, 0, 0, 0, 0, nullptr};
  SeekItem(j, &load);
  Cursor use = load;
#pragma unroll 1
  for (int s = 0; s < S::kStages - 1; ++s) {
    if (load.item < j.items) {
      LoadStep<S>(j, load, stage_addr(s));
      Advance<S>(j, &load);
    }
    CopyAsyncCommit();  // possibly empty: one group per step keeps the wait count fixed
  }
  float acc[kMTiles][S::kNTiles][4];
#pragma unroll
  for (int m = 0; m < kMTiles; ++m)
#pragma unroll
    for (int n = 0; n < S::kNTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.0f;
  int stage = 0;
#pragma unroll 1
  while (use.item < j.items) {
    CopyAsyncWait<S::kStages - 2>();  // this step's group has landed for this thread ...
    __syncthreads();  // ... and for all; every warp is done with the stage refilled next
    if (load.item < j.items) {
      LoadStep<S>(j, load, stage_addr((stage + S::kStages - 1) % S::kStages));
      Advance<S>(j, &load);
    }
    CopyAsyncCommit();
    const int active = min(S::kNTiles, (min(use.row_end - use.row0, S::kPassRows) + 7) / 8);
    ComputeStep<S>(stage_addr(stage), active, acc);
    if (use.kc == j.kchunks - 1) StorePass<S>(j, use, active, acc, red);
    Advance<S>(j, &use);
    stage = (stage + 1) % S::kStages;
  }
  CopyAsyncWait<0>();
}

template <class S>
cudaError_t LaunchShape(Job j, cudaStream_t stream) {
  constexpr auto kEntry = PrefetchEntryKernel<PrefetchFirstItem<S>, PipelinedBody<S>, kThreads>();
  // Cached per device; the first query raises the entry's shared-memory limit. The compute_75
  // PTX fallback has no MMA: sm_80+ code only.
  const KernelFacts facts = KernelFactsForCurrentDevice(reinterpret_cast<const void*>(kEntry),
                                                        static_cast<int>(S::kSmemBytes));
  if (facts.error != cudaSuccess) return facts.error;
  if (facts.ptx_version < 80 || facts.max_smem < static_cast<int>(S::kSmemBytes)) {
    return cudaErrorNotSupported;
  }
  j.kchunks = (j.p.k + S::kChunkK - 1) / S::kChunkK;
  // One block per SM (the ring takes most of an SM's shared memory).
  int64_t grid = std::min<int64_t>(j.items, facts.sms);
  if (j.p.max_blocks > 0) grid = std::min<int64_t>(grid, j.p.max_blocks);
  return LaunchPrefetchThenAfterPrecedingGrids<PrefetchFirstItem<S>, PipelinedBody<S>, kThreads>(
      dim3(static_cast<unsigned>(grid)), S::kSmemBytes, stream, j);
}

}  // namespace

cudaError_t GroupedGemmBf16Pipelined(const GroupedGemmBf16PipelinedParams& p, cudaStream_t stream) {
  const bool silu = p.epilogue == PipelinedGemmEpilogue::kSiluMulBf16;
  if (p.num_slots <= 0 || p.n <= 0 || p.k <= 0 || p.k % 8 != 0 || p.max_rows < 0 ||
      p.max_blocks < 0 || (silu && p.n % 2 != 0) || reinterpret_cast<uintptr_t>(p.x) % 16 != 0 ||
      p.slot_offsets == nullptr || p.weights == nullptr ||
      (silu ? p.act == nullptr : p.y == nullptr) || p.variant < 0 ||
      p.variant > kMaxPipelinedGemmVariant) {
    return cudaErrorInvalidValue;
  }
  if (p.max_rows == 0) return cudaSuccess;
  Job j;
  j.p = p;
  j.silu = silu;
  j.inter = p.n / 2;
  const int64_t features_per_tile = silu ? kTileRows / 2 : kTileRows;
  const int64_t tiles =
      ((silu ? j.inter : int64_t{p.n}) + features_per_tile - 1) / features_per_tile;
  const int64_t items = tiles * p.num_slots;
  if (items > (int64_t{1} << 30)) return cudaErrorInvalidValue;
  j.tiles = static_cast<int32_t>(tiles);
  j.items = static_cast<int32_t>(items);
  return p.variant == 2 ? LaunchShape<Shape512>(j, stream) : LaunchShape<Shape256>(j, stream);
}

}  // namespace kernels
}  // namespace deepinfer
