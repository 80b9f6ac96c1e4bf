// Launching our kernels with programmatic dependent launch (PDL, sm_90+; see pdl.h for the
// switch). Include only from .cu files.
//
// A kernel launched with the PDL attribute may start before the kernel ahead of it in the
// stream has finished, so it must execute griddepcontrol.wait before it touches any memory an
// earlier kernel writes or reads (a write could race a predecessor's read too); and it must
// wait even if it has nothing to do, because a kernel after it relies on "this grid completed"
// implying "everything before it completed". To make forgetting the wait impossible, kernels are
// not launched directly: a kernel body is a __device__ function, and the only launchers here
// wrap it in a __global__ entry that waits in every thread before calling it:
//
//   __device__ void ScaleBody(int64_t n, const float* x, float* y) { ... }
//   return LaunchAfterPrecedingGrids<ScaleBody, kThreads>(grid, /*smem=*/0, stream, n, x, y);
//
// A body may also have a prefetch half that runs before the wait, for reads of memory no
// kernel of the step writes (a GEMV's weights), its result handed to the body:
//
//   __device__ Tile LoadTile(Params p) { ... }           // reads weights only
//   __device__ void GemvBody(const Tile& t, Params p) { ... }
//   return LaunchPrefetchThenAfterPrecedingGrids<LoadTile, GemvBody, kThreads>(grid, 0, stream, p);
//
// After the wait every thread also executes griddepcontrol.launch_dependents, so the next PDL
// kernel may be scheduled as soon as all of this grid's blocks are running (it then runs its own
// prefetch and waits for this grid to complete). Kernels not launched this way (cuBLAS, the MLA
// decode and grouped-GEMM kernels) keep full stream order; a PDL kernel after one of them simply
// waits for it to complete.
//
// A kernel whose prologue does not fit a prefetch function (warp-specialised kernels setting up
// shared memory and mbarriers, a __grid_constant__ TMA descriptor parameter) places the wait
// itself: LaunchKernelThatWaits launches such a __global__ kernel, which must call
// WaitForPrecedingGrids in every thread, on every path, before it touches memory an earlier
// kernel may write or read, then AllowDependentGridsToLaunch.
//
// kThreads is the block size (1-D) and the entry's __launch_bounds__. Below sm_90 (the
// compute_75 PTX) the wait and trigger compile to nothing: such devices ignore the attribute.
#ifndef DEEPINFER_KERNELS_COMMON_LAUNCH_CUH_
#define DEEPINFER_KERNELS_COMMON_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <utility>

#include "kernels/common/capture_deps.h"
#include "kernels/common/pdl.h"

