// Swap-AB W8A8 grouped GEMM for decode on Hopper (wgmma + TMA): see fp8_wgmma_decode.h.
#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <vector>

#include "kernels/common/launch.cuh"
#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/gemm/fp8_wgmma_decode.h"
#include "kernels/gemm/swap_persistent.cuh"
#include "kernels/gemm/wgmma_tma.cuh"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kTileM = 128;   // weight rows a CTA
constexpr int kBlockK = 128;  // bytes of e4m3 a k block: one 128-byte swizzle row
constexpr int kStages = 4;
constexpr int kThreads = 160;  // warpgroup 0: consumer (both m64 halves); warp 4: producer
constexpr int kWeightTileBytes = kTileM * kBlockK;

constexpr size_t SmemBytes(int n_rows) {
  return 1024 /* alignment slack */ + size_t{kStages} * (kWeightTileBytes + n_rows * kBlockK) +
         2 * kStages * sizeof(uint64_t);
}

struct SwapArgs {
  int32_t n = 0, k_blocks = 0;
  int32_t split_rows = 0, scale_ld = 0;
  const int32_t* offsets = nullptr;
  const float* a_scales = nullptr;
  const CUtensorMap* w_maps = nullptr;
  const float* const* scales = nullptr;
  float* c = nullptr;
  uint16_t* c_bf16 = nullptr;  // instead of c: the results rounded to bf16
  int64_t ldc = 0;
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

using namespace wgmma;  // NOLINT: the shared device helpers
using swap_persistent::AcquireTensorMap;
using swap_persistent::PrefetchTensorMap;

// d (64 x N fp32 fragment, N / 2 registers a thread) = (accumulate ? d : 0) + A(64 x 32) B^T,
// both e4m3 from shared memory descriptors.
template <int N>
__device__ __forceinline__ void WgmmaM64K32(float* d, uint64_t desc_a, uint64_t desc_b,
                                            int accumulate);

template <>
__device__ __forceinline__ void WgmmaM64K32<8>(float* d, uint64_t desc_a, uint64_t desc_b,
                                               int accumulate) {
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.b32 p, %6, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3}, %4, %5, p, 1, 1;\n\t}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void WgmmaM64K32<16>(float* d, uint64_t desc_a, uint64_t desc_b,
                                                int accumulate) {
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.b32 p, %10, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n\t}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void WgmmaM64K32<24>(float* d, uint64_t desc_a, uint64_t desc_b,
                                                int accumulate) {
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.b32 p, %14, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n24k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11}, %12, %13, p, 1, 1;\n\t}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void WgmmaM64K32<32>(float* d, uint64_t desc_a, uint64_t desc_b,
                                                int accumulate) {
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.b32 p, %18, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, "
      "1;\n\t}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void WgmmaM64K32<64>(float* d, uint64_t desc_a, uint64_t desc_b,
                                                int accumulate) {
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.b32 p, %34, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n\t}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// One k block of both kernels' consumer warpgroup: wait for stage s's tiles, the two m64nNk128
// products (weight rows h * 64 ..) into part, release the stage, then acc += part * scale, scale
// the activation row's block scale times the weight block's (0 for rows past the group).
template <int N>
__device__ __forceinline__ void SwapKBlock(uint32_t w_stage, uint32_t a_stage, uint32_t full,
                                           uint32_t empty, uint32_t phase,
                                           const float (&scale)[N / 8][2], float (&acc)[2][N / 2]) {
  constexpr int kRegs = N / 2;
  float part[2][kRegs];
  MbarWait(full, phase);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int i = 0; i < kRegs; ++i) FenceReg(part[h][i]);
  }
  WgmmaFence();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t wa = w_stage + h * 64 * kBlockK;
#pragma unroll
    for (int kk = 0; kk < kBlockK / 32; ++kk) {
      WgmmaM64K32<N>(part[h], SmemDesc(wa + kk * 32), SmemDesc(a_stage + kk * 32), kk > 0);
    }
  }
  WgmmaCommit();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int i = 0; i < kRegs; ++i) FenceReg(part[h][i]);
  }
  WgmmaWaitAll();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int i = 0; i < kRegs; ++i) FenceReg(part[h][i]);
  }
  MbarArrive(empty);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int i = 0; i < kRegs; ++i) acc[h][i] = fmaf(part[h][i], scale[i / 4][i % 2], acc[h][i]);
  }
}

