// MXFP4 x e4m3 swap-AB grouped GEMM for decode on Hopper (wgmma, A from registers, TMA): see
// mxfp4_wgmma_decode.h.
//
// wgmma's register A fragment of an m64nNk32 8-bit product (CUTLASS's ALayout_64x32): thread
// (warp, lane) holds in register v1 + 2 v2, byte v0, the element of M row 16 warp + lane / 4 +
// 8 v1 and k 4 (lane % 4) + v0 + 16 v2. So for each of its two rows and each 32-wide k step a
// thread needs two runs of four consecutive values: bytes 2t, 2t + 1 and 8 + 2t, 9 + 2t of the
// step's 16 packed bytes (t = lane % 4, low nibble the even value). The weight tile is 64-byte
// swizzled by TMA (16-byte chunk c of row r at chunk c ^ ((r / 2) % 4)), so the eight rows of a
// warp's 16-bit loads fall in distinct banks.
#include <cuda.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/launch.cuh"
#include "kernels/gemm/mxfp4_wgmma_decode.h"
#include "kernels/gemm/swap_persistent.cuh"
#include "kernels/gemm/wgmma_tma.cuh"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kTileM = 128;            // weight rows a unit
constexpr int kBlockK = 128;           // k values a block (bytes of an activation row)
constexpr int kPackedK = kBlockK / 2;  // packed weight bytes a row a block
constexpr int kStages = 6;
constexpr int kThreads = 160;  // warpgroup 0: consumer; warp 4: producer
constexpr int kWeightTileBytes = kTileM * kPackedK;
constexpr int kTableEntries = 15;  // d = -8 .. 6
constexpr int32_t kMaxGroups = 1024;
constexpr int64_t kInt32Max = 2147483647;

// Ring tiles, barriers, the magnitude tables (8 bytes an entry), the units' prefix per group
// (num_groups + 1) and the scan's warp sums.
constexpr size_t SmemBytes(int n_rows, int32_t num_groups) {
  return 1024 /* alignment slack */ + size_t{kStages} * (kWeightTileBytes + n_rows * kBlockK) +
         2 * kStages * sizeof(uint64_t) + kTableEntries * 8 +
         (size_t(num_groups) + 1 + kThreads / 32) * sizeof(int32_t);
}

struct Args {
  int32_t n = 0, k_blocks = 0, scale_ld = 0, num_groups = 0, tiles = 0;
  const int32_t* offsets = nullptr;
  const float* a_scales = nullptr;
  const CUtensorMap* w_maps = nullptr;
  const uint8_t* const* scales = nullptr;
  float* c = nullptr;
  int64_t ldc = 0;
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

using namespace wgmma;  // NOLINT: the shared device helpers

// d (64 x N fp32 fragment) = (accumulate ? d : 0) + A(64 x 32, registers) B^T (shared memory).
template <int N>
__device__ __forceinline__ void WgmmaRs(float* d, const uint32_t (&a)[4], uint64_t desc_b,
                                        int accumulate);

template <>
__device__ __forceinline__ void WgmmaRs<8>(float* d, const uint32_t (&a)[4], uint64_t desc_b,
                                           int accumulate) {
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.b32 p, %9, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n\t}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void WgmmaRs<16>(float* d, const uint32_t (&a)[4], uint64_t desc_b,
                                            int accumulate) {
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.b32 p, %13, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1;\n\t}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void WgmmaRs<32>(float* d, const uint32_t (&a)[4], uint64_t desc_b,
                                            int accumulate) {
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.b32 p, %21, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1;\n\t}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

__device__ __forceinline__ void FenceU32(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

__device__ __forceinline__ uint32_t LoadShared16(uint32_t addr) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr));
  return v;
}

__device__ __forceinline__ uint2 LoadShared64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}

// Four e2m1 nibbles (x's low 16 bits, nibble i the value of byte i) as e4m3 bytes: the magnitude
// from the table (bytes 0..7 of {t.x, t.y} for codes 0..7), the sign bit to bit 7. The sign of
// nibble 2i is bit 7 of byte i of x << 4, of nibble 2i + 1 bit 7 of byte i of x.
__device__ __forceinline__ uint32_t WidenE2m1(uint32_t x, uint2 t) {
  const uint32_t mag = __byte_perm(t.x, t.y, x & 0x7777u);
  const uint32_t sign = __byte_perm(x, x << 4, 0x1504u);
  return mag | (sign & 0x80808080u);
}

// 2^(e - 133) in fp32 (e a UE8M0 byte below 255; subnormal below e = 7).
__device__ __forceinline__ float BlockPow2(uint32_t e) {
  return __uint_as_float(e >= 7 ? (e - 6) << 23 : 1u << (e + 16));
}

