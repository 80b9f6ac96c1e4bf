// The scheduling that the persistent swap-AB grouped GEMMs (fp8_wgmma_decode.cu,
// mxfp4_wgmma_decode.cu) share: a grid of about SM count x resident CTAs walks the units (expert
// g, weight tile, chunk of N activation rows) of the non-empty experts, numbered expert by
// expert, tile-major and chunk-minor within an expert; CTA b takes units b, b + gridDim.x, ... .
// One producer thread feeds a TMA ring whose mbarrier phases run on across units; a consumer
// warpgroup (128 threads) drains it. Here: the ring's set-up, the units' prefix over the groups
// and the search in it, and on the host the resident-CTA count and the bound on the units. The
// producer's loop stays in each kernel (its weight box differs: e4m3 or packed e2m1 bytes).
// Header-only, for .cu files; the device parts exist only in the sm_90a image.
#ifndef DEEPINFER_KERNELS_GEMM_SWAP_PERSISTENT_CUH_
#define DEEPINFER_KERNELS_GEMM_SWAP_PERSISTENT_CUH_

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "kernels/gemm/wgmma_tma.cuh"

namespace deepinfer {
namespace kernels {
namespace swap_persistent {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Hints the TMA unit to fetch a descriptor (a kernel parameter or global memory) into its cache.
__device__ __forceinline__ void PrefetchTensorMap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Orders the descriptor's bytes (written by a copy from the host) before TMA reads it.
__device__ __forceinline__ void AcquireTensorMap(const CUtensorMap* map) {
  asm volatile(
      "fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(reinterpret_cast<uint64_t>(map))
      : "memory");
}

// The ring's barriers: full (the producer's TMA bytes) and empty (every consumer thread), then
// the fences that make the initialisation visible to the async proxy. Thread 0; a __syncthreads
// must follow.
template <int Stages>
__device__ __forceinline__ void InitRing(uint32_t full_bar, uint32_t empty_bar) {
  for (int s = 0; s < Stages; ++s) {
    wgmma::MbarInit(full_bar + 8 * s, 1);
    wgmma::MbarInit(empty_bar + 8 * s, 128);
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

struct Unit {
  int32_t g, r0, count, m0, ch;
};

// The units' exclusive prefix per group into prefix[0 .. num_groups] (tiles units per chunk of
// N rows of a non-empty group): each thread sums a run of consecutive groups, then a scan
// across the block (warp_sums: Threads / 32 entries). Every thread of the block calls it; a
// __syncthreads must follow before prefix is read.
template <int N, int Threads>
__device__ __forceinline__ void UnitPrefix(const int32_t* offsets, int32_t num_groups,
                                           int32_t tiles, int32_t* prefix, int32_t* warp_sums) {
  const int32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int32_t per = (num_groups + Threads - 1) / Threads;
  const int32_t g0 = min(num_groups, int32_t(threadIdx.x) * per), g1 = min(num_groups, g0 + per);
  auto units = [&](int32_t g) {
    const int32_t count = __ldg(offsets + g + 1) - __ldg(offsets + g);
    return count > 0 ? tiles * ((count + N - 1) / N) : 0;
  };
  int32_t local = 0;
  for (int32_t g = g0; g < g1; ++g) local += units(g);
  int32_t x = local;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int32_t y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  int32_t run = x - local;
  for (int w = 0; w < warp; ++w) run += warp_sums[w];
  for (int32_t g = g0; g < g1; ++g) {
    prefix[g] = run;
    run += units(g);
  }
  if (threadIdx.x == Threads - 1) prefix[num_groups] = run;
}

// Unit u (< prefix[num_groups]): the group whose prefix range holds it (binary search; empty
// groups have empty ranges), then its tile (TileM weight rows) and chunk.
template <int N, int TileM>
__device__ __forceinline__ Unit FindUnit(const int32_t* prefix, int32_t num_groups,
                                         const int32_t* offsets, int32_t u) {
  int32_t lo = 0, hi = num_groups;  // prefix[lo] <= u < prefix[hi]
  while (hi - lo > 1) {
    const int32_t mid = (lo + hi) / 2;
    if (prefix[mid] <= u) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  Unit w;
  w.g = lo;
  w.r0 = __ldg(offsets + lo);
  w.count = __ldg(offsets + lo + 1) - w.r0;
  const int32_t chunks = (w.count + N - 1) / N, local = u - prefix[lo];
  w.m0 = (local / chunks) * TileM;
  w.ch = local % chunks;
  return w;
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// At most as many units as tiles x (non-empty groups + max_rows / N) can exist.
template <int N>
int64_t UnitsBound(int64_t tiles, int32_t num_groups, int32_t max_rows) {
  return tiles * (std::min<int64_t>(num_groups, max_rows) + (max_rows + N - 1) / N);
}

// The resident CTAs of the whole device for one kernel, asked once per (device, shared memory
// size): one cache per kernel instantiation (a function-local static of its launcher).
class ResidentCtaCache {
 public:
  template <typename Kernel>
  cudaError_t Get(Kernel kernel, int threads, size_t smem, int64_t* resident) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    *resident = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (dev_ == dev && smem_ == smem) *resident = resident_;
    }
    if (*resident != 0) return cudaSuccess;
    int sms = 0, per_sm = 0;
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
    if (e != cudaSuccess) return e;
    *resident = int64_t{std::max(sms, 1)} * std::max(per_sm, 1);
    std::lock_guard<std::mutex> lock(mu_);
    dev_ = dev, smem_ = smem, resident_ = *resident;
    return cudaSuccess;
  }

 private:
  std::mutex mu_;
  int dev_ = -1;          // guarded by mu_
  size_t smem_ = 0;       // guarded by mu_
  int64_t resident_ = 0;  // guarded by mu_
};

// Whether the current device is compute capability 9.0, the sm_90a image of kernel loads, and
// the driver has cuTensorMapEncodeTiled.
template <typename Kernel>
bool DeviceRunsSm90a(Kernel kernel) {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    return false;
  }
  if (major != 9 || minor != 0) return false;
  cudaFuncAttributes attr;
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) return false;
  return wgmma::EncodeTiled() != nullptr;
}

// Copies the experts' weight descriptors to device_maps on stream and waits for the copy.
inline cudaError_t UploadWeightMaps(const std::vector<CUtensorMap>& maps, void* device_maps,
                                    cudaStream_t stream) {
  const cudaError_t e = cudaMemcpyAsync(device_maps, maps.data(), maps.size() * sizeof(CUtensorMap),
                                        cudaMemcpyHostToDevice, stream);
  if (e != cudaSuccess) return e;
  return cudaStreamSynchronize(stream);
}

}  // namespace swap_persistent
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_SWAP_PERSISTENT_CUH_
