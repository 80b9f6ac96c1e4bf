// Staged small-m GEMV (staged_gemv.h). A block of 8 warps first stages the m activation rows in
// shared memory as bf16 (copied and rounded, or made by the add + RMS norm prologue), then each
// warp walks its weight rows: row j = warp's global index + i * (all warps), each row in passes
// of 32 * C 16-byte chunks (one pass for k <= 2048). A lane's chunks of a pass are loaded all at
// once, and the warp's next pass (of this row or its next row) is loaded before the current one
// is multiplied, so two passes of every warp are in flight. The first two passes are loaded
// before the wait for the preceding kernel (programmatic dependent launch: weights are never
// written during a step), overlapping that kernel's tail and this kernel's staging.
#include <cuda_bf16.h>

#include "kernels/attention/mma_sm80.cuh"
#include "kernels/common/kernel_facts.h"
#include "kernels/common/launch.cuh"
#include "kernels/gemm/staged_gemv.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kBlocksPerSm = 2;  // the grid: at most this many blocks per SM
constexpr int kMaxChunks = 8;    // 16-byte weight chunks per lane and pass

// What the kernel needs beside the caller's parameters, computed on the host.
struct Args {
  StagedGemvParams p;
  int64_t begin[kStagedGemvMaxTargets];  // first concatenated row of each target
  int64_t rows;                          // all targets' rows
  int64_t chunks;                        // 16-byte chunks of a weight row (k / 8)
  int64_t passes;                        // passes per row
  // kSharedMemory only: rows per warp, and where x + y (-1: not kept) and the weight rows start
  // in the dynamic shared memory, in 16-byte units.
  int64_t per_warp;
  int64_t sums_at, weights_at;
};

template <int C>
struct Chunks {
  uint4 q[C];
};

template <int C>
struct FirstPasses {
  Chunks<C> u0, u1;
};

__device__ __forceinline__ float Bf16Lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float Bf16Hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }
__device__ __forceinline__ uint32_t Bf16Bits(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
__device__ __forceinline__ uint32_t Pack(float lo, float hi) {
  return Bf16Bits(lo) | (Bf16Bits(hi) << 16);
}

// 16 bytes of weights that are read once: not kept in L1.
__device__ __forceinline__ uint4 LoadWeights16(const uint16_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Concatenated row j's weights (every index static, so the parameters stay in registers).
__device__ __forceinline__ const uint16_t* RowWeights(const Args& a, int64_t j) {
  const uint16_t* w = nullptr;
#pragma unroll
  for (int t = 0; t < kStagedGemvMaxTargets; ++t) {
    if (t < a.p.num_targets && j >= a.begin[t]) {
      w = a.p.targets[t].w + (j - a.begin[t]) * a.p.targets[t].ldw;
    }
  }
  return w;
}

// Pass `pass` of row j: chunks (pass * C + u) * 32 + lane, zeros past the row's end.
template <int C>
__device__ __forceinline__ void LoadPass(const Args& a, int64_t j, int64_t pass, Chunks<C>& out) {
  const int lane = threadIdx.x % 32;
  const uint16_t* wr = RowWeights(a, j);
#pragma unroll
  for (int u = 0; u < C; ++u) {
    const int64_t q = (pass * C + u) * 32 + lane;
    out.q[u] = q < a.chunks ? LoadWeights16(wr + 8 * q) : make_uint4(0, 0, 0, 0);
  }
}

// The unit after (j, pass) in this warp's list.
__device__ __forceinline__ void Advance(const Args& a, int64_t& j, int64_t& pass) {
  if (++pass == a.passes) {
    pass = 0;
    j += int64_t{gridDim.x} * kWarps;
  }
}

template <int M, int C>
__device__ FirstPasses<C> Prefetch(Args a) {
  FirstPasses<C> first;
  int64_t j = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32, pass = 0;
  if (j < a.rows) LoadPass<C>(a, j, pass, first.u0);
  Advance(a, j, pass);
  if (j < a.rows) LoadPass<C>(a, j, pass, first.u1);
  return first;
}

// AddRmsNormF32's BlockInvRms (kernels/norm/rms_norm.cu), the same reduction order.
__device__ __forceinline__ float BlockInvRms(float ss, int64_t dim, float eps) {
  __shared__ float partial[kWarps];
  __shared__ float inv_rms;
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kWarps; ++w) total += partial[w];
    inv_rms = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
  }
  __syncthreads();
  return inv_rms;
}