// One thread's A fragments of one m64 half (h) of a k block: the four 32-wide steps' registers,
// widened from the stage's packed tile with each (row, 32-block) scale folded into the table.
// row0: the thread's first tile row in the half (the second 8 below); entry: the table entry per
// (row, step).
__device__ __forceinline__ void WidenHalf(uint32_t w_stage, uint32_t table, int row0,
                                          const uint32_t (&entry)[2][4], uint32_t (&a)[4][4]) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    const uint32_t rbase = w_stage + row * kPackedK + 2 * t;
    const int swz = (row >> 1) & 3;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t at = rbase + ((kk ^ swz) << 4);
      const uint2 tab = LoadShared64(table + 8 * entry[r][kk]);
      a[kk][r] = WidenE2m1(LoadShared16(at), tab);
      a[kk][2 + r] = WidenE2m1(LoadShared16(at + 8), tab);
    }
  }
}

// Per (row, k block): the 2^(E - 133) factor and the table entries d + 8 of its four 32-blocks
// (d = s - E + 6, at least -8: only blocks of zeros fall below, where code 0 reads 0 anyway).
__device__ __forceinline__ void BlockScales(uint32_t s4, float* pow2, uint32_t (&entry)[4]) {
  const uint32_t m = __vmaxu4(s4, s4 >> 16);
  const uint32_t e = max(m & 0xFFu, (m >> 8) & 0xFFu);
  *pow2 = BlockPow2(e);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const int d = int((s4 >> (8 * kk)) & 0xFFu) - int(e) + 6;
    entry[kk] = uint32_t(max(d, -8) + 8);
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Two CTAs an SM. Before griddepcontrol.wait: the ring, the tables and the activations'
// descriptor only; the offsets, activations, scales and c after it.
template <int N>
__global__ void __launch_bounds__(kThreads, 2)
    Mxfp4WgmmaSwapKernel(const __grid_constant__ CUtensorMap map_a, const Args args) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const int32_t num_groups = args.num_groups;
  const int k_blocks = args.k_blocks;

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* const smem = smem_raw + ((1024u - (SmemAddr(smem_raw) & 1023u)) & 1023u);
  const uint32_t base = SmemAddr(smem);
  const uint32_t a_base = base + kStages * kWeightTileBytes;
  const uint32_t full_bar = a_base + kStages * N * kBlockK;
  const uint32_t empty_bar = full_bar + kStages * 8;
  const uint32_t table = empty_bar + kStages * 8;
  uint8_t* const table_bytes = smem + (table - base);
  int32_t* const prefix = reinterpret_cast<int32_t*>(table_bytes + kTableEntries * 8);
  int32_t* const warp_sums = prefix + num_groups + 1;
  auto w_tile = [&](uint32_t s) { return base + s * kWeightTileBytes; };
  auto a_tile = [&](uint32_t s) { return a_base + s * (N * kBlockK); };

  if (threadIdx.x == 0) swap_persistent::InitRing<kStages>(full_bar, empty_bar);
  if (threadIdx.x < kTableEntries * 8) {
    // Entry e, byte c: e2m1 code c's magnitude times 2^(e - 8) in e4m3 (exact: see the header).
    const int e = threadIdx.x / 8, code = threadIdx.x % 8;
    // Code 1 (0.5) is the subnormal; codes 2..7 (1 + m / 2) * 2^(exponent bits - 1).
    const float mag = code < 2 ? 0.5f * code : ldexpf(1.0f + 0.5f * (code & 1), (code >> 1) - 1);
    table_bytes[threadIdx.x] =
        static_cast<uint8_t>(__nv_cvt_float_to_fp8(ldexpf(mag, e - 8), __NV_SATFINITE, __NV_E4M3));
  }
  if (threadIdx.x == 128) swap_persistent::PrefetchTensorMap(&map_a);
  __syncthreads();
  WaitForPrecedingGrids();
  AllowDependentGridsToLaunch();
  swap_persistent::UnitPrefix<N, kThreads>(args.offsets, num_groups, args.tiles, prefix, warp_sums);
  __syncthreads();
  const int32_t total = prefix[num_groups];

  if (threadIdx.x >= 128) {
    // Producer: one thread issues every TMA load; a weight row is kPackedK bytes a block.
    if (threadIdx.x == 128) {
      uint32_t it = 0;
      int32_t fenced = -1;
      for (int32_t u = blockIdx.x; u < total; u += gridDim.x) {
        const swap_persistent::Unit w =
            swap_persistent::FindUnit<N, kTileM>(prefix, num_groups, args.offsets, u);
        const CUtensorMap* mw = args.w_maps + w.g;
        if (w.g != fenced) {
          swap_persistent::AcquireTensorMap(mw);
          fenced = w.g;
        }
        for (int kb = 0; kb < k_blocks; ++kb, ++it) {
          const uint32_t s = it % kStages, phase = (it / kStages) & 1;
          MbarWait(empty_bar + 8 * s, phase ^ 1);
          MbarArriveExpectTx(full_bar + 8 * s, kWeightTileBytes + N * kBlockK);
          TmaLoad2d(w_tile(s), mw, kb * kPackedK, w.m0, full_bar + 8 * s);
          TmaLoad2d(a_tile(s), &map_a, kb * kBlockK, w.r0 + w.ch * N, full_bar + 8 * s);
        }
      }
    }
    return;
  }

  constexpr int kRegs = N / 2;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // This thread's tile rows: 64 h + row0 + 8 r.
  const int row0 = warp * 16 + lane / 4;
  // The scales of one (unit, k block) step, loaded a step ahead (the next unit's first block
  // during the current unit's last): the thread's four weight rows' scale words (rows past n read
  // row n - 1: TMA zero-fills their weights, their results are not stored) and its activation
  // rows' block scales (0 past the group).
  auto load_scales = [&](const swap_persistent::Unit& x, const uint8_t* wsc, int kb,
                         uint32_t(&s4)[2][2], float(&sa)[N / 8][2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int32_t j = min(x.m0 + 64 * h + row0 + 8 * r, args.n - 1);
        s4[h][r] = __ldg(reinterpret_cast<const uint32_t*>(wsc + int64_t{j} * args.scale_ld) + kb);
      }
    }
    const float* sa_block = args.a_scales + int64_t{x.r0} * k_blocks + int64_t{kb} * x.count;
#pragma unroll
    for (int i = 0; i < N / 8; ++i) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int32_t r = x.ch * N + 2 * (lane % 4) + 8 * i + q;
        sa[i][q] = r < x.count ? __ldg(sa_block + r) : 0.0f;
      }
    }
  };
  swap_persistent::Unit w{};
  const uint8_t* wsc = nullptr;
  uint32_t next_s4[2][2] = {};
  float next_sa[N / 8][2] = {};
  if (int32_t(blockIdx.x) < total) {
    w = swap_persistent::FindUnit<N, kTileM>(prefix, num_groups, args.offsets, blockIdx.x);
    wsc = args.scales[w.g];
    load_scales(w, wsc, 0, next_s4, next_sa);
  }
  uint32_t it = 0;
  for (int32_t u = blockIdx.x; u < total; u += gridDim.x) {
    const int32_t c0 = w.ch * N + 2 * (lane % 4);  // this thread's first activation row
    const int32_t u_next = u + gridDim.x;
    swap_persistent::Unit w_next = w;
    const uint8_t* wsc_next = wsc;
    if (u_next < total) {
      w_next = swap_persistent::FindUnit<N, kTileM>(prefix, num_groups, args.offsets, u_next);
      wsc_next = args.scales[w_next.g];
    }
    float acc[2][kRegs];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < kRegs; ++i) acc[h][i] = 0.0f;
    }
    for (int kb = 0; kb < k_blocks; ++kb, ++it) {
      const uint32_t s = it % kStages, phase = (it / kStages) & 1;
      uint32_t s4[2][2];
      float sa[N / 8][2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int r = 0; r < 2; ++r) s4[h][r] = next_s4[h][r];
      }
