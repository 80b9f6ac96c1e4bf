// W8A8 on Hopper's FP8 tensor cores (wgmma + TMA): see fp8_wgmma_gemm.h. Host side: the TMA
// descriptors (cuTensorMapEncodeTiled through the runtime's driver entry point), the tile list of
// the grouped form, the persistent launch.
#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/gemm/fp8_wgmma_gemm.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kBlockM = 128;
constexpr int kBlockN = 128;
constexpr int kBlockK = 128;  // bytes of e4m3: one 128-byte swizzle row
constexpr int kStages = kFp8WgmmaStages;
constexpr int kThreads = 384;                  // warpgroups 0, 1: consumers; 2: producer
constexpr int kTileBytes = kBlockM * kBlockK;  // A and B tiles alike (kBlockN == kBlockM)
constexpr int kStageBytes = 2 * kTileBytes;
constexpr size_t kSmemBytes =
    1024 /* alignment slack */ + size_t{kStages} * kStageBytes + 2 * kStages * sizeof(uint64_t);
static_assert(kBlockN == kBlockM, "A and B tiles share one size");

// One 128-row tile of c: its rows row0 .. min(row0 + 128, row_end) - 1 (absolute rows of a and
// c), the activation scales of its group (row r, block kb at sa[kb * sa_ld + r - sa_base]), the
// weight scales (scale row s, block kb at sw[s * sw_ld + kb]) and the group (its B descriptor).
struct alignas(16) WgmmaTile {
  const float* sa;
  const float* sw;
  int32_t row0, row_end, sa_base, sa_ld;
  int32_t group, sw_ld;
};