// c[r0 + row, j] = acc for the rows row < count of the group and weight rows j < n: wgmma's
// fragment puts the weight rows j as 8 consecutive columns of c across lane / 4; c0 is this
// thread's first row (as an offset in the group).
template <int N>
__device__ __forceinline__ void SwapStoreF32(const float (&acc)[2][N / 2], const SwapArgs& args,
                                             int32_t r0, int32_t c0, int32_t count, int32_t m0) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const int32_t row = c0 + 8 * (i / 4) + i % 2;
      const int32_t j = m0 + h * 64 + warp * 16 + lane / 4 + 8 * ((i % 4) / 2);
      if (row < count && j < args.n) args.c[int64_t{r0 + row} * args.ldc + j] = acc[h][i];
    }
  }
}

// Two bf16 (nearest even) in one word, lo at the lower address.
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  return uint32_t{__bfloat16_as_ushort(__float2bfloat16_rn(lo))} |
         (uint32_t{__bfloat16_as_ushort(__float2bfloat16_rn(hi))} << 16);
}

// SwapStoreF32's values rounded to bf16 into c_bf16, regrouped across lanes so that each thread
// writes 4 consecutive columns of one row (8 bytes) and a warp's store instruction covers 8 rows x
// 32 bytes, whole 32-byte sectors as the fp32 store's 4 rows x 32 bytes. Per block b of 4
// registers (4 b + 2 p + q: row c0 + 8 b + q, column t + 8 p, t = lane / 4 = 2 a + par):
//  1. lanes t and t ^ 1 swap the row each does not keep (par 0 keeps row 0, par 1 row 1): each
//     then holds column pairs a (word 0) and a + 4 (word 1) of its row;
//  2. among the 4 lanes of a row (a = lane / 8), lane a gathers pairs 2 a and 2 a + 1 in two
//     shuffles, source lane s sending its word s & 1 in the first and the other in the second.
// Every thread runs the shuffles (the whole warp takes part); the stores test row and column.
template <int N>
__device__ __forceinline__ void SwapStoreBf16(const float (&acc)[2][N / 2], const SwapArgs& args,
                                              int32_t r0, int32_t c0, int32_t count, int32_t m0) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int par = (lane / 4) & 1, a = lane / 8;
  const int s0 = ((a & 1) << 1) | (a >> 1), s1 = s0 ^ 1;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int b = 0; b < N / 8; ++b) {
      const float* v = &acc[h][4 * b];  // v[2 p + q]
      const uint32_t send = par == 0 ? PackBf16(v[1], v[3]) : PackBf16(v[0], v[2]);
      const uint32_t got = __shfl_xor_sync(0xffffffffu, send, 4);
      const uint32_t mine = par == 0 ? PackBf16(v[0], v[2]) : PackBf16(v[1], v[3]);
      // Word 0: columns 2 a, 2 a + 1; word 1: 2 a + 8, 2 a + 9 (of this warp's 16).
      const uint32_t w0 =
          par == 0 ? (mine & 0xffffu) | (got << 16) : (got & 0xffffu) | (mine << 16);
      const uint32_t w1 =
          par == 0 ? (mine >> 16) | (got & 0xffff0000u) : (got >> 16) | (mine & 0xffff0000u);
      const uint32_t x0 = __shfl_sync(0xffffffffu, (a & 1) ? w1 : w0, (lane & 7) | (s0 << 3));
      const uint32_t x1 = __shfl_sync(0xffffffffu, (a & 1) ? w0 : w1, (lane & 7) | (s1 << 3));
      const uint32_t lo = a < 2 ? x0 : x1, hi = a < 2 ? x1 : x0;
      const int32_t row = c0 + 8 * b + par;
      const int32_t j = m0 + h * 64 + warp * 16 + 4 * a;
      if (row >= count) continue;
      uint16_t* out = args.c_bf16 + int64_t{r0 + row} * args.ldc + j;
      if (j + 4 <= args.n && reinterpret_cast<uintptr_t>(out) % 8 == 0) {
        *reinterpret_cast<uint2*>(out) = make_uint2(lo, hi);
      } else {
        const uint16_t vals[4] = {static_cast<uint16_t>(lo), static_cast<uint16_t>(lo >> 16),
                                  static_cast<uint16_t>(hi), static_cast<uint16_t>(hi >> 16)};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (j + e < args.n) out[e] = vals[e];
        }
      }
    }
  }
}