#pragma unroll
      for (int i = 0; i < N / 8; ++i) {
#pragma unroll
        for (int q = 0; q < 2; ++q) sa[i][q] = next_sa[i][q];
      }
      if (kb + 1 < k_blocks) {
        load_scales(w, wsc, kb + 1, next_s4, next_sa);
      } else if (u_next < total) {
        load_scales(w_next, wsc_next, 0, next_s4, next_sa);
      }
      float pow2[2][2];
      uint32_t entry[2][2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int r = 0; r < 2; ++r) BlockScales(s4[h][r], &pow2[h][r], entry[h][r]);
      }
      float part[2][kRegs];
      uint32_t a[2][4][4];
      MbarWait(full_bar + 8 * s, phase);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        WidenHalf(w_tile(s), table, 64 * h + row0, entry[h], a[h]);
#pragma unroll
        for (int i = 0; i < kRegs; ++i) FenceReg(part[h][i]);
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          WgmmaRs<N>(part[h], a[h][kk], SmemDesc(a_tile(s) + kk * 32), kk > 0);
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
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
          for (int q = 0; q < 4; ++q) FenceU32(a[h][kk][q]);
        }
      }
      MbarArrive(empty_bar + 8 * s);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < kRegs; ++i) {
          acc[h][i] = fmaf(part[h][i], sa[i / 4][i % 2] * pow2[h][(i % 4) / 2], acc[h][i]);
        }
      }
    }
    // c[r0 + row, j]: weight rows j as c's columns.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < kRegs; ++i) {
        const int32_t row = c0 + 8 * (i / 4) + i % 2;
        const int32_t j = w.m0 + h * 64 + row0 + 8 * ((i % 4) / 2);
        if (row < w.count && j < args.n) {
          args.c[int64_t{w.r0 + row} * args.ldc + j] = acc[h][i];
        }
      }
    }
    w = w_next;
    wsc = wsc_next;
  }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// Sets *bad where some (row, k block) of some group breaks the exponent bound: a 32-block with a