// kCopy: act (m rows of k bf16 values, 16-byte aligned) = bf16(a); every thread returns after it
// is complete.
__device__ void StageCopy(const StagedGemvParams& p, uint16_t* act) {
  const int64_t k8 = p.k / 8;
  uint4* act8 = reinterpret_cast<uint4*>(act);
  for (int64_t i = threadIdx.x; i < p.m * k8; i += kThreads) {
    const int64_t r = i / k8, c8 = i % k8;
    uint4 v;
    if (p.a_bf16) {
      v = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.a) + r * p.lda + 8 * c8);
    } else {
      const float4* f =
          reinterpret_cast<const float4*>(static_cast<const float*>(p.a) + r * p.lda + 8 * c8);
      const float4 x = f[0], y = f[1];
      v = make_uint4(Pack(x.x, x.y), Pack(x.z, x.w), Pack(y.x, y.y), Pack(y.z, y.w));
    }
    act8[i] = v;
  }
  __syncthreads();
}

// act = the prologue's activation; every thread returns after it is complete.
__device__ void Stage(const StagedGemvParams& p, uint16_t* act) {
  const int64_t k = p.k;
  if (p.prologue == StagedGemvPrologue::kCopy) return StageCopy(p, act);
  // kAddRmsNorm: per row, AddRmsNormF32's arithmetic (each thread the elements tid + i * 256 in
  // order, the same block reduction), without writing x yet: other blocks still read it.
  for (int64_t r = 0; r < p.m; ++r) {
    const float* xr = p.x + r * k;
    const float* yr = p.y != nullptr ? p.y + r * k : nullptr;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < k; i += kThreads) {
      const float v = yr != nullptr ? xr[i] + yr[i] : xr[i];
      ss += v * v;
    }
    const float inv = BlockInvRms(ss, k, p.eps);
    for (int64_t i = threadIdx.x; i < k; i += kThreads) {
      const float v = yr != nullptr ? xr[i] + yr[i] : xr[i];
      act[r * k + i] = static_cast<uint16_t>(Bf16Bits(p.norm_weight[i] * (v * inv)));
    }
  }
  __syncthreads();
  if (p.y == nullptr) return;
  // x += y once, by the last block to finish reading x: every other block has counted itself
  // after its reads. The counter goes back to 0 for the next launch.
  __shared__ bool last;
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(p.counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (last) {
    for (int64_t i = threadIdx.x; i < p.m * k; i += kThreads) p.x[i] = p.x[i] + p.y[i];
    if (threadIdx.x == 0) *p.counter = 0;
  }
}

// acc[r] += the products of weight chunk q (wq) with chunk q of activation row r, in order.
template <int M>
__device__ __forceinline__ void Accumulate(const uint4& wq, const uint16_t* act, int64_t k,
                                           int64_t q, float (&acc)[M]) {
  const float wv[8] = {Bf16Lo(wq.x), Bf16Hi(wq.x), Bf16Lo(wq.y), Bf16Hi(wq.y),
                       Bf16Lo(wq.z), Bf16Hi(wq.z), Bf16Lo(wq.w), Bf16Hi(wq.w)};
#pragma unroll
  for (int r = 0; r < M; ++r) {
    const uint4 aq = *reinterpret_cast<const uint4*>(act + r * k + 8 * q);
    const float av[8] = {Bf16Lo(aq.x), Bf16Hi(aq.x), Bf16Lo(aq.y), Bf16Hi(aq.y),
                         Bf16Lo(aq.z), Bf16Hi(aq.z), Bf16Lo(aq.w), Bf16Hi(aq.w)};
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[r] = fmaf(av[e], wv[e], acc[r]);
  }
}

// Sums the warp's partials of concatenated row j; lane r writes activation row r's output.
template <int M>
__device__ __forceinline__ void FinishRow(const Args& a, int64_t j, int lane, float (&acc)[M]) {
#pragma unroll
  for (int r = 0; r < M; ++r) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
  }
#pragma unroll
  for (int t = 0; t < kStagedGemvMaxTargets; ++t) {
    const StagedGemvTarget& tg = a.p.targets[t];
    if (t < a.p.num_targets && j >= a.begin[t] && j < a.begin[t] + tg.n) {
#pragma unroll
      for (int r = 0; r < M; ++r) {
        if (lane == r) {
          float* c = tg.c + r * tg.ldc + (j - a.begin[t]);
          *c = tg.accumulate ? *c + acc[r] : acc[r];
        }
      }
    }
  }
}