struct KernelArgs {
  int32_t n = 0, k_blocks = 0;
  int32_t n_tiles = 0, num_tiles = 0;  // column tiles; all tiles (row tiles x n_tiles)
  int32_t split_rows = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  bool c_bf16 = false, accumulate = false;
  WgmmaTile dense;                      // the dense form's tile, row0 set per tile
  const WgmmaTile* tiles = nullptr;     // grouped: one per row tile
  const CUtensorMap* b_maps = nullptr;  // grouped: one per group (global memory)
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

// A box of the 2D tensor map at (x = inner / k byte, y = row) into shared memory, completing
// its bytes on `bar`.
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int32_t x,
                                          int32_t y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// Shared-memory matrix descriptor of a K-major tile with 128-byte swizzle: rows of 128 bytes,
// 8-row swizzle atoms 1024 bytes apart (stride byte offset), the leading byte offset unused
// (the k extent of one wgmma, 32 bytes, lies within a swizzle row; 1 as CUTLASS sets it). The
// start address may move by 32-byte k steps inside a 1024-byte aligned atom.
__device__ __forceinline__ uint64_t SmemDesc(uint32_t addr) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>(1) << 16;          // leading byte offset (>> 4)
  d |= static_cast<uint64_t>(1024 >> 4) << 32;  // stride byte offset (>> 4)
  d |= static_cast<uint64_t>(1) << 62;          // 128-byte swizzle
  return d;
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void WgmmaWaitAll() {
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
// Keeps the compiler from moving reads or writes of r across the asynchronous wgmma.
__device__ __forceinline__ void FenceReg(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// d (64 x 128 fp32 fragment, 64 registers a thread) = (accumulate ? d : 0) + A(64 x 32) B^T,
// both e4m3 from shared memory descriptors.
__device__ __forceinline__ void WgmmaM64N128K32(float* d, uint64_t desc_a, uint64_t desc_b,
                                                int accumulate) {
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.b32 p, %66, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1;\n\t}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// Row r (< 0: none) of a tile from the fragment's registers 4 i + 2 half + {0, 1}: pairs of
// adjacent columns n0 + 8 i + 2 (lane % 4) + {0, 1}, those below n.
__device__ __forceinline__ void StoreRow(const KernelArgs& args, const float* acc, int half,
                                         int32_t r, int32_t n0, int lane) {
  if (r < 0) return;
  const int32_t n = args.n;
  const int64_t row_off = static_cast<int64_t>(r) * args.ldc;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int32_t col = n0 + 8 * i + 2 * (lane % 4);
    if (col >= n) continue;
    const float v0 = acc[4 * i + 2 * half], v1 = acc[4 * i + 2 * half + 1];
    const bool pair = col + 1 < n;
    if (args.c_bf16) {
      __nv_bfloat16* c = static_cast<__nv_bfloat16*>(args.c) + row_off + col;
      if (pair) {
        *reinterpret_cast<__nv_bfloat162*>(c) = __floats2bfloat162_rn(v0, v1);
      } else {
        *c = __float2bfloat16_rn(v0);
      }
    } else {
      float* c = static_cast<float*>(args.c) + row_off + col;
      if (pair) {
        float2 v = make_float2(v0, v1);
        if (args.accumulate) {
          const float2 old = *reinterpret_cast<const float2*>(c);
          v.x += old.x;
          v.y += old.y;
        }
        *reinterpret_cast<float2*>(c) = v;
      } else {
        *c = args.accumulate ? *c + v0 : v0;
      }
    }
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <bool kGrouped>
__global__ void __launch_bounds__(kThreads, 1)
    Fp8WgmmaKernel(const __grid_constant__ CUtensorMap map_a,
                   const __grid_constant__ CUtensorMap map_b, const KernelArgs args) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // TMA's 128-byte swizzle and the descriptors' atoms need 1024-byte aligned tiles.
  const uint32_t raw = SmemAddr(smem_raw);
  const uint32_t base = (raw + 1023) & ~1023u;
  const uint32_t full_bar = base + kStages * kStageBytes;
  const uint32_t empty_bar = full_bar + kStages * 8;
  auto a_tile = [&](int s) { return base + s * kStageBytes; };
  auto b_tile = [&](int s) { return base + s * kStageBytes + kTileBytes; };

  const int k_blocks = args.k_blocks;
  // Tile t of the persistent loop: row tile t / n_tiles, column tile t % n_tiles (the CTAs at
  // work at one time share a few row tiles of a and sweep w).
  auto tile_of = [&](int32_t t, int32_t* n0) {
    *n0 = (t % args.n_tiles) * kBlockN;
    const int32_t mt = t / args.n_tiles;
    WgmmaTile tile;
    if constexpr (kGrouped) {
      tile = args.tiles[mt];
    } else {
      tile = args.dense;
      tile.row0 = mt * kBlockM;
    }
    return tile;
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full_bar + 8 * s, 1);
      MbarInit(empty_bar + 8 * s, 256);  // every consumer thread
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 2) {
    // Producer: one thread issues every TMA load, running ahead across tiles by up to the ring.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == 256) {
      uint32_t it = 0;  // k blocks loaded so far: stage it % kStages, round it / kStages
      for (int32_t t = blockIdx.x; t < args.num_tiles; t += gridDim.x) {
        int32_t n0;
        const WgmmaTile tile = tile_of(t, &n0);
        const CUtensorMap* mb = &map_b;
        if constexpr (kGrouped) {
          mb = args.b_maps + tile.group;
          asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(
                           reinterpret_cast<uint64_t>(mb))
                       : "memory");
        }
        for (int kb = 0; kb < k_blocks; ++kb, ++it) {
          const uint32_t s = it % kStages, phase = (it / kStages) & 1;
          MbarWait(empty_bar + 8 * s, phase ^ 1);
          // Out-of-bounds rows are zero-filled and still count towards the transaction bytes.
          MbarArriveExpectTx(full_bar + 8 * s, kStageBytes);
          TmaLoad2d(a_tile(s), &map_a, kb * kBlockK, tile.row0, full_bar + 8 * s);
          TmaLoad2d(b_tile(s), mb, kb * kBlockK, n0, full_bar + 8 * s);
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  // Consumer warpgroup `warpgroup`: rows warpgroup * 64 .. + 63 of each tile. wgmma's fragment:
  // register 4 i + {0, 1} at row warp * 16 + lane / 4, columns 8 i + 2 (lane % 4) + {0, 1};
  // 4 i + {2, 3} the same 8 rows further.
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  uint32_t it = 0;
  for (int32_t t = blockIdx.x; t < args.num_tiles; t += gridDim.x) {
    int32_t n0;
    const WgmmaTile tile = tile_of(t, &n0);
    const int32_t r_lo = tile.row0 + warpgroup * 64 + warp * 16 + lane / 4;
    const int32_t r_hi = r_lo + 8;
    const bool lo_ok = r_lo < tile.row_end, hi_ok = r_hi < tile.row_end;
    const float* sa_lo = tile.sa + (r_lo - tile.sa_base);
    const float* sa_hi = tile.sa + (r_hi - tile.sa_base);
    const float* sw = tile.sw + Fp8ScaleRow(n0, args.split_rows) * tile.sw_ld;

    float acc[64], part[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;

    for (int kb = 0; kb < k_blocks; ++kb, ++it) {
      const uint32_t s = it % kStages, phase = (it / kStages) & 1;
      // The scales' loads are in flight while the tensor cores run.
      const float s_w = __ldg(sw + kb);
      const float s_lo = lo_ok ? __ldg(sa_lo + static_cast<int64_t>(kb) * tile.sa_ld) : 0.0f;
      const float s_hi = hi_ok ? __ldg(sa_hi + static_cast<int64_t>(kb) * tile.sa_ld) : 0.0f;
      MbarWait(full_bar + 8 * s, phase);
#pragma unroll
      for (int i = 0; i < 64; ++i) FenceReg(part[i]);
      WgmmaFence();
      const uint32_t a_base = a_tile(s) + warpgroup * 64 * kBlockK;
      const uint32_t b_base = b_tile(s);
#pragma unroll
      for (int kk = 0; kk < kBlockK / 32; ++kk) {
        WgmmaM64N128K32(part, SmemDesc(a_base + kk * 32), SmemDesc(b_base + kk * 32), kk > 0);
      }
      WgmmaCommit();
#pragma unroll
      for (int i = 0; i < 64; ++i) FenceReg(part[i]);
      WgmmaWaitAll();
#pragma unroll
      for (int i = 0; i < 64; ++i) FenceReg(part[i]);
      MbarArrive(empty_bar + 8 * s);
      const float f_lo = s_lo * s_w, f_hi = s_hi * s_w;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        acc[4 * i + 0] = fmaf(part[4 * i + 0], f_lo, acc[4 * i + 0]);
        acc[4 * i + 1] = fmaf(part[4 * i + 1], f_lo, acc[4 * i + 1]);
        acc[4 * i + 2] = fmaf(part[4 * i + 2], f_hi, acc[4 * i + 2]);
        acc[4 * i + 3] = fmaf(part[4 * i + 3], f_hi, acc[4 * i + 3]);
      }
    }
    // The producer keeps loading the next tile's k blocks meanwhile.
    StoreRow(args, acc, 0, lo_ok ? r_lo : -1, n0, lane);
    StoreRow(args, acc, 1, hi_ok ? r_hi : -1, n0, lane);
  }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda).
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiledFn EncodeTiled() {
  static const EncodeTiledFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      return static_cast<EncodeTiledFn>(nullptr);
    }
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

// A [rows, cols] row-major e4m3 matrix (row stride ld bytes), boxes of 128 x 128 bytes with the
// 128-byte swizzle, out-of-bounds elements read as zero.
cudaError_t MakeMap(CUtensorMap* map, const void* data, int64_t rows, int64_t cols, int64_t ld) {
  const EncodeTiledFn encode = EncodeTiled();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld)};
  const cuuint32_t box[2] = {kBlockK, kBlockM};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(data), dims, strides, box,
             elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <bool kGrouped>
cudaError_t Launch(const CUtensorMap& map_a, const CUtensorMap& map_b, KernelArgs args,
                   int64_t m_tiles, cudaStream_t stream) {
  auto kernel = Fp8WgmmaKernel<kGrouped>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kSmemBytes));
  if (e != cudaSuccess) return e;
  int dev = 0, sms = 0;
  e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) return e;
  args.n_tiles = (args.n + kBlockN - 1) / kBlockN;
  args.num_tiles = static_cast<int32_t>(args.n_tiles * m_tiles);
  // Persistent: one CTA per SM (its shared memory takes the SM), each looping over tiles.
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(args.num_tiles, sms));
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(map_a, map_b, args);
  return cudaGetLastError();
}

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