// nonzero code and s < E - 14, or a scale byte 0xFF. One thread a (row, k block).
__global__ void CheckKernel(const uint8_t* const* weights, const uint8_t* const* scales, int64_t n,
                            int64_t k, int64_t scale_ld, int32_t* bad) {
  const int64_t k_blocks = k / kBlockK;
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n * k_blocks) return;
  const int64_t j = i / k_blocks, kb = i % k_blocks;
  const uint8_t* w = weights[blockIdx.y] + j * (k / 2) + kb * kPackedK;
  const uint8_t* s = scales[blockIdx.y] + j * scale_ld + kb * 4;
  int e = 0;
  bool fail = false;
  for (int q = 0; q < 4; ++q) {
    e = max(e, int(s[q]));
    fail |= s[q] == 0xFF;
  }
  for (int q = 0; q < 4; ++q) {
    bool nonzero = false;
    for (int b = 0; b < 16; ++b) nonzero |= (w[16 * q + b] & 0x77) != 0;
    fail |= nonzero && int(s[q]) < e - 14;
  }
  if (fail) atomicOr(bad, 1);
}

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// A [rows, cols] byte matrix in boxes of box_rows x 64 bytes with the 64-byte swizzle.
cudaError_t MakeWeightMap(CUtensorMap* map, const void* data, int64_t rows, int64_t cols) {
  const wgmma::EncodeTiledFn encode = wgmma::EncodeTiled();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols)};
  const cuuint32_t box[2] = {kPackedK, kTileM};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(data), dims, strides, box,
             elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_64B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <int N>
cudaError_t Launch(const Mxfp4WgmmaSwapGroupedGemmParams& p, cudaStream_t stream) {
  CUtensorMap map_a;
  cudaError_t e = wgmma::MakeMap(&map_a, p.a, p.max_rows, p.k, p.lda, N, kBlockK);
  if (e != cudaSuccess) return e;
  auto kernel = Mxfp4WgmmaSwapKernel<N>;
  const size_t smem = SmemBytes(N, p.num_groups);
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  static swap_persistent::ResidentCtaCache resident_ctas;
  int64_t resident = 0;
  e = resident_ctas.Get(kernel, kThreads, smem, &resident);
  if (e != cudaSuccess) return e;
  Args args;
  args.n = static_cast<int32_t>(p.n);
  args.k_blocks = static_cast<int32_t>(p.k / kBlockK);
  args.scale_ld = static_cast<int32_t>(p.scale_ld);
  args.num_groups = p.num_groups;
  args.tiles = static_cast<int32_t>((p.n + kTileM - 1) / kTileM);
  args.offsets = p.offsets;
  args.a_scales = p.a_scales;
  args.w_maps = static_cast<const CUtensorMap*>(p.weight_maps);
  args.scales = p.scales;
  args.c = p.c;
  args.ldc = p.ldc;
  const int64_t units_bound = swap_persistent::UnitsBound<N>(args.tiles, p.num_groups, p.max_rows);
  const int64_t ctas = std::max<int64_t>(1, std::min(resident, units_bound));
  return LaunchKernelThatWaits(kernel, dim3(static_cast<unsigned>(ctas)), kThreads, smem, stream,
                               p.pdl, map_a, args);
}

}  // namespace

bool Mxfp4WgmmaSwapDeviceSupports() {
  return swap_persistent::DeviceRunsSm90a(Mxfp4WgmmaSwapKernel<8>);
}

size_t Mxfp4WgmmaSwapWeightMapsBytes(int32_t num_groups) {
  return num_groups < 1 ? 0 : size_t(num_groups) * sizeof(CUtensorMap);
}