template <int N>
__device__ __forceinline__ void SwapStore(const float (&acc)[2][N / 2], const SwapArgs& args,
                                          int32_t r0, int32_t c0, int32_t count, int32_t m0) {
  if (args.c_bf16 != nullptr) {
    SwapStoreBf16<N>(acc, args, r0, c0, count, m0);
  } else {
    SwapStoreF32<N>(acc, args, r0, c0, count, m0);
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Both kernels run under programmatic dependent launch (LaunchKernelThatWaits): before
// griddepcontrol.wait they touch only what no kernel of the step writes (shared memory, the
// mbarriers, the descriptors, the weight-scale pointer table); the offsets, activation rows and
// scales are read and c written after it.
//
// Grid (weight tiles, groups). wgmma's fragment of an m64nN product: register 4 i + q of a thread
// is at M row warp * 16 + lane / 4 + 8 (q / 2) and N column 8 i + 2 (lane % 4) + q % 2; here M
// rows are weight rows (c's columns j) and N columns activation rows (c's rows r).
template <int N>
__global__ void __launch_bounds__(kThreads)
    Fp8WgmmaSwapKernel(const __grid_constant__ CUtensorMap map_a, const SwapArgs args) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const int32_t g = blockIdx.y;
  const int32_t m0 = blockIdx.x * kTileM;
  const int k_blocks = args.k_blocks;

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // TMA's 128-byte swizzle and the descriptors' atoms need 1024-byte aligned tiles (N * 128
  // bytes is a multiple of 1024 for N a multiple of 8).
  const uint32_t base = (SmemAddr(smem_raw) + 1023) & ~1023u;
  const uint32_t a_base = base + kStages * kWeightTileBytes;
  const uint32_t full_bar = a_base + kStages * N * kBlockK;
  const uint32_t empty_bar = full_bar + kStages * 8;
  auto w_tile = [&](uint32_t s) { return base + s * kWeightTileBytes; };
  auto a_tile = [&](uint32_t s) { return a_base + s * (N * kBlockK); };

  const CUtensorMap* mw = args.w_maps + g;
  if (threadIdx.x == 0) swap_persistent::InitRing<kStages>(full_bar, empty_bar);
  if (threadIdx.x == 128) {
    AcquireTensorMap(mw);
    PrefetchTensorMap(mw);
    PrefetchTensorMap(&map_a);
  }
  const float* sw = nullptr;
  if (threadIdx.x < 128) {
    sw = args.scales[g] + Fp8ScaleRow(m0, args.split_rows) * int64_t{args.scale_ld};
  }
  __syncthreads();
  WaitForPrecedingGrids();
  AllowDependentGridsToLaunch();

  const int32_t r0 = __ldg(args.offsets + g);
  const int32_t r1 = __ldg(args.offsets + g + 1);
  if (r1 <= r0) return;  // an idle expert
  const int32_t count = r1 - r0;
  const int32_t chunks = (count + N - 1) / N;

  if (threadIdx.x >= 128) {
    // Producer: one thread issues every TMA load; the weight tile is read again for each chunk
    // of rows (from L2 after the first).
    if (threadIdx.x == 128) {
      uint32_t it = 0;
      for (int32_t ch = 0; ch < chunks; ++ch) {
        for (int kb = 0; kb < k_blocks; ++kb, ++it) {
          const uint32_t s = it % kStages, phase = (it / kStages) & 1;
          MbarWait(empty_bar + 8 * s, phase ^ 1);
          MbarArriveExpectTx(full_bar + 8 * s, kWeightTileBytes + N * kBlockK);
          TmaLoad2d(w_tile(s), mw, kb * kBlockK, m0, full_bar + 8 * s);
          TmaLoad2d(a_tile(s), &map_a, kb * kBlockK, r0 + ch * N, full_bar + 8 * s);
        }
      }
    }
    return;
  }

  constexpr int kRegs = N / 2;
  const int lane = threadIdx.x % 32;
  const float* sa_group = args.a_scales + int64_t{r0} * k_blocks;
  uint32_t it = 0;
  for (int32_t ch = 0; ch < chunks; ++ch) {
    // This thread's activation rows (as offsets in the group): 8 i + 2 (lane % 4) + {0, 1}.
    const int32_t c0 = ch * N + 2 * (lane % 4);
    float acc[2][kRegs];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < kRegs; ++i) acc[h][i] = 0.0f;
    }
    for (int kb = 0; kb < k_blocks; ++kb, ++it) {
      const uint32_t s = it % kStages, phase = (it / kStages) & 1;
      // The scales' loads are in flight while the tensor cores run; rows past the group take 0
      // (their results are not stored).
      const float s_w = __ldg(sw + kb);
      float sa[N / 8][2];
#pragma unroll
      for (int i = 0; i < N / 8; ++i) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int32_t r = c0 + 8 * i + q;
          sa[i][q] = r < count ? __ldg(sa_group + int64_t{kb} * count + r) * s_w : 0.0f;
        }
      }
      SwapKBlock<N>(w_tile(s), a_tile(s), full_bar + 8 * s, empty_bar + 8 * s, phase, sa, acc);
    }
    SwapStore<N>(acc, args, r0, c0, count, m0);
  }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// The persistent grouped form: a grid of about SM count x resident CTAs walks the units
