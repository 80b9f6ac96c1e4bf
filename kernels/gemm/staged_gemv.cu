// Staged small-m GEMV (staged_gemv.h). A block of 8 warps first stages the m activation rows in
// shared memory as bf16 (copied and rounded, or made by the add + RMS norm prologue), then each
// warp walks its weight rows: row j = warp's global index + i * (all warps), each row in passes
// of 32 * C 16-byte chunks (C up to 8; the fewest passes that allows). A lane's chunks of a pass
// are loaded all at once into one of two register slots, a ring: the warp's next two passes (of
// this row or its next rows) are in flight while it waits for the first, and a slot is loaded
// again (the pass two ahead) as soon as its chunks have been multiplied, before the row's sum is
// reduced. A lane sums its chunks lane, lane + 32, ... in that order. The first two passes are
// loaded before the wait for the preceding kernel (programmatic dependent launch: weights are
// never written during a step), overlapping that kernel's tail and this kernel's staging. A batch
// of products runs as grid rows (blockIdx.y), each block staging its product's activation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/common/kernel_facts.h"
#include "kernels/common/launch.cuh"
#include "kernels/common/streaming_load.cuh"
#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/gemm/staged_gemv.h"
#include "kernels/norm/block_inv_rms.cuh"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kBlocksPerSm = 2;  // the grid: at most this many blocks per SM
constexpr int kMaxChunks = 8;    // 16-byte weight chunks per lane and pass
constexpr int kInFlight = 2;     // passes in flight per warp: the ring's slots
constexpr int kStageLoads = 2;   // 16-byte activation groups a thread loads before storing any

// What the kernel needs beside the caller's parameters, computed on the host.
struct Args {
  StagedGemvParams p;
  int64_t begin[kStagedGemvMaxTargets];  // first concatenated row of each target
  int64_t rows;                          // all targets' rows
  int64_t chunks;                        // 16-byte chunks of a weight row (k / 8; FP8 k / 16)
  int64_t passes;                        // passes per row
  int lane_chunks;                       // 16-byte chunks a lane per pass (C)
};

template <int C>
struct Chunks {
  uint4 q[C];
  float scale[C];  // FP8: each chunk's block scale
};

// The passes in flight (slot d: the warp's passes d, d + kInFlight, d + 2 kInFlight, ...).
template <int C>
struct Ring {
  Chunks<C> slot[kInFlight];
};

__device__ __forceinline__ float Bf16Lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float Bf16Hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }
__device__ __forceinline__ uint32_t Bf16Bits(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
__device__ __forceinline__ uint32_t Pack(float lo, float hi) {
  return Bf16Bits(lo) | (Bf16Bits(hi) << 16);
}

// Concatenated row j's weights (every index static, so the parameters stay in registers).
__device__ __forceinline__ const uint8_t* RowWeights(const Args& a, int64_t j) {
  const uint8_t* w = nullptr;
#pragma unroll
  for (int t = 0; t < kStagedGemvMaxTargets; ++t) {
    if (t < a.p.num_targets && j >= a.begin[t]) {
      const StagedGemvTarget& tg = a.p.targets[t];
      w = a.p.fp8 ? tg.w8 + (j - a.begin[t]) * tg.ldw
                  : reinterpret_cast<const uint8_t*>(tg.w + (j - a.begin[t]) * tg.ldw);
    }
  }
  return w;
}

// FP8: concatenated row j's scale row (block b of the row at [b]).
__device__ __forceinline__ const float* RowScales(const Args& a, int64_t j) {
  const float* s = nullptr;
#pragma unroll
  for (int t = 0; t < kStagedGemvMaxTargets; ++t) {
    if (t < a.p.num_targets && j >= a.begin[t]) {
      const StagedGemvTarget& tg = a.p.targets[t];
      s = tg.scales + Fp8ScaleRow(j - a.begin[t], tg.split_rows) * tg.scale_ld;
    }
  }
  return s;
}

// The e4m3 bytes of w (the lowest first) as fp32 values: exact (e4m3 values are f16 values),
// two bytes widened to f16 at once, then each to fp32.
__device__ __forceinline__ void Fp8x4(uint32_t w, float f[4]) {
  const __half2_raw lo =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xFFFFu), __NV_E4M3);
  const __half2_raw hi =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
  const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
  f[0] = a.x;
  f[1] = a.y;
  f[2] = b.x;
  f[3] = b.y;
}