cudaError_t Mxfp4WgmmaSwapBuildWeightMaps(int32_t num_groups, const uint8_t* const* host_weights,
                                          int64_t n, int64_t k, void* device_maps,
                                          cudaStream_t stream) {
  if (num_groups < 1 || num_groups > kMaxGroups || host_weights == nullptr || n < 1 || k < 1 ||
      n > kInt32Max || k > kInt32Max || k % kBlockK != 0 || device_maps == nullptr ||
      !Aligned(device_maps, 64)) {
    return cudaErrorInvalidValue;
  }
  std::vector<CUtensorMap> maps(num_groups);
  for (int32_t g = 0; g < num_groups; ++g) {
    if (host_weights[g] == nullptr || !Aligned(host_weights[g], 16)) return cudaErrorInvalidValue;
    const cudaError_t e = MakeWeightMap(&maps[g], host_weights[g], n, k / 2);
    if (e != cudaSuccess) return e;
  }
  return swap_persistent::UploadWeightMaps(maps, device_maps, stream);
}

cudaError_t Mxfp4WgmmaSwapCheck(int32_t num_groups, const uint8_t* const* weights,
                                const uint8_t* const* scales, int64_t n, int64_t k,
                                int64_t scale_ld, bool* fits, cudaStream_t stream) {
  if (num_groups < 1 || num_groups > 65535 || weights == nullptr || scales == nullptr || n < 1 ||
      k < 1 || k % kBlockK != 0 || scale_ld < k / 32 || fits == nullptr) {
    return cudaErrorInvalidValue;
  }
  *fits = false;
  int32_t* bad = nullptr;
  cudaError_t e = cudaMallocAsync(&bad, sizeof(int32_t), stream);
  if (e != cudaSuccess) return e;
  e = cudaMemsetAsync(bad, 0, sizeof(int32_t), stream);
  const int64_t items = n * (k / kBlockK);
  const int threads = 256;
  if (e == cudaSuccess) {
    const dim3 grid(static_cast<unsigned>((items + threads - 1) / threads),
                    static_cast<unsigned>(num_groups));
    CheckKernel<<<grid, threads, 0, stream>>>(weights, scales, n, k, scale_ld, bad);
    e = cudaGetLastError();
  }
  int32_t host_bad = 1;
  if (e == cudaSuccess) {
    e = cudaMemcpyAsync(&host_bad, bad, sizeof(int32_t), cudaMemcpyDeviceToHost, stream);
  }
  const cudaError_t f = cudaFreeAsync(bad, stream);
  const cudaError_t s = cudaStreamSynchronize(stream);
  if (e == cudaSuccess) e = f != cudaSuccess ? f : s;
  if (e == cudaSuccess) *fits = host_bad == 0;
  return e;
}

int32_t Mxfp4WgmmaSwapChunkRows(int32_t rows_per_group_hint) {
  if (rows_per_group_hint <= 0) return 32;
  if (rows_per_group_hint <= 8) return 8;
  if (rows_per_group_hint <= 16) return 16;
  return 32;
}

bool Mxfp4WgmmaSwapGroupedGemmSupports(const Mxfp4WgmmaSwapGroupedGemmParams& p) {
  if (p.num_groups < 1 || p.num_groups > kMaxGroups || p.max_rows < 1 || p.offsets == nullptr ||
      p.n < 1 || p.k < 1 || p.n > kInt32Max || p.k > kInt32Max || p.k % kBlockK != 0 ||
      p.a == nullptr || !Aligned(p.a, 16) || p.lda < p.k || p.lda % 16 != 0 ||
      p.a_scales == nullptr || p.weight_maps == nullptr || !Aligned(p.weight_maps, 64) ||
      p.scales == nullptr || p.scale_ld < p.k / 32 || p.scale_ld % 4 != 0 ||
      p.scale_ld > kInt32Max || p.c == nullptr || p.ldc < p.n) {
    return false;
  }
  return Mxfp4WgmmaSwapDeviceSupports();
}

cudaError_t Mxfp4WgmmaSwapGroupedGemm(const Mxfp4WgmmaSwapGroupedGemmParams& p,
                                      cudaStream_t stream) {
  if (!Mxfp4WgmmaSwapGroupedGemmSupports(p)) return cudaErrorInvalidValue;
  switch (Mxfp4WgmmaSwapChunkRows(p.rows_per_group_hint)) {
    case 8:
      return Launch<8>(p, stream);
    case 16:
      return Launch<16>(p, stream);
    default:
      return Launch<32>(p, stream);
  }
}

}  // namespace kernels
}  // namespace deepinfer