// (expert g, weight tile, chunk of N rows) of the non-empty experts, numbered expert by expert,
// tile-major and chunk-minor within an expert; CTA b takes units b, b + gridDim.x, ... . One
// unit computes exactly what one chunk iteration of Fp8WgmmaSwapKernel computes (the same
// operations in the same order), so the bits are the same. The TMA ring and its mbarrier
// phases run on across units: the producer loads the next unit's tiles while the consumer
// finishes and stores the current one.
constexpr int32_t kMaxPersistentGroups = 1024;

struct PersistentArgs {
  SwapArgs swap;
  int32_t num_groups = 0;
  int32_t tiles = 0;  // weight tiles of 128 rows
};

// After the ring's barriers: the units' exclusive prefix per group (num_groups + 1), then the
// warps' sums of the scan that makes it.
constexpr size_t PersistentSmemBytes(int n_rows, int32_t num_groups) {
  return SmemBytes(n_rows) + (size_t(num_groups) + 1 + kThreads / 32) * sizeof(int32_t);
}

// Two CTAs an SM at least (N 64 would take more than half the registers otherwise).
template <int N>
__global__ void __launch_bounds__(kThreads, 2)
    Fp8WgmmaSwapPersistentKernel(const __grid_constant__ CUtensorMap map_a,
                                 const PersistentArgs pargs) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const SwapArgs& args = pargs.swap;
  const int32_t num_groups = pargs.num_groups;
  const int k_blocks = args.k_blocks;

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* const smem = smem_raw + ((1024u - (SmemAddr(smem_raw) & 1023u)) & 1023u);
  const uint32_t base = SmemAddr(smem);
  const uint32_t a_base = base + kStages * kWeightTileBytes;
  const uint32_t full_bar = a_base + kStages * N * kBlockK;
  const uint32_t empty_bar = full_bar + kStages * 8;
  int32_t* const prefix = reinterpret_cast<int32_t*>(smem + (empty_bar + kStages * 8 - base));
  int32_t* const warp_sums = prefix + num_groups + 1;
  auto w_tile = [&](uint32_t s) { return base + s * kWeightTileBytes; };
  auto a_tile = [&](uint32_t s) { return a_base + s * (N * kBlockK); };

  // Before the wait: the ring and the activations' descriptor. A CTA's first unit (so its expert's
  // descriptor and weight tiles) follows from the offsets: nothing of the weights is loaded
  // early, since a static first wave would fetch idle experts' tiles.
  if (threadIdx.x == 0) swap_persistent::InitRing<kStages>(full_bar, empty_bar);
  if (threadIdx.x == 128) PrefetchTensorMap(&map_a);
  __syncthreads();
  WaitForPrecedingGrids();
  AllowDependentGridsToLaunch();
  swap_persistent::UnitPrefix<N, kThreads>(args.offsets, num_groups, pargs.tiles, prefix,
                                           warp_sums);
  __syncthreads();
  const int32_t total = prefix[num_groups];

  if (threadIdx.x >= 128) {
    // Producer: one thread issues every TMA load, unit after unit without draining the ring.
    if (threadIdx.x == 128) {
      uint32_t it = 0;
      int32_t fenced = -1;
      for (int32_t u = blockIdx.x; u < total; u += gridDim.x) {
        const swap_persistent::Unit w =
            swap_persistent::FindUnit<N, kTileM>(prefix, num_groups, args.offsets, u);
        const CUtensorMap* mw = args.w_maps + w.g;
        if (w.g != fenced) {
          AcquireTensorMap(mw);
          fenced = w.g;
        }
        for (int kb = 0; kb < k_blocks; ++kb, ++it) {
          const uint32_t s = it % kStages, phase = (it / kStages) & 1;
          MbarWait(empty_bar + 8 * s, phase ^ 1);
          MbarArriveExpectTx(full_bar + 8 * s, kWeightTileBytes + N * kBlockK);
          TmaLoad2d(w_tile(s), mw, kb * kBlockK, w.m0, full_bar + 8 * s);
          TmaLoad2d(a_tile(s), &map_a, kb * kBlockK, w.r0 + w.ch * N, full_bar + 8 * s);
        }
      }
    }
    return;
  }

  constexpr int kRegs = N / 2;
  const int lane = threadIdx.x % 32;
  // The scales of one (unit, k block) step: the weight block's scale and the activation rows'
  // scales as read, multiplied before the step (the same products as Fp8WgmmaSwapKernel's). Up to
  // N 32 loaded a step ahead (the next unit's first block during the current unit's last); N 64
  // has no registers to spare and loads them at the top of the step.
  constexpr bool kAhead = N <= 32;
  auto load_scales = [&](const swap_persistent::Unit& w, const float* sw, int kb, float* s_w,
                         float(&sa)[N / 8][2]) {
    *s_w = __ldg(sw + kb);
    const float* sa_block = args.a_scales + int64_t{w.r0} * k_blocks + int64_t{kb} * w.count;
#pragma unroll
    for (int i = 0; i < N / 8; ++i) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        // This thread's activation rows (as offsets in the group): 8 i + 2 (lane % 4) + {0, 1}.
        const int32_t r = w.ch * N + 2 * (lane % 4) + 8 * i + q;
        sa[i][q] = r < w.count ? __ldg(sa_block + r) : 0.0f;
      }
    }
  };
  auto weight_scales = [&](const swap_persistent::Unit& w) {
    return args.scales[w.g] + Fp8ScaleRow(w.m0, args.split_rows) * int64_t{args.scale_ld};
  };
  swap_persistent::Unit w{};
  const float* sw = nullptr;
  float next_sw = 0.0f, next_sa[N / 8][2];
  if (int32_t(blockIdx.x) < total) {
    w = swap_persistent::FindUnit<N, kTileM>(prefix, num_groups, args.offsets, blockIdx.x);
    sw = weight_scales(w);
    if (kAhead) load_scales(w, sw, 0, &next_sw, next_sa);
  }
  uint32_t it = 0;
  for (int32_t u = blockIdx.x; u < total; u += gridDim.x) {
    const int32_t count = w.count, m0 = w.m0;
    const int32_t c0 = w.ch * N + 2 * (lane % 4);
    // The next unit, resolved while this one runs.
    const int32_t u_next = u + gridDim.x;
    swap_persistent::Unit w_next = w;
    const float* sw_next = sw;
    if (u_next < total) {
      w_next = swap_persistent::FindUnit<N, kTileM>(prefix, num_groups, args.offsets, u_next);
      sw_next = weight_scales(w_next);
    }
    float acc[2][kRegs];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < kRegs; ++i) acc[h][i] = 0.0f;
    }
    for (int kb = 0; kb < k_blocks; ++kb, ++it) {
      const uint32_t s = it % kStages, phase = (it / kStages) & 1;
      float s_w, sa[N / 8][2];
      if (kAhead) {
        s_w = next_sw;
#pragma unroll
        for (int i = 0; i < N / 8; ++i) {
#pragma unroll
          for (int q = 0; q < 2; ++q) sa[i][q] = next_sa[i][q];
        }
        if (kb + 1 < k_blocks) {
          load_scales(w, sw, kb + 1, &next_sw, next_sa);
        } else if (u_next < total) {
          load_scales(w_next, sw_next, 0, &next_sw, next_sa);
        }
      } else {
        load_scales(w, sw, kb, &s_w, sa);
      }
#pragma unroll
      for (int i = 0; i < N / 8; ++i) {
#pragma unroll
        for (int q = 0; q < 2; ++q) sa[i][q] *= s_w;
      }
      SwapKBlock<N>(w_tile(s), a_tile(s), full_bar + 8 * s, empty_bar + 8 * s, phase, sa, acc);
    }
    SwapStore<N>(acc, args, w.r0, c0, count, m0);
    w = w_next;
    sw = sw_next;
  }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