// Pass `pass` of row j: chunks (pass * C + u) * 32 + lane, zeros past the row's end (F: FP8,
// with their blocks' scales).
template <int C, bool F>
__device__ __forceinline__ void LoadPass(const Args& a, int64_t j, int64_t pass, Chunks<C>& out) {
  const int lane = threadIdx.x % 32;
  const uint8_t* wr = RowWeights(a, j);
#pragma unroll
  for (int u = 0; u < C; ++u) {
    const int64_t q = (pass * C + u) * 32 + lane;
    out.q[u] = q < a.chunks ? LoadStreaming16(wr + 16 * q) : make_uint4(0, 0, 0, 0);
  }
  if constexpr (F) {
    const float* sr = RowScales(a, j);
#pragma unroll
    for (int u = 0; u < C; ++u) {
      const int64_t q = (pass * C + u) * 32 + lane;
      out.scale[u] = q < a.chunks ? __ldg(sr + q / 8) : 0.0f;
    }
  }
}

// The unit after (j, pass) in this warp's list.
__device__ __forceinline__ void Advance(const Args& a, int64_t& j, int64_t& pass) {
  if (++pass == a.passes) {
    pass = 0;
    j += int64_t{gridDim.x} * kWarps;
  }
}

// Product blockIdx.y's activation, weights and outputs (batch > 1: one target, kCopy).
__device__ __forceinline__ void SelectProduct(Args& a) {
  const int64_t b = blockIdx.y;
  if (b == 0) return;
  a.p.a = static_cast<const char*>(a.p.a) + b * a.p.stride_a * (a.p.a_bf16 ? 2 : 4);
  a.p.targets[0].w += b * a.p.stride_w;
  a.p.targets[0].c += b * a.p.stride_c;
}

template <int M, int C, bool F>
__device__ Ring<C> Prefetch(Args a) {
  SelectProduct(a);
  Ring<C> ring;
  int64_t j = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32, pass = 0;
#pragma unroll
  for (int d = 0; d < kInFlight; ++d) {
    if (j < a.rows) LoadPass<C, F>(a, j, pass, ring.slot[d]);
    Advance(a, j, pass);
  }
  return ring;
}

// act (m rows of k bf16 values, 16-byte aligned) = the prologue's activation; every thread
// returns after it is complete.
__device__ void Stage(const StagedGemvParams& p, uint16_t* act) {
  const int64_t k = p.k;
  if (p.prologue == StagedGemvPrologue::kCopy) {
    // Groups of 8 values, kStageLoads a thread loaded before any is stored (the activation was
    // just written: each round trip is an L2 latency the weight loads in flight must cover).
    const int64_t k8 = k / 8, groups = p.m * k8;
    uint4* act8 = reinterpret_cast<uint4*>(act);
    for (int64_t i0 = threadIdx.x; i0 < groups; i0 += kStageLoads * kThreads) {
      float4 lo[kStageLoads], hi[kStageLoads];
      uint4 v[kStageLoads];
#pragma unroll
      for (int u = 0; u < kStageLoads; ++u) {
        const int64_t i = i0 + u * kThreads;
        if (i >= groups) continue;
        const int64_t r = i / k8, c8 = i % k8;
        if (p.a_bf16) {
          v[u] = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.a) + r * p.lda +
                                                 8 * c8);
        } else {
          const float4* f =
              reinterpret_cast<const float4*>(static_cast<const float*>(p.a) + r * p.lda + 8 * c8);
          lo[u] = f[0], hi[u] = f[1];
        }
      }
#pragma unroll
      for (int u = 0; u < kStageLoads; ++u) {
        const int64_t i = i0 + u * kThreads;
        if (i >= groups) continue;
        if (!p.a_bf16) {
          v[u] = make_uint4(Pack(lo[u].x, lo[u].y), Pack(lo[u].z, lo[u].w), Pack(hi[u].x, hi[u].y),
                            Pack(hi[u].z, hi[u].w));
        }
        act8[i] = v[u];
      }
    }
    __syncthreads();
    return;
  }
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
    const float inv = BlockInvRms<kWarps>(ss, k, p.eps);
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