template <int M, int C>
__device__ void Body(const FirstPasses<C>& first, Args a) {
  extern __shared__ uint4 staged[];
  uint16_t* act = reinterpret_cast<uint16_t*>(staged);
  Stage(a.p, act);
  const int lane = threadIdx.x % 32;
  const int64_t k = a.p.k;
  int64_t j = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32, pass = 0;
  int64_t next_j = j, next_pass = pass;
  Advance(a, next_j, next_pass);
  Chunks<C> cur = first.u0, next = first.u1;
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.0f;
  while (j < a.rows) {
#pragma unroll
    for (int u = 0; u < C; ++u) {
      const int64_t q = (pass * C + u) * 32 + lane;
      if (q < a.chunks) Accumulate<M>(cur.q[u], act, k, q, acc);
    }
    if (pass == a.passes - 1) {
      FinishRow<M>(a, j, lane, acc);
#pragma unroll
      for (int r = 0; r < M; ++r) acc[r] = 0.0f;
    }
    // Move on; the pass after next goes in flight while the next one is used.
    j = next_j, pass = next_pass;
    cur = next;
    Advance(a, next_j, next_pass);
    if (next_j < a.rows) LoadPass<C>(a, next_j, next_pass, next);
  }
}

// ---- kSharedMemory ----

// The m rows' 1 / rms at once: BlockInvRms's arithmetic and order for each row (the same
// shuffles, the warps' sums added in warp order), one pair of barriers for all rows.
template <int M>
__device__ __forceinline__ void BlockInvRmsRows(float (&ss)[M], int64_t dim, float eps,
                                                float (&inv)[M]) {
  __shared__ float partial[kWarps][M];
  __shared__ float inv_rms[M];
#pragma unroll
  for (int r = 0; r < M; ++r) {
    for (int o = 16; o > 0; o >>= 1) ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], o);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32][r] = ss[r];
  }
  __syncthreads();
  if (threadIdx.x < M) {
    float total = 0.0f;
    for (int w = 0; w < kWarps; ++w) total += partial[w][threadIdx.x];
    inv_rms[threadIdx.x] = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < M; ++r) inv[r] = inv_rms[r];
}

// kAddRmsNorm for k <= kThreads * kPer: every x, y and norm weight value a thread needs is loaded
// before the first is used (one round trip instead of one per element pass), then Stage's
// arithmetic per element (thread t: elements t, t + kThreads, ... in that order), so act is bit
// for bit Stage's (and AddRmsNormF32's out_bf16). x + y also goes to `sums` when not null.
template <int M, int kPer>
__device__ void StageNormInRegisters(const StagedGemvParams& p, uint16_t* act, float* sums) {
  const int64_t k = p.k;
  float v[M][kPer], g[kPer];
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int64_t i = threadIdx.x + int64_t{e} * kThreads;
    g[e] = i < k ? p.norm_weight[i] : 0.0f;
#pragma unroll
    for (int r = 0; r < M; ++r) {
      v[r][e] = 0.0f;
      if (i < k) v[r][e] = p.y != nullptr ? p.x[r * k + i] + p.y[r * k + i] : p.x[r * k + i];
    }
  }
  float ss[M], inv[M];
#pragma unroll
  for (int r = 0; r < M; ++r) {
    ss[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      if (threadIdx.x + int64_t{e} * kThreads < k) ss[r] += v[r][e] * v[r][e];
    }
  }
  BlockInvRmsRows<M>(ss, k, p.eps, inv);
#pragma unroll
  for (int r = 0; r < M; ++r) {
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int64_t i = threadIdx.x + int64_t{e} * kThreads;
      if (i < k) {
        act[r * k + i] = static_cast<uint16_t>(Bf16Bits(g[e] * (v[r][e] * inv[r])));
        if (sums != nullptr) sums[r * k + i] = v[r][e];
      }
    }
  }
  __syncthreads();
}

// kAddRmsNorm for any k: Stage's loops (two passes over x and y per row), x + y also to `sums`.
__device__ void StageNormLoops(const StagedGemvParams& p, uint16_t* act, float* sums) {
  const int64_t k = p.k;
  for (int64_t r = 0; r < p.m; ++r) {
    const float* xr = p.x + r * k;
    const float* yr = p.y != nullptr ? p.y + r * k : nullptr;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < k; i += kThreads) {
      const float v = yr != nullptr ? xr[i] + yr[i] : xr[i];
      ss += v * v;
    }
    const float inv = BlockInvRms(ss, k, p.eps);
    for (int64_t i = threadIdx.x; i < k; i += kThreads) {
      const float v = yr != nullptr ? xr[i] + yr[i] : xr[i];
      act[r * k + i] = static_cast<uint16_t>(Bf16Bits(p.norm_weight[i] * (v * inv)));
      if (sums != nullptr) sums[r * k + i] = v;
    }
  }
  __syncthreads();
}