constexpr int64_t kInt32Max = 2147483647;
constexpr int32_t kMaxGroups = 65535;  // gridDim.y

template <int N>
cudaError_t Launch(const Fp8WgmmaSwapGroupedGemmParams& p, cudaStream_t stream) {
  CUtensorMap map_a;
  cudaError_t e = wgmma::MakeMap(&map_a, p.a, p.max_rows, p.k, p.lda, N, kBlockK);
  if (e != cudaSuccess) return e;
  auto kernel = Fp8WgmmaSwapKernel<N>;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(SmemBytes(N)));
  if (e != cudaSuccess) return e;
  SwapArgs args;
  args.n = static_cast<int32_t>(p.n);
  args.k_blocks = static_cast<int32_t>(p.k / kBlockK);
  args.split_rows = static_cast<int32_t>(p.split_rows);
  args.scale_ld = static_cast<int32_t>(p.scale_ld);
  args.offsets = p.offsets;
  args.a_scales = p.a_scales;
  args.w_maps = static_cast<const CUtensorMap*>(p.weight_maps);
  args.scales = p.scales;
  args.c = p.c;
  args.c_bf16 = p.c_bf16;
  args.ldc = p.ldc;
  const dim3 grid(static_cast<unsigned>((p.n + kTileM - 1) / kTileM),
                  static_cast<unsigned>(p.num_groups));
  return LaunchKernelThatWaits(kernel, grid, kThreads, SmemBytes(N), stream, p.pdl, map_a, args);
}