// acc[r] += activation row r times pass `pass`'s chunks c (F: FP8, with their blocks' scales).
template <int M, int C, bool F>
__device__ __forceinline__ void Accumulate(const Args& a, const uint16_t* act, const Chunks<C>& c,
                                           int64_t pass, float (&acc)[M]) {
  const int lane = threadIdx.x % 32;
  const int64_t k = a.p.k;
#pragma unroll
  for (int u = 0; u < C; ++u) {
    const int64_t q = (pass * C + u) * 32 + lane;
    if constexpr (F) {
      if (q >= a.chunks) continue;
      // 16 weights of k block 16 q / 128; their sum per row times the block's scale.
      const uint32_t words[4] = {c.q[u].x, c.q[u].y, c.q[u].z, c.q[u].w};
      const float scale = c.scale[u];
#pragma unroll
      for (int r = 0; r < M; ++r) {
        const uint4* aq = reinterpret_cast<const uint4*>(act + r * k + 16 * q);
        float s = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint4 av4 = aq[h];
          const float av[8] = {Bf16Lo(av4.x), Bf16Hi(av4.x), Bf16Lo(av4.y), Bf16Hi(av4.y),
                               Bf16Lo(av4.z), Bf16Hi(av4.z), Bf16Lo(av4.w), Bf16Hi(av4.w)};
          float wv[8];
          Fp8x4(words[2 * h], wv);
          Fp8x4(words[2 * h + 1], wv + 4);
#pragma unroll
          for (int e = 0; e < 8; ++e) s = fmaf(av[e], wv[e], s);
        }
        acc[r] = fmaf(s, scale, acc[r]);
      }
    } else if (q < a.chunks) {
      const uint4 wq = c.q[u];
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
  }
}

// Row j's sums: the warp's lanes added (xor butterflies), lane r writing activation row r's;
// acc back to 0 for the next row.
template <int M>
__device__ __forceinline__ void Finish(const Args& a, int64_t j, float (&acc)[M]) {
  const int lane = threadIdx.x % 32;
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
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.0f;
}

// F: FP8 weights (StagedGemvParams::fp8).
template <int M, int C, bool F>
__device__ void Body(const Ring<C>& first, Args a) {
  SelectProduct(a);
  extern __shared__ uint4 staged[];
  uint16_t* act = reinterpret_cast<uint16_t*>(staged);
  Stage(a.p, act);
  // (j, pass): the pass in the slot being used; (load_j, load_pass): the pass kInFlight ahead of
  // it.
  int64_t j = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32, pass = 0;
  int64_t load_j = j, load_pass = pass;
#pragma unroll
  for (int d = 0; d < kInFlight; ++d) Advance(a, load_j, load_pass);
  Ring<C> ring = first;
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.0f;
  while (j < a.rows) {
#pragma unroll
    for (int d = 0; d < kInFlight; ++d) {
      if (j < a.rows) {
        Accumulate<M, C, F>(a, act, ring.slot[d], pass, acc);
        if (load_j < a.rows) LoadPass<C, F>(a, load_j, load_pass, ring.slot[d]);
        Advance(a, load_j, load_pass);
        if (pass == a.passes - 1) Finish<M>(a, j, acc);
        Advance(a, j, pass);
      }
    }
  }
}

template <int M, int C, bool F>
cudaError_t LaunchMc(const Args& a, cudaStream_t stream) {
  constexpr auto kKernel =
      launch_internal::PrefetchEntry<&Prefetch<M, C, F>, &Body<M, C, F>, kThreads>::kKernel;
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
  // Rows per warp so that the grid (all products) is one wave of at most kBlocksPerSm blocks per
  // SM, then as few blocks per product as that many rows per warp need.
  const int64_t max_blocks = int64_t{resident} * facts.sms;
  const int64_t all_rows = a.rows * a.p.batch;
  const int64_t per_warp = (all_rows + kWarps * max_blocks - 1) / (kWarps * max_blocks);
  const int64_t blocks = (a.rows + kWarps * per_warp - 1) / (kWarps * per_warp);
  const size_t smem = static_cast<size_t>(a.p.m * a.p.k * 2);
  return LaunchPrefetchThenAfterPrecedingGrids<&Prefetch<M, C, F>, &Body<M, C, F>, kThreads>(
      dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(a.p.batch)), smem, stream, a);
}

