// Swap-AB W8A8 grouped GEMM for decode on Hopper (wgmma + TMA): see fp8_wgmma_decode.h.
#include <cuda.h>

#include <vector>

#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/gemm/fp8_wgmma_decode.h"
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
  int32_t max_rows = 0;
  const int32_t* offsets = nullptr;
  const float* a_scales = nullptr;
  const CUtensorMap* w_maps = nullptr;
  const float* const* scales = nullptr;
  float* c = nullptr;
  int64_t ldc = 0;
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

using namespace wgmma;  // NOLINT: the shared device helpers

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

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Grid (weight tiles, groups). wgmma's fragment of an m64nN product: register 4 i + q of a thread
// is at M row warp * 16 + lane / 4 + 8 (q / 2) and N column 8 i + 2 (lane % 4) + q % 2; here M
// rows are weight rows (c's columns j) and N columns activation rows (c's rows r).
template <int N>
__global__ void __launch_bounds__(kThreads)
    Fp8WgmmaSwapKernel(const __grid_constant__ CUtensorMap map_a, const SwapArgs args) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const int32_t g = blockIdx.y;
  const int32_t r0 = args.offsets != nullptr ? __ldg(args.offsets + g) : 0;
  const int32_t r1 = args.offsets != nullptr ? __ldg(args.offsets + g + 1) : args.max_rows;
  if (r1 <= r0) return;  // an idle expert
  const int32_t count = r1 - r0;
  const int32_t chunks = (count + N - 1) / N;
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

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full_bar + 8 * s, 1);
      MbarInit(empty_bar + 8 * s, 128);  // every consumer thread
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();

  if (threadIdx.x >= 128) {
    // Producer: one thread issues every TMA load; the weight tile is read again for each chunk
    // of rows (from L2 after the first).
    if (threadIdx.x == 128) {
      const CUtensorMap* mw = args.w_maps + g;
      asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(
                       reinterpret_cast<uint64_t>(mw))
                   : "memory");
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
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float* sw = args.scales[g] + Fp8ScaleRow(m0, args.split_rows) * int64_t{args.scale_ld};
  const float* sa_group = args.a_scales + int64_t{r0} * k_blocks;
  uint32_t it = 0;
  for (int32_t ch = 0; ch < chunks; ++ch) {
    // This thread's activation rows (as offsets in the group): 8 i + 2 (lane % 4) + {0, 1}.
    const int32_t c0 = ch * N + 2 * (lane % 4);
    float acc[2][kRegs], part[2][kRegs];
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
      MbarWait(full_bar + 8 * s, phase);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < kRegs; ++i) FenceReg(part[h][i]);
      }
      WgmmaFence();
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t wa = w_tile(s) + h * 64 * kBlockK;
#pragma unroll
        for (int kk = 0; kk < kBlockK / 32; ++kk) {
          WgmmaM64K32<N>(part[h], SmemDesc(wa + kk * 32), SmemDesc(a_tile(s) + kk * 32), kk > 0);
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
      MbarArrive(empty_bar + 8 * s);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < kRegs; ++i) {
          acc[h][i] = fmaf(part[h][i], sa[i / 4][i % 2], acc[h][i]);
        }
      }
    }
    // c[r0 + row, j]: the weight rows j are 8 consecutive columns of c across lane / 4.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < kRegs; ++i) {
        const int32_t row = c0 + 8 * (i / 4) + i % 2;
        const int32_t j = m0 + h * 64 + warp * 16 + lane / 4 + 8 * ((i % 4) / 2);
        if (row < count && j < args.n) {
          args.c[int64_t{r0 + row} * args.ldc + j] = acc[h][i];
        }
      }
    }
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
  args.max_rows = p.max_rows;
  args.a_scales = p.a_scales;
  args.w_maps = static_cast<const CUtensorMap*>(p.weight_maps);
  args.scales = p.scales;
  args.c = p.c;
  args.ldc = p.ldc;
  const dim3 grid(static_cast<unsigned>((p.n + kTileM - 1) / kTileM),
                  static_cast<unsigned>(p.num_groups));
  kernel<<<grid, kThreads, SmemBytes(N), stream>>>(map_a, args);
  return cudaGetLastError();
}

}  // namespace

bool Fp8WgmmaSwapDeviceSupports() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    return false;
  }
  if (major != 9 || minor != 0) return false;
  cudaFuncAttributes attr;
  if (cudaFuncGetAttributes(&attr, Fp8WgmmaSwapKernel<8>) != cudaSuccess) return false;
  return wgmma::EncodeTiled() != nullptr;
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
  const cudaError_t e = cudaMemcpyAsync(device_maps, maps.data(), maps.size() * sizeof(CUtensorMap),
                                        cudaMemcpyHostToDevice, stream);
  if (e != cudaSuccess) return e;
  return cudaStreamSynchronize(stream);
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
  if (p.num_groups < 1 || p.num_groups > kMaxGroups || p.max_rows < 1 ||
      (p.offsets == nullptr && p.num_groups != 1) || p.n < 1 || p.k < 1 || p.n > kInt32Max ||
      p.k > kInt32Max || p.k % kBlockK != 0 || p.a == nullptr || !Aligned(p.a, 16) || p.lda < p.k ||
      p.lda % 16 != 0 || p.a_scales == nullptr || p.weight_maps == nullptr ||
      !Aligned(p.weight_maps, 64) || p.scales == nullptr || p.scale_ld < Fp8ScaleCols(p.k) ||
      p.scale_ld > kInt32Max || p.split_rows < 0 || p.split_rows % kTileM != 0 ||
      p.split_rows > kInt32Max || p.c == nullptr || p.ldc < p.n) {
    return false;
  }
  return Fp8WgmmaSwapDeviceSupports();
}

cudaError_t Fp8WgmmaSwapGroupedGemm(const Fp8WgmmaSwapGroupedGemmParams& p, cudaStream_t stream) {
  if (!Fp8WgmmaSwapGroupedGemmSupports(p)) return cudaErrorInvalidValue;
  switch (Fp8WgmmaSwapChunkRows(p.rows_per_group_hint)) {
    case 8:
      return Launch<8>(p, stream);
    case 16:
      return Launch<16>(p, stream);
    case 24:
      return Launch<24>(p, stream);
    case 32:
      return Launch<32>(p, stream);
    default:
      return Launch<64>(p, stream);
  }
}

}  // namespace kernels
}  // namespace deepinfer