// The persistent grouped form (Fp8WgmmaSwapPersistentKernel): false where it does not take the
// call (more than kMaxPersistentGroups groups, or a unit count that could pass int32).
template <int N>
bool PersistentTakes(const Fp8WgmmaSwapGroupedGemmParams& p) {
  if (!p.persistent || p.num_groups > kMaxPersistentGroups) return false;
  const int64_t tiles = (p.n + kTileM - 1) / kTileM;
  return swap_persistent::UnitsBound<N>(tiles, p.num_groups, p.max_rows) <= kInt32Max;
}

template <int N>
cudaError_t LaunchPersistent(const Fp8WgmmaSwapGroupedGemmParams& p, cudaStream_t stream) {
  CUtensorMap map_a;
  cudaError_t e = wgmma::MakeMap(&map_a, p.a, p.max_rows, p.k, p.lda, N, kBlockK);
  if (e != cudaSuccess) return e;
  auto kernel = Fp8WgmmaSwapPersistentKernel<N>;
  const size_t smem = PersistentSmemBytes(N, p.num_groups);
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  static swap_persistent::ResidentCtaCache resident_ctas;
  int64_t resident = 0;
  e = resident_ctas.Get(kernel, kThreads, smem, &resident);
  if (e != cudaSuccess) return e;
  PersistentArgs args;
  args.swap.n = static_cast<int32_t>(p.n);
  args.swap.k_blocks = static_cast<int32_t>(p.k / kBlockK);
  args.swap.split_rows = static_cast<int32_t>(p.split_rows);
  args.swap.scale_ld = static_cast<int32_t>(p.scale_ld);
  args.swap.offsets = p.offsets;
  args.swap.a_scales = p.a_scales;
  args.swap.w_maps = static_cast<const CUtensorMap*>(p.weight_maps);
  args.swap.scales = p.scales;
  args.swap.c = p.c;
  args.swap.c_bf16 = p.c_bf16;
  args.swap.ldc = p.ldc;
  args.num_groups = p.num_groups;
  args.tiles = static_cast<int32_t>((p.n + kTileM - 1) / kTileM);
  // At most as many CTAs as units.
  const int64_t units_bound = swap_persistent::UnitsBound<N>(args.tiles, p.num_groups, p.max_rows);
  const int64_t ctas = std::min(resident, units_bound);
  return LaunchKernelThatWaits(kernel, dim3(static_cast<unsigned>(ctas)), kThreads, smem, stream,
                               p.pdl, map_a, args);
}