struct CopiesIssued {};

// Every weight row of this warp (rows j, j + all warps, ...: Prefetch's order) into its slot of
// shared memory, one commit group per row (an empty group past the last row), each lane the
// chunks lane, lane + 32, ... that it multiplies later. Weights only: safe before the wait.
template <int M>
__device__ CopiesIssued PrefetchToShared(Args a) {
  extern __shared__ uint4 smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint4* slot = smem + a.weights_at + warp * a.per_warp * a.chunks;
  const int64_t stride = int64_t{gridDim.x} * kWarps;
  int64_t j = int64_t{blockIdx.x} * kWarps + warp;
  for (int64_t i = 0; i < a.per_warp; ++i, j += stride, slot += a.chunks) {
    if (j < a.rows) {
      const uint16_t* wr = RowWeights(a, j);
      for (int64_t q = lane; q < a.chunks; q += 32) {
        sm80::CopyAsync16(sm80::SharedAddr(slot + q), wr + 8 * q, true);
      }
    }
    sm80::CopyAsyncCommit();
  }
  return {};
}

// Waits until at most `pending` of this thread's copy groups are in flight (fewer for pending
// above 7: the wait takes an immediate).
__device__ __forceinline__ void WaitForCopies(int64_t pending) {
  switch (pending) {
    case 0:
      return sm80::CopyAsyncWait<0>();
    case 1:
      return sm80::CopyAsyncWait<1>();
    case 2:
      return sm80::CopyAsyncWait<2>();
    case 3:
      return sm80::CopyAsyncWait<3>();
    case 4:
      return sm80::CopyAsyncWait<4>();
    case 5:
      return sm80::CopyAsyncWait<5>();
    case 6:
      return sm80::CopyAsyncWait<6>();
    default:
      return sm80::CopyAsyncWait<7>();
  }
}