constexpr int64_t kInt32Max = 2147483647;

// The checks the dense and grouped forms share for one weight.
bool WeightOk(const Fp8BlockWeight& w, int64_t n, int64_t k) {
  return w.data != nullptr && w.scales != nullptr && Aligned(w.data, 16) && w.ldw >= k &&
         w.ldw % 16 == 0 && w.scale_ld >= Fp8ScaleCols(k) && w.scale_ld <= kInt32Max &&
         w.split_rows >= 0 && w.split_rows % kBlockN == 0 && n * w.ldw > 0;
}

bool OutputOk(const void* c, int64_t ldc, int64_t n, bool c_bf16, bool accumulate) {
  return c != nullptr && ldc >= n && ldc % 2 == 0 && Aligned(c, c_bf16 ? 4 : 8) &&
         !(c_bf16 && accumulate);
}

constexpr int64_t kMaxGroups = 1 << 16;
// Tiles of one launch (row tiles x column tiles) in int32.
bool TileCountOk(int64_t m_tiles, int64_t n) {
  return m_tiles * ((n + kBlockN - 1) / kBlockN) <= kInt32Max;
}

}  // namespace

bool Fp8WgmmaDeviceSupports() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    return false;
  }
  if (major != 9 || minor != 0) return false;
  cudaFuncAttributes attr;
  if (cudaFuncGetAttributes(&attr, Fp8WgmmaKernel<false>) != cudaSuccess ||
      cudaFuncGetAttributes(&attr, Fp8WgmmaKernel<true>) != cudaSuccess) {
    return false;
  }
  return EncodeTiled() != nullptr;
}