template <int N>
cudaError_t LaunchGrouped(const Fp8WgmmaSwapGroupedGemmParams& p, cudaStream_t stream) {
  return PersistentTakes<N>(p) ? LaunchPersistent<N>(p, stream) : Launch<N>(p, stream);
}

}  // namespace

bool Fp8WgmmaSwapDeviceSupports() {
  return swap_persistent::DeviceRunsSm90a(Fp8WgmmaSwapKernel<8>);
}

size_t Fp8WgmmaSwapWeightMapsBytes(int32_t num_groups) {
  return num_groups < 1 ? 0 : size_t(num_groups) * sizeof(CUtensorMap);
}

cudaError_t Fp8WgmmaSwapBuildWeightMaps(int32_t num_groups, const uint8_t* const* host_weights,
                                        int64_t n, int64_t k, int64_t ldw, void* device_maps,
                                        cudaStream_t stream) {
  if (num_groups < 1 || num_groups > kMaxGroups || host_weights == nullptr || n < 1 || k < 1 ||
      n > kInt32Max || k > kInt32Max || k % kBlockK != 0 || ldw < k || ldw % 16 != 0 ||
      device_maps == nullptr || !Aligned(device_maps, 64)) {
    return cudaErrorInvalidValue;
  }
  std::vector<CUtensorMap> maps(num_groups);
  for (int32_t g = 0; g < num_groups; ++g) {
    if (host_weights[g] == nullptr || !Aligned(host_weights[g], 16)) return cudaErrorInvalidValue;
    const cudaError_t e = wgmma::MakeMap(&maps[g], host_weights[g], n, k, ldw, kTileM, kBlockK);
    if (e != cudaSuccess) return e;
  }
  return swap_persistent::UploadWeightMaps(maps, device_maps, stream);
}

int32_t Fp8WgmmaSwapChunkRows(int32_t rows_per_group_hint) {
  if (rows_per_group_hint <= 0) return 32;
  if (rows_per_group_hint <= 8) return 8;
  if (rows_per_group_hint <= 16) return 16;
  if (rows_per_group_hint <= 24) return 24;
  if (rows_per_group_hint <= 32) return 32;
  return 64;
}

bool Fp8WgmmaSwapGroupedGemmSupports(const Fp8WgmmaSwapGroupedGemmParams& p) {
  if (p.num_groups < 1 || p.num_groups > kMaxGroups || p.max_rows < 1 || p.offsets == nullptr ||
      p.n < 1 || p.k < 1 || p.n > kInt32Max || p.k > kInt32Max || p.k % kBlockK != 0 ||
      p.a == nullptr || !Aligned(p.a, 16) || p.lda < p.k || p.lda % 16 != 0 ||
      p.a_scales == nullptr || p.weight_maps == nullptr || !Aligned(p.weight_maps, 64) ||
      p.scales == nullptr || p.scale_ld < Fp8ScaleCols(p.k) || p.scale_ld > kInt32Max ||
      p.split_rows < 0 || p.split_rows % kTileM != 0 || p.split_rows > kInt32Max ||
      (p.c == nullptr) == (p.c_bf16 == nullptr) || p.ldc < p.n) {
    return false;
  }
  return Fp8WgmmaSwapDeviceSupports();
}

cudaError_t Fp8WgmmaSwapGroupedGemm(const Fp8WgmmaSwapGroupedGemmParams& p, cudaStream_t stream) {
  if (!Fp8WgmmaSwapGroupedGemmSupports(p)) return cudaErrorInvalidValue;
  switch (Fp8WgmmaSwapChunkRows(p.rows_per_group_hint)) {
    case 8:
      return LaunchGrouped<8>(p, stream);
    case 16:
      return LaunchGrouped<16>(p, stream);
    case 24:
      return LaunchGrouped<24>(p, stream);
    case 32:
      return LaunchGrouped<32>(p, stream);
    default:
      return LaunchGrouped<64>(p, stream);
  }
}

}  // namespace kernels
}  // namespace deepinfer