template <int M>
__device__ void SharedBody(const CopiesIssued&, Args a) {
  extern __shared__ uint4 smem[];
  uint16_t* act = reinterpret_cast<uint16_t*>(smem);
  float* sums = a.sums_at >= 0 ? reinterpret_cast<float*>(smem + a.sums_at) : nullptr;
  const StagedGemvParams& p = a.p;
  const int64_t k = p.k;
  const bool norm = p.prologue == StagedGemvPrologue::kAddRmsNorm;
  if (!norm) {
    StageCopy(p, act);
  } else if (k <= kThreads * 8) {
    StageNormInRegisters<M, 8>(p, act, sums);
  } else if (k <= kThreads * 16 && M <= 2) {
    StageNormInRegisters<M, 16>(p, act, sums);
  } else {
    StageNormLoops(p, act, sums);
  }
  // The residual's write-back needs every block's reads of x done: each block counts itself now
  // (its reads are complete), and warp 0 of the last one writes x after its own rows, so the
  // atomic's round trip overlaps the GEMV.
  const bool write_back = norm && p.y != nullptr;
  unsigned int counted = 0;
  if (write_back && threadIdx.x == 0) {
    __threadfence();
    counted = atomicAdd(p.counter, 1u);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint4* slot = smem + a.weights_at + warp * a.per_warp * a.chunks;
  const int64_t stride = int64_t{gridDim.x} * kWarps;
  int64_t j = int64_t{blockIdx.x} * kWarps + warp;
  for (int64_t i = 0; i < a.per_warp && j < a.rows; ++i, j += stride, slot += a.chunks) {
    WaitForCopies(a.per_warp - 1 - i);
    float acc[M];
#pragma unroll
    for (int r = 0; r < M; ++r) acc[r] = 0.0f;
#pragma unroll 4
    for (int64_t q = lane; q < a.chunks; q += 32) Accumulate<M>(slot[q], act, k, q, acc);
    FinishRow<M>(a, j, lane, acc);
  }
  if (write_back && warp == 0) {
    counted = __shfl_sync(0xffffffffu, counted, 0);
    if (counted == gridDim.x - 1) {
      const int64_t n = p.m * k;  // a multiple of 8
      if (sums != nullptr && reinterpret_cast<uintptr_t>(p.x) % 16 == 0) {
        float4* x4 = reinterpret_cast<float4*>(p.x);
        const float4* s4 = reinterpret_cast<const float4*>(sums);
        for (int64_t i = lane; i < n / 4; i += 32) x4[i] = s4[i];
      } else {
        for (int64_t i = lane; i < n; i += 32) {
          p.x[i] = sums != nullptr ? sums[i] : p.x[i] + p.y[i];
        }
      }
      if (lane == 0) *p.counter = 0;
    }
  }
}

// The kSharedMemory launch's geometry: Launch's grid (one wave of at most kBlocksPerSm blocks per
// SM), and the dynamic shared memory in 16-byte units: the activation, x + y when it is at most
// kMaxSumsBytes, every row of the block's warps.
constexpr int64_t kMaxSumsBytes = 32 * 1024;

struct SharedGeometry {
  int64_t blocks, per_warp, sums_at, weights_at, bytes;
};

SharedGeometry SharedLayout(const StagedGemvParams& p, int64_t rows, int sms) {
  SharedGeometry g;
  const int64_t max_blocks = int64_t{kBlocksPerSm} * sms;
  g.per_warp = (rows + kWarps * max_blocks - 1) / (kWarps * max_blocks);
  g.blocks = (rows + kWarps * g.per_warp - 1) / (kWarps * g.per_warp);
  const int64_t act16 = (p.m * p.k * 2 + 15) / 16;
  const bool sums = p.prologue == StagedGemvPrologue::kAddRmsNorm && p.y != nullptr &&
                    p.m * p.k * 4 <= kMaxSumsBytes;
  g.sums_at = sums ? act16 : -1;
  g.weights_at = act16 + (sums ? p.m * p.k * 4 / 16 : 0);
  g.bytes = 16 * (g.weights_at + kWarps * g.per_warp * (p.k / 8));
  return g;
}

template <int M>
cudaError_t LaunchSharedM(Args a, cudaStream_t stream, bool* launched) {
  *launched = false;
  constexpr auto kKernel =
      launch_internal::PrefetchEntry<&PrefetchToShared<M>, &SharedBody<M>, kThreads>::kKernel;
  const KernelFacts facts =
      KernelFactsForCurrentDevice(reinterpret_cast<const void*>(kKernel), kAllSharedMemory);
  if (facts.error != cudaSuccess) return facts.error;
  // cp.async needs sm_80 (the compute_75 PTX has none).
  if (facts.ptx_version < 80) return cudaSuccess;
  const SharedGeometry g = SharedLayout(a.p, a.rows, facts.sms);
  if (g.bytes > kStagedGemvMaxSharedWeightsBytes || g.bytes > facts.max_smem) return cudaSuccess;
  a.per_warp = g.per_warp, a.sums_at = g.sums_at, a.weights_at = g.weights_at;
  *launched = true;
  return LaunchPrefetchThenAfterPrecedingGrids<&PrefetchToShared<M>, &SharedBody<M>, kThreads>(
      dim3(static_cast<unsigned>(g.blocks)), static_cast<size_t>(g.bytes), stream, a);
}

cudaError_t LaunchShared(const Args& a, cudaStream_t stream, bool* launched) {
  switch (a.p.m) {
    case 1:
      return LaunchSharedM<1>(a, stream, launched);
    case 2:
      return LaunchSharedM<2>(a, stream, launched);
    case 3:
      return LaunchSharedM<3>(a, stream, launched);
    default:
      return LaunchSharedM<4>(a, stream, launched);
  }
}

template <int M, int C>
cudaError_t LaunchMc(const Args& a, cudaStream_t stream) {
  constexpr auto kKernel =
      launch_internal::PrefetchEntry<&Prefetch<M, C>, &Body<M, C>, kThreads>::kKernel;
  // The first query raises the kernel's dynamic shared-memory limit to the largest activation.
  const KernelFacts facts = KernelFactsForCurrentDevice(reinterpret_cast<const void*>(kKernel),
                                                        kStagedGemvMaxActivationBytes);
  if (facts.error != cudaSuccess) return facts.error;
  if (facts.max_smem < kStagedGemvMaxActivationBytes) return cudaErrorInvalidValue;
  // Blocks resident per SM at the largest staged activation (registers bound it), once per
  // instantiation: a grid beyond one wave would leave its last blocks' loads to the end.
  static const int resident = [] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &n, kKernel, kThreads, kStagedGemvMaxActivationBytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return 1;
    }
    return n < 1 ? 1 : (n > kBlocksPerSm ? kBlocksPerSm : n);
  }();
  // Rows per warp so that the grid is one wave of at most kBlocksPerSm blocks per SM, then as
  // few blocks as that many rows per warp need.
  const int64_t max_blocks = int64_t{resident} * facts.sms;
  const int64_t per_warp = (a.rows + kWarps * max_blocks - 1) / (kWarps * max_blocks);
  const int64_t blocks = (a.rows + kWarps * per_warp - 1) / (kWarps * per_warp);
  const size_t smem = static_cast<size_t>(a.p.m * a.p.k * 2);
  return LaunchPrefetchThenAfterPrecedingGrids<&Prefetch<M, C>, &Body<M, C>, kThreads>(
      dim3(static_cast<unsigned>(blocks)), smem, stream, a);
}