bool Fp8WgmmaGemmSupports(const Fp8WgmmaGemmParams& p) {
  if (p.m < 1 || p.n < 1 || p.k < 1 || p.m > kInt32Max || p.n > kInt32Max || p.k > kInt32Max ||
      p.k % kBlockK != 0 || p.a == nullptr || !Aligned(p.a, 16) || p.lda < p.k || p.lda % 16 != 0 ||
      p.a_scales == nullptr || p.a_scale_ld < p.m || p.a_scale_ld > kInt32Max ||
      !WeightOk(p.w, p.n, p.k) || !OutputOk(p.c, p.ldc, p.n, p.c_bf16, p.accumulate)) {
    return false;
  }
  return Fp8WgmmaDeviceSupports();
}

cudaError_t Fp8WgmmaGemm(const Fp8WgmmaGemmParams& p, cudaStream_t stream) {
  if (!Fp8WgmmaGemmSupports(p)) return cudaErrorInvalidValue;
  CUtensorMap map_a, map_b;
  cudaError_t e = MakeMap(&map_a, p.a, p.m, p.k, p.lda);
  if (e != cudaSuccess) return e;
  e = MakeMap(&map_b, p.w.data, p.n, p.k, p.w.ldw);
  if (e != cudaSuccess) return e;
  KernelArgs args;
  args.n = static_cast<int32_t>(p.n);
  args.k_blocks = static_cast<int32_t>(p.k / kBlockK);
  args.split_rows = static_cast<int32_t>(p.w.split_rows);
  args.c = p.c, args.ldc = p.ldc, args.c_bf16 = p.c_bf16, args.accumulate = p.accumulate;
  args.dense.sa = p.a_scales;
  args.dense.sw = p.w.scales;
  args.dense.row_end = static_cast<int32_t>(p.m);
  args.dense.sa_base = 0;
  args.dense.sa_ld = static_cast<int32_t>(p.a_scale_ld);
  args.dense.group = 0;
  args.dense.sw_ld = static_cast<int32_t>(p.w.scale_ld);
  return Launch<false>(map_a, map_b, args, (p.m + kBlockM - 1) / kBlockM, stream);
}

namespace {

int64_t GroupedTiles(int32_t num_groups, const int32_t* offsets) {
  int64_t tiles = 0;
  for (int32_t g = 0; g < num_groups; ++g) {
    tiles += (std::max(0, offsets[g + 1] - offsets[g]) + kBlockM - 1) / kBlockM;
  }
  return tiles;
}

size_t MapsBytes(int32_t num_groups) { return size_t(num_groups) * sizeof(CUtensorMap); }

}  // namespace

size_t Fp8WgmmaGroupedWorkspaceBytes(int32_t num_groups, const int32_t* host_offsets) {
  if (num_groups < 1 || host_offsets == nullptr) return 0;
  return MapsBytes(num_groups) + size_t(GroupedTiles(num_groups, host_offsets)) * sizeof(WgmmaTile);
}