namespace deepinfer {
namespace kernels {

// What a prefetch that keeps nothing in registers (an L2 hint) hands its body.
struct NoPrefetchResult {};

// griddepcontrol.wait: returns once the grids this one depends on have completed and their
// memory is visible (at once in a grid not launched with PDL).
__device__ __forceinline__ void WaitForPrecedingGrids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// griddepcontrol.launch_dependents: the next PDL grid may be scheduled once every block of this
// one has executed it (or exited).
__device__ __forceinline__ void AllowDependentGridsToLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

namespace launch_internal {

template <auto kBody, int kThreads, typename... P>
__global__ void __launch_bounds__(kThreads) WaitThenRun(P... args) {
  WaitForPrecedingGrids();
  AllowDependentGridsToLaunch();
  kBody(args...);
}

template <auto kPrefetch, auto kBody, int kThreads, typename... P>
__global__ void __launch_bounds__(kThreads) PrefetchWaitThenRun(P... args) {
  const auto prefetched = kPrefetch(args...);
  WaitForPrecedingGrids();
  AllowDependentGridsToLaunch();
  kBody(prefetched, args...);
}

// PrefetchWaitThenRun compiled for kMinBlocks resident blocks an SM (registers capped to fit).
template <auto kPrefetch, auto kBody, int kThreads, int kMinBlocks, typename... P>
__global__ void __launch_bounds__(kThreads, kMinBlocks) PrefetchWaitThenRunAtOccupancy(P... args) {
  const auto prefetched = kPrefetch(args...);
  WaitForPrecedingGrids();
  AllowDependentGridsToLaunch();
  kBody(prefetched, args...);
}

// The entry kernel for a body, its parameter types taken from the body's signature.
template <auto kBody, int kThreads, typename F = decltype(kBody)>
struct Entry;
template <auto kBody, int kThreads, typename... P>
struct Entry<kBody, kThreads, void (*)(P...)> {
  static constexpr void (*kKernel)(P...) = &WaitThenRun<kBody, kThreads, P...>;
};

template <auto kPrefetch, auto kBody, int kThreads, typename F = decltype(kPrefetch)>
struct PrefetchEntry;
template <auto kPrefetch, auto kBody, int kThreads, typename S, typename... P>
struct PrefetchEntry<kPrefetch, kBody, kThreads, S (*)(P...)> {
  static constexpr void (*kKernel)(P...) = &PrefetchWaitThenRun<kPrefetch, kBody, kThreads, P...>;
};

template <auto kPrefetch, auto kBody, int kThreads, int kMinBlocks,
          typename F = decltype(kPrefetch)>
struct PrefetchEntryAtOccupancy;
template <auto kPrefetch, auto kBody, int kThreads, int kMinBlocks, typename S, typename... P>
struct PrefetchEntryAtOccupancy<kPrefetch, kBody, kThreads, kMinBlocks, S (*)(P...)> {
  static constexpr void (*kKernel)(P...) =
      &PrefetchWaitThenRunAtOccupancy<kPrefetch, kBody, kThreads, kMinBlocks, P...>;
};

// With `programmatic` false (or the switch off) a plain launch: full stream order.
template <typename... P, typename... A>
cudaError_t LaunchMaybeProgrammatic(bool programmatic, void (*kernel)(P...), dim3 grid,
                                    unsigned threads, size_t smem, cudaStream_t stream,
                                    A&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1] = {};
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  if (programmatic && ProgrammaticDependentLaunchEnabled()) {
    // Captured: the edges from the kernels this one follows are made programmatic explicitly
    // (also when allocations captured beside the chain are among its dependencies); should
    // that fail, the launch keeps plain edges. Eager: the attribute.
    bool capturing = false;
    if (MakeCapturedKernelDependenciesProgrammatic(stream, &capturing) != cudaSuccess) {
      (void)cudaGetLastError();
    } else if (!capturing) {
      config.attrs = attribute;
      config.numAttrs = 1;
    }
  }
  return cudaLaunchKernelEx(&config, kernel, static_cast<P>(std::forward<A>(args))...);
}

template <typename... P, typename... A>
cudaError_t Launch(void (*kernel)(P...), dim3 grid, unsigned threads, size_t smem,
                   cudaStream_t stream, A&&... args) {
  return LaunchMaybeProgrammatic(true, kernel, grid, threads, smem, stream,
                                 std::forward<A>(args)...);
}

}  // namespace launch_internal

// Launches `kernel` (grid x threads, smem bytes of dynamic shared memory) on `stream`, with PDL
// when `programmatic` and the switch are on: the kernel itself executes WaitForPrecedingGrids in
// every thread before it touches memory an earlier kernel may write or read, and never reads such
// memory before (a kernel launched without PDL returns from the wait at once, so the same code is
// right either way). Returns the launch's error.
template <typename... P, typename... A>
cudaError_t LaunchKernelThatWaits(void (*kernel)(P...), dim3 grid, unsigned threads, size_t smem,
                                  cudaStream_t stream, bool programmatic, A&&... args) {
  return launch_internal::LaunchMaybeProgrammatic(programmatic, kernel, grid, threads, smem, stream,
                                                  std::forward<A>(args)...);
}

// Launches kBody(args...) on grid x kThreads threads: every thread waits for the preceding
// grids first. Returns the launch's error (as cudaGetLastError would).
template <auto kBody, int kThreads, typename... A>
cudaError_t LaunchAfterPrecedingGrids(dim3 grid, size_t smem, cudaStream_t stream, A&&... args) {
  return launch_internal::Launch(launch_internal::Entry<kBody, kThreads>::kKernel, grid, kThreads,
                                 smem, stream, std::forward<A>(args)...);
}

// The __global__ entry that LaunchAfterPrecedingGrids<kBody, kThreads> launches, for
// cudaFuncSetAttribute (e.g. more dynamic shared memory).
template <auto kBody, int kThreads>
constexpr auto EntryKernel() {
  return launch_internal::Entry<kBody, kThreads>::kKernel;
}

// The __global__ entry that LaunchPrefetchThenAfterPrecedingGrids<kPrefetch, kBody, kThreads>
// launches (e.g. for cudaOccupancyMaxActiveBlocksPerMultiprocessor).
template <auto kPrefetch, auto kBody, int kThreads>
constexpr auto PrefetchEntryKernel() {
  return launch_internal::PrefetchEntry<kPrefetch, kBody, kThreads>::kKernel;
}

// s = kPrefetch(args...) before the wait (it must read only memory no kernel of the stream
// writes), then kBody(s, args...) after it.
template <auto kPrefetch, auto kBody, int kThreads, typename... A>
cudaError_t LaunchPrefetchThenAfterPrecedingGrids(dim3 grid, size_t smem, cudaStream_t stream,
                                                  A&&... args) {
  return launch_internal::Launch(
      launch_internal::PrefetchEntry<kPrefetch, kBody, kThreads>::kKernel, grid, kThreads, smem,
      stream, std::forward<A>(args)...);
}

// LaunchPrefetchThenAfterPrecedingGrids with the entry compiled for kMinBlocks resident blocks
// an SM (__launch_bounds__'s second argument: a thread's registers capped so that they fit),
// for a kernel whose loads in flight scale with its resident warps.
template <auto kPrefetch, auto kBody, int kThreads, int kMinBlocks, typename... A>
cudaError_t LaunchPrefetchThenAfterPrecedingGridsAtOccupancy(dim3 grid, size_t smem,
                                                             cudaStream_t stream, A&&... args) {
  return launch_internal::Launch(
      launch_internal::PrefetchEntryAtOccupancy<kPrefetch, kBody, kThreads, kMinBlocks>::kKernel,
      grid, kThreads, smem, stream, std::forward<A>(args)...);
}

// The __global__ entry that LaunchPrefetchThenAfterPrecedingGridsAtOccupancy launches.
template <auto kPrefetch, auto kBody, int kThreads, int kMinBlocks>
constexpr auto PrefetchEntryKernelAtOccupancy() {
  return launch_internal::PrefetchEntryAtOccupancy<kPrefetch, kBody, kThreads,
                                                   kMinBlocks>::kKernel;
}

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_COMMON_LAUNCH_CUH_