template <int M, bool F>
cudaError_t LaunchMf(const Args& a, cudaStream_t stream) {
  switch (a.lane_chunks) {
    case 1:
      return LaunchMc<M, 1, F>(a, stream);
    case 2:
      return LaunchMc<M, 2, F>(a, stream);
    case 4:
      return LaunchMc<M, 4, F>(a, stream);
    case 6:
      return LaunchMc<M, 6, F>(a, stream);
    default:
      return LaunchMc<M, 8, F>(a, stream);
  }
}

template <int M>
cudaError_t LaunchM(const Args& a, cudaStream_t stream) {
  return a.p.fp8 ? LaunchMf<M, true>(a, stream) : LaunchMf<M, false>(a, stream);
}

// Chunks a lane per pass when a row of `chunks` takes `passes` (1, 2, 4, 6 or 8).
int LaneChunks(int64_t chunks, int64_t passes) {
  const int64_t per_pass = (chunks + passes - 1) / passes;  // chunks per pass
  const int64_t c = (per_pass + 31) / 32;                   // per lane
  return c <= 1 ? 1 : c <= 2 ? 2 : c <= 4 ? 4 : c <= 6 ? 6 : 8;
}

// The fewest passes of at most max_c chunks a lane.
int64_t PassesOf(int64_t chunks, int max_c) { return (chunks + 32 * max_c - 1) / (32 * max_c); }

Args MakeArgs(const StagedGemvParams& p) {
  Args a;
  a.p = p;
  a.rows = 0;
  for (int t = 0; t < kStagedGemvMaxTargets; ++t) {
    a.begin[t] = a.rows;
    if (t < p.num_targets) a.rows += p.targets[t].n;
  }
  a.chunks = p.fp8 ? p.k / 16 : p.k / 8;
  a.passes = PassesOf(a.chunks, kMaxChunks);
  a.lane_chunks = LaneChunks(a.chunks, a.passes);
  return a;
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
    if (tg.n < 1 || tg.ldw < p.k || tg.c == nullptr || tg.ldc < tg.n) return false;
    if (p.fp8 ? (p.k % 16 != 0 || tg.w8 == nullptr || !Aligned16(tg.w8) || tg.ldw % 16 != 0 ||
                 tg.scales == nullptr || tg.scale_ld < Fp8ScaleCols(p.k) || tg.split_rows < 0)
              : (tg.w == nullptr || !Aligned16(tg.w) || tg.ldw % 8 != 0)) {
      return false;
    }
    rows += tg.n;
  }
  if (rows > (int64_t{1} << 31)) return false;
  if (p.batch != 1 && (p.batch < 1 || p.batch > 65535 || p.prologue != StagedGemvPrologue::kCopy ||
                       p.num_targets != 1 || p.fp8 || (p.stride_a * (p.a_bf16 ? 2 : 4)) % 16 != 0 ||
                       p.stride_w % 8 != 0)) {
    return false;
  }
  if (p.prologue == StagedGemvPrologue::kCopy) {
    const int64_t a_bytes = p.a_bf16 ? 2 : 4;
    return p.a != nullptr && Aligned16(p.a) && p.lda >= p.k && (p.lda * a_bytes) % 16 == 0;
  }
  return p.x != nullptr && p.norm_weight != nullptr && (p.y == nullptr || p.counter != nullptr);
}

bool StagedGemvPreferredAtOneRow(int64_t n, int64_t k) {
  if (k > 4096) return k <= 8192 && n <= 4096;
  if (n >= 65536) return k == 4096;
  return k >= 1024 && !(k <= 2048 && n > 1024 && n <= 2048);
}

bool StagedGemvPreferredAtTwoRows(int64_t n, int64_t k) {
  return k >= 1024 && k <= 2816 && n >= 2048 && n <= 4096;
}

bool StagedGemvPreferredBatchedAtOneRow(int64_t batch, int64_t n, int64_t k) {
  return batch >= 2 && k >= 2048 && k <= 8192 && n * batch >= 4096;
}

int StagedGemvLaneChunks(const StagedGemvParams& p) { return MakeArgs(p).lane_chunks; }

cudaError_t StagedGemvBf16(const StagedGemvParams& p, cudaStream_t stream) {
  if (!StagedGemvSupports(p)) return cudaErrorInvalidValue;
  const Args a = MakeArgs(p);
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