bool Fp8WgmmaGroupedGemmSupports(const Fp8WgmmaGroupedGemmParams& p) {
  if (p.num_groups < 1 || p.num_groups > kMaxGroups || p.host_offsets == nullptr ||
      p.weights == nullptr || p.n < 1 || p.k < 1 || p.n > kInt32Max || p.k > kInt32Max ||
      p.k % kBlockK != 0 || p.a == nullptr || !Aligned(p.a, 16) || p.lda < p.k || p.lda % 16 != 0 ||
      p.a_scales == nullptr || p.workspace == nullptr || !Aligned(p.workspace, 64) ||
      !OutputOk(p.c, p.ldc, p.n, p.c_bf16, false) || p.host_offsets[0] != 0) {
    return false;
  }
  for (int32_t g = 0; g < p.num_groups; ++g) {
    if (p.host_offsets[g + 1] < p.host_offsets[g] || p.host_offsets[g + 1] > kInt32Max ||
        !WeightOk(p.weights[g], p.n, p.k) || p.weights[g].split_rows != p.weights[0].split_rows) {
      return false;
    }
  }
  if (!TileCountOk(GroupedTiles(p.num_groups, p.host_offsets), p.n)) return false;
  return Fp8WgmmaDeviceSupports();
}

cudaError_t Fp8WgmmaGroupedGemm(const Fp8WgmmaGroupedGemmParams& p, cudaStream_t stream) {
  if (!Fp8WgmmaGroupedGemmSupports(p)) return cudaErrorInvalidValue;
  const int32_t G = p.num_groups;
  const int32_t rows = p.host_offsets[G];
  const int64_t tiles = GroupedTiles(G, p.host_offsets);
  if (tiles == 0) return cudaSuccess;
  const int64_t blocks = Fp8ScaleCols(p.k);
  // The workspace's contents: the groups' B maps (64-byte aligned objects, built in a vector of
  // their own), then the tiles.
  std::vector<CUtensorMap> maps(G);
  std::vector<WgmmaTile> list(tiles);
  int64_t t = 0;
  for (int32_t g = 0; g < G; ++g) {
    const Fp8BlockWeight& w = p.weights[g];
    cudaError_t e = MakeMap(&maps[g], w.data, p.n, p.k, w.ldw);
    if (e != cudaSuccess) return e;
    const int32_t r0 = p.host_offsets[g], r1 = p.host_offsets[g + 1];
    for (int32_t r = r0; r < r1; r += kBlockM) {
      WgmmaTile& tl = list[t++];
      tl.sa = p.a_scales + int64_t{r0} * blocks;
      tl.sw = w.scales;
      tl.row0 = r;
      tl.row_end = r1;
      tl.sa_base = r0;
      tl.sa_ld = r1 - r0;
      tl.group = g;
      tl.sw_ld = static_cast<int32_t>(w.scale_ld);
    }
  }
  std::vector<uint8_t> host(Fp8WgmmaGroupedWorkspaceBytes(G, p.host_offsets));
  std::memcpy(host.data(), maps.data(), MapsBytes(G));
  std::memcpy(host.data() + MapsBytes(G), list.data(), list.size() * sizeof(WgmmaTile));
  CUtensorMap map_a;
  cudaError_t e = MakeMap(&map_a, p.a, rows, p.k, p.lda);
  if (e != cudaSuccess) return e;
  e = cudaMemcpyAsync(p.workspace, host.data(), host.size(), cudaMemcpyHostToDevice, stream);
  if (e != cudaSuccess) return e;
  KernelArgs args;
  args.n = static_cast<int32_t>(p.n);
  args.k_blocks = static_cast<int32_t>(p.k / kBlockK);
  args.split_rows = static_cast<int32_t>(p.weights[0].split_rows);
  args.c = p.c, args.ldc = p.ldc, args.c_bf16 = p.c_bf16, args.accumulate = false;
  args.b_maps = static_cast<const CUtensorMap*>(p.workspace);
  args.tiles =
      reinterpret_cast<const WgmmaTile*>(static_cast<const uint8_t*>(p.workspace) + MapsBytes(G));
  // map_b is unused by the grouped kernel (each tile's group map is read from the workspace).
  return Launch<true>(map_a, maps[0], args, tiles, stream);
}

}  // namespace kernels
}  // namespace deepinfer