template <int M>
cudaError_t LaunchM(const Args& a, cudaStream_t stream) {
  const int64_t per_pass = (a.chunks + a.passes - 1) / a.passes;  // chunks per pass
  const int64_t c = (per_pass + 31) / 32;                         // per lane
  if (c <= 1) return LaunchMc<M, 1>(a, stream);
  if (c <= 2) return LaunchMc<M, 2>(a, stream);
  if (c <= 4) return LaunchMc<M, 4>(a, stream);
  if (c <= 6) return LaunchMc<M, 6>(a, stream);
  return LaunchMc<M, 8>(a, stream);
}

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

bool StagedGemvSupports(const StagedGemvParams& p) {
  if (p.m < 1 || p.m > kStagedGemvMaxRows || p.k < 8 || p.k % 8 != 0 ||
      p.m * p.k * 2 > kStagedGemvMaxActivationBytes || p.num_targets < 1 ||
      p.num_targets > kStagedGemvMaxTargets) {
    return false;
  }
  int64_t rows = 0;
  for (int t = 0; t < p.num_targets; ++t) {
    const StagedGemvTarget& tg = p.targets[t];
    if (tg.n < 1 || tg.w == nullptr || !Aligned16(tg.w) || tg.ldw < p.k || tg.ldw % 8 != 0 ||
        tg.c == nullptr || tg.ldc < tg.n) {
      return false;
    }
    rows += tg.n;
  }
  if (rows > (int64_t{1} << 31)) return false;
  if (p.prologue == StagedGemvPrologue::kCopy) {
    const int64_t a_bytes = p.a_bf16 ? 2 : 4;
    return p.a != nullptr && Aligned16(p.a) && p.lda >= p.k && (p.lda * a_bytes) % 16 == 0;
  }
  return p.x != nullptr && p.norm_weight != nullptr && (p.y == nullptr || p.counter != nullptr);
}

bool StagedGemvPreferredAtOneRow(int64_t n, int64_t k) {
  return k >= 1024 && k <= 4096 && n < 65536 && !(k <= 2048 && n > 1024 && n <= 2048);
}

bool StagedGemvSharedPreferredAtOneRow(int64_t n, int64_t k) {
  return k >= 1024 && k <= 4096 && n < 65536;
}

int64_t StagedGemvSharedWeightsBytes(const StagedGemvParams& p, int sms) {
  int64_t rows = 0;
  for (int t = 0; t < p.num_targets && t < kStagedGemvMaxTargets; ++t) rows += p.targets[t].n;
  return SharedLayout(p, rows, sms < 1 ? 1 : sms).bytes;
}

cudaError_t StagedGemvBf16(const StagedGemvParams& p, cudaStream_t stream) {
  if (!StagedGemvSupports(p)) return cudaErrorInvalidValue;
  Args a;
  a.p = p;
  a.rows = 0;
  for (int t = 0; t < kStagedGemvMaxTargets; ++t) {
    a.begin[t] = a.rows;
    if (t < p.num_targets) a.rows += p.targets[t].n;
  }
  a.chunks = p.k / 8;
  a.passes = (a.chunks + 32 * kMaxChunks - 1) / (32 * kMaxChunks);
  a.per_warp = 0, a.sums_at = -1, a.weights_at = 0;
  if (p.weights == StagedGemvWeights::kSharedMemory) {
    bool launched = false;
    const cudaError_t err = LaunchShared(a, stream, &launched);
    if (err != cudaSuccess || launched) return err;
  }
  switch (p.m) {
    case 1:
      return LaunchM<1>(a, stream);
    case 2:
      return LaunchM<2>(a, stream);
    case 3:
      return LaunchM<3>(a, stream);
    default:
      return LaunchM<4>(a, stream);
  }
}

}  // namespace kernels
}  // namespace deepinfer
