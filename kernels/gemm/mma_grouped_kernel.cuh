// The grouped kernels on mma_weight_tile.cuh's tile loop and their launches: one block row per
// non-empty group (its extents from the device offsets), the register loop (MmaGroupedKernel:
// passes of up to 32 rows, each loading the block's weights) and the all-rows loop
// (MmaGroupedAllRowsKernel), for Fp8MmaGroupedGemm, Mxfp4MmaGroupedGemm and Bf16MmaGroupedGemm.
// Include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/common/nonempty_group.cuh"
#include "kernels/gemm/mma_weight_tile.cuh"

namespace deepinfer {
namespace kernels {
namespace mma_tile {

// One pass of a grouped kernel: c rows [row0, min(row0 + 8 NT, row_end)) of the block's fb_count
// feature tiles from tile0 (warp's tile from f0, k-slice ks of ks_count), through red_smem (at
// least kWarps * 16 MT * 8 NT floats). Every thread of the block calls it (it has barriers).
template <int NT, int MT, bool kSharedB, typename Format, int kUnits, typename Params>
__device__ __forceinline__ void GroupedPass(const Params& p, const typename Format::Matrix& m,
                                            int64_t f0, int64_t tile0, int fb_count, int ks,
                                            int ks_count, int64_t row0, int64_t row_end,
                                            uint4* frag, float* red_smem) {
  auto red = reinterpret_cast<float(*)[kTile * MT][8 * NT]>(red_smem);
  float acc[MT][NT][4];
  if constexpr (kSharedB) {
    WarpTileSharedB<NT, MT, true, Format, kUnits>(m, p.n, f0, p.a, p.k, row0, row_end, p.k, ks,
                                                  ks_count, frag, acc);
  } else {
    int64_t kb0, kb1;
    KSlice(p.k, ks, ks_count, &kb0, &kb1);
    WarpTile<NT, MT, true, Format>(m, p.n, f0, p.a, p.k, row0, row_end, p.k, kb0, kb1, acc);
  }
  StoreFragments<NT, MT>(acc, red[threadIdx.x >> 5]);
  __syncthreads();
  ReduceAndStore<NT, MT>(red, fb_count, ks_count, tile0, row0, row_end, p.n, p.c, p.n, false);
  __syncthreads();
}

// MmaGroupedKernel's kByRows dynamic shared memory: the activation fragments (kSharedB: kUnits
// 2 KiB units), then the partial sums of a pass of up to nt row tiles of mt 16-row weight tiles.
__host__ __device__ constexpr int64_t ByRowsFragUint4(bool shared_b, int units) {
  return shared_b ? int64_t{units} * 128 : 0;
}
__host__ __device__ constexpr size_t ByRowsBytes(int nt, int mt, bool shared_b, int units) {
  return 16 * ByRowsFragUint4(shared_b, units) + sizeof(float) * kWarps * kTile * mt * 8 * nt;
}

// GroupedPass as a call of its own on the kByRows layout of the dynamic shared memory, so that
// the kernel that picks among several row tiles (MmaGroupedKernel's kByRows) allocates each
// one's registers apart (the shared memory named here, not through pointers, keeps its loads
// shared-memory loads).
template <int NT, int MT, bool kSharedB, typename Format, int kUnits, typename Params>
__device__ __noinline__ void GroupedPassCall(const Params& p, const typename Format::Matrix& m,
                                             int64_t f0, int64_t tile0, int fb_count, int ks,
                                             int ks_count, int64_t row0, int64_t row_end) {
  extern __shared__ uint4 by_rows_smem[];
  GroupedPass<NT, MT, kSharedB, Format, kUnits>(
      p, m, f0, tile0, fb_count, ks, ks_count, row0, row_end, by_rows_smem,
      reinterpret_cast<float*>(by_rows_smem + ByRowsFragUint4(kSharedB, kUnits)));
}

// The grouped GEMM over the rows of each non-empty group (bf16 activations [max_rows, k], c fp32
// [max_rows, n]): grid x = feature-tile blocks, y = the non-empty groups. Params has num_groups,
// max_rows, offsets, n, k, a, c; Format::GroupMatrix(p, group) gives the group's weights. MT:
// 16-row weight tiles a warp; kSharedB: the activation fragments through shared memory
// (WarpTileSharedB, kSharedBBytes of dynamic shared memory); kMinBlocks: blocks an SM must fit
// (2: at most 128 registers a thread, spilling where the tile needs more). kByRows: NT is the
// most row tiles of a pass; a group with at most 8 NT rows takes one pass of the fewest 8-row
// tiles that hold them (the same sums: a row's sum depends on neither the pass nor its tiles),
// the others passes of NT, each staging twice the k blocks of activation fragments a phase
// (kSharedBUnitsByRows; ByRowsBytes of dynamic shared memory). The choice is made once per
// block, and the smaller passes are calls of their own, so that each body's registers are its
// own.
template <int NT, int MT, bool kSharedB, int kMinBlocks, typename Format, typename Params,
          bool kByRows = false>
__global__ void __launch_bounds__(kThreads, kMinBlocks) MmaGroupedKernel(Params p, int ks_count) {
  constexpr int kUnits = kByRows ? kSharedBUnitsByRows : kSharedBUnits;
  extern __shared__ uint4 frag[];
  // kByRows: the partial sums in the dynamic shared memory after the fragments (ByRowsBytes).
  __shared__ float red_static[kByRows ? 1 : kWarps * kTile * MT * 8 * NT];
  float* const red =
      kByRows ? reinterpret_cast<float*>(frag + ByRowsFragUint4(kSharedB, kUnits)) : red_static;
  __shared__ int work[3];
  FindNonEmptyGroup(p.num_groups, p.max_rows, p.offsets, work);
  const int group = work[0];
  const int64_t row_begin = work[1], row_end = work[2];
  if (row_begin >= row_end) return;
  const int warp = threadIdx.x >> 5;
  const int fb_count = kWarps / ks_count, fb = warp / ks_count, ks = warp % ks_count;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * fb_count;
  const int64_t f0 = (tile0 + fb) * kTile * MT;
  const typename Format::Matrix m = Format::GroupMatrix(p, group);
  const int64_t rows = row_end - row_begin;
  if constexpr (kByRows && NT >= 2) {
    if (rows <= 8) {
      GroupedPassCall<1, MT, kSharedB, Format, kUnits>(p, m, f0, tile0, fb_count, ks, ks_count,
                                                       row_begin, row_end);
      return;
    }
  }
  if constexpr (kByRows && NT >= 3) {
    if (rows <= 16) {
      GroupedPassCall<2, MT, kSharedB, Format, kUnits>(p, m, f0, tile0, fb_count, ks, ks_count,
                                                       row_begin, row_end);
      return;
    }
  }
  if constexpr (kByRows && NT >= 4) {
    if (rows <= 24) {
      GroupedPassCall<3, MT, kSharedB, Format, kUnits>(p, m, f0, tile0, fb_count, ks, ks_count,
                                                       row_begin, row_end);
      return;
    }
  }
  for (int64_t row0 = row_begin; row0 < row_end; row0 += 8 * NT) {
    GroupedPass<NT, MT, kSharedB, Format, kUnits>(p, m, f0, tile0, fb_count, ks, ks_count, row0,
                                                  row_end, frag, red);
  }
}

// The dynamic shared memory of an all-rows pass of 8 NT rows: its activation fragments
// (kAllRowsUnits(NT) 2 KiB units), then the k-slices' partial sums in the same bytes.
__host__ __device__ constexpr size_t AllRowsBytes(int nt) {
  return size_t{2048} * kAllRowsUnits(nt) > sizeof(float) * kWarps * kTile * 8 * nt
             ? size_t{2048} * kAllRowsUnits(nt)
             : sizeof(float) * kWarps * kTile * 8 * nt;
}

// MmaGroupedKernel with the all-rows loop (WarpTileAllRows: 16 weight rows a warp, passes of 8 NT
// rows, AllRowsBytes(NT) of dynamic shared memory): the same sums at the same k split.
template <int NT, typename Format, typename Params>
__global__ void __launch_bounds__(kThreads) MmaGroupedAllRowsKernel(Params p, int ks_count) {
  extern __shared__ uint4 frag[];
  __shared__ int work[3];
  FindNonEmptyGroup(p.num_groups, p.max_rows, p.offsets, work);
  const int group = work[0];
  const int64_t row_begin = work[1], row_end = work[2];
  if (row_begin >= row_end) return;
  const int warp = threadIdx.x >> 5;
  const int fb_count = kWarps / ks_count, fb = warp / ks_count, ks = warp % ks_count;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * fb_count;
  const typename Format::Matrix m = Format::GroupMatrix(p, group);
  auto red = reinterpret_cast<float(*)[kTile][8 * NT]>(frag);
  for (int64_t row0 = row_begin; row0 < row_end; row0 += 8 * NT) {
    float acc[1][NT][4];
    // Its first barrier also keeps the previous pass's partial sums until they are read.
    WarpTileAllRows<NT, true, Format>(m, p.n, (tile0 + fb) * kTile, p.a, p.k, row0, row_end, p.k,
                                      ks, ks_count, frag, acc);
    __syncthreads();  // every warp is done with the fragments: the memory takes the partial sums
    StoreFragments<NT, 1>(acc, red[warp]);
    __syncthreads();
    ReduceAndStore<NT, 1>(red, fb_count, ks_count, tile0, row0, row_end, p.n, p.c, p.n, false);
  }
}

// The grouped kernels' grid (feature-tile blocks x block rows of groups) and k split for p, with
// feature tiles of tile_rows.
template <typename Params>
dim3 GroupedGrid(const Params& p, int k_split, int tile_rows, int* ks) {
  const int64_t group_blocks = p.num_groups < p.max_rows ? p.num_groups : p.max_rows;
  *ks = k_split > 0 ? k_split : KSplit(p.n, p.k, group_blocks, tile_rows);
  const int64_t tiles = (p.n + tile_rows - 1) / tile_rows, per_block = kWarps / *ks;
  return dim3(static_cast<unsigned>((tiles + per_block - 1) / per_block),
              static_cast<unsigned>(group_blocks));
}

template <int NT, int MT, bool kSharedB, int kMinBlocks, bool kByRows, typename Format,
          typename Params>
cudaError_t LaunchGroupedTiles(const Params& p, int ks, dim3 grid, cudaStream_t stream) {
  const auto kernel = MmaGroupedKernel<NT, MT, kSharedB, kMinBlocks, Format, Params, kByRows>;
  constexpr size_t kBytes = kByRows    ? ByRowsBytes(NT, MT, kSharedB, kSharedBUnitsByRows)
                            : kSharedB ? kSharedBBytes
                                       : 0;
  if constexpr (kBytes > 0) {
    static std::atomic<uint64_t> allowed_on{0};
    const cudaError_t allowed =
        AllowDynamicSmem(reinterpret_cast<const void*>(kernel), kBytes, &allowed_on);
    if (allowed != cudaSuccess) return allowed;
  }
  kernel<<<grid, kThreads, kBytes, stream>>>(p, ks);
  return cudaGetLastError();
}

// NT chosen; the shared fragments where they fit, else per-warp loads (the same sums).
template <int NT, int MT, bool kSharedB, int kMinBlocks, bool kByRows, typename Format,
          typename Params>
cudaError_t LaunchGroupedRows(const Params& p, int ks, dim3 grid, cudaStream_t stream) {
  if constexpr (kSharedB) {
    if (SharedBFits(NT, ks)) {
      return LaunchGroupedTiles<NT, MT, true, kMinBlocks, kByRows, Format>(p, ks, grid, stream);
    }
  }
  return LaunchGroupedTiles<NT, MT, false, kMinBlocks, kByRows, Format>(p, ks, grid, stream);
}

template <int NT, typename Format, typename Params>
cudaError_t LaunchGroupedAllRowsTiles(const Params& p, int ks, dim3 grid, cudaStream_t stream) {
  constexpr size_t kBytes = AllRowsBytes(NT);
  const auto kernel = MmaGroupedAllRowsKernel<NT, Format, Params>;
  static std::atomic<uint64_t> allowed_on{0};
  const cudaError_t allowed =
      AllowDynamicSmem(reinterpret_cast<const void*>(kernel), kBytes, &allowed_on);
  if (allowed != cudaSuccess) return allowed;
  kernel<<<grid, kThreads, kBytes, stream>>>(p, ks);
  return cudaGetLastError();
}

// Launches MmaGroupedAllRowsKernel for p: passes of 32, 64 or 128 rows by p's
// rows_per_group_hint (max_rows where 0); the k split k_split's (a smaller pass where its
// fragments would not fit kAllRowsUnits) or, with 0, KSplit's, capped where they would not fit.
template <typename Format, typename Params>
cudaError_t LaunchGroupedAllRows(const Params& p, int k_split, cudaStream_t stream) {
  const int hint = p.rows_per_group_hint > 0 ? p.rows_per_group_hint : p.max_rows;
  int nt = hint <= 32 ? 4 : hint <= 64 ? 8 : 16;
  if (k_split > 0) {
    while (k_split * nt > kAllRowsUnits(nt)) nt /= 2;
  }
  int ks = 1;
  GroupedGrid(p, k_split, kTile, &ks);
  while (ks * nt > kAllRowsUnits(nt)) ks /= 2;
  const dim3 grid = GroupedGrid(p, ks, kTile, &ks);
  switch (nt) {
    case 4:
      return LaunchGroupedAllRowsTiles<4, Format>(p, ks, grid, stream);
    case 8:
      return LaunchGroupedAllRowsTiles<8, Format>(p, ks, grid, stream);
    default:
      return LaunchGroupedAllRowsTiles<16, Format>(p, ks, grid, stream);
  }
}

// Launches MmaGroupedKernel<NT, MT, kSharedB, kMinBlocks, Format> for p (its num_groups,
// max_rows, n, k and rows_per_group_hint); p.max_rows >= 1. k_split: warps splitting k (1, 2, 4
// or 8, at most half the k blocks), 0: KSplit's choice. kByRows: the hint's row tiles are the most
// a pass takes, each pass the fewest that hold the group's rows left (MmaGroupedKernel).
template <typename Format, int MT = 1, bool kSharedB = false, int kMinBlocks = 1,
          bool kByRows = false, typename Params>
cudaError_t LaunchGrouped(const Params& p, int k_split, cudaStream_t stream) {
  int ks = 1;
  const dim3 grid = GroupedGrid(p, k_split, kTile * MT, &ks);
  const int hint = p.rows_per_group_hint > 0 ? p.rows_per_group_hint : p.max_rows;
  switch (RowTiles(hint)) {
    case 1:
      return LaunchGroupedRows<1, MT, kSharedB, kMinBlocks, kByRows, Format>(p, ks, grid, stream);
    case 2:
      return LaunchGroupedRows<2, MT, kSharedB, kMinBlocks, kByRows, Format>(p, ks, grid, stream);
    default:
      return LaunchGroupedRows<4, MT, kSharedB, kMinBlocks, kByRows, Format>(p, ks, grid, stream);
  }
}

// The grouped register loop (LaunchGrouped) with the tile options of p.tile (wide,
// shared_activations, two_blocks_per_sm; all_rows is the caller's to route): the kernel instance
// each combination names.
template <typename Format, int MT, bool kSharedB, bool kByRows = false, typename Params>
cudaError_t LaunchGroupedBlocks(const Params& p, int k_split, cudaStream_t stream) {
  return p.tile.two_blocks_per_sm
             ? LaunchGrouped<Format, MT, kSharedB, 2, kByRows>(p, k_split, stream)
             : LaunchGrouped<Format, MT, kSharedB, 1, kByRows>(p, k_split, stream);
}

template <typename Format, typename Params>
cudaError_t LaunchGroupedTile(const Params& p, int k_split, cudaStream_t stream) {
  if (p.tile.wide) {
    return p.tile.shared_activations ? LaunchGroupedBlocks<Format, 2, true>(p, k_split, stream)
                                     : LaunchGroupedBlocks<Format, 2, false>(p, k_split, stream);
  }
  return p.tile.shared_activations ? LaunchGroupedBlocks<Format, 1, true>(p, k_split, stream)
                                   : LaunchGroupedBlocks<Format, 1, false>(p, k_split, stream);
}

// LaunchGroupedTile's narrow tile (16 weight rows a warp; p.tile.wide is not read) with the row
// tiles of each pass chosen from the rows its group has left (LaunchGrouped's kByRows).
template <typename Format, typename Params>
cudaError_t LaunchGroupedTileByRows(const Params& p, int k_split, cudaStream_t stream) {
  return p.tile.shared_activations
             ? LaunchGroupedBlocks<Format, 1, true, true>(p, k_split, stream)
             : LaunchGroupedBlocks<Format, 1, false, true>(p, k_split, stream);
}

// Whether this process has sm_80+ code for Format's grouped kernel on the current device (the
// compute_75 PTX fallback has no bf16 MMA); the callers cache it.
template <typename Format, typename Params>
bool GroupedKernelHasMmaCode() {
  cudaFuncAttributes attr;
  if (cudaFuncGetAttributes(&attr, MmaGroupedKernel<1, 1, false, 1, Format, Params>) !=
      cudaSuccess) {
    return false;
  }
  return attr.binaryVersion >= 80 && attr.ptxVersion >= 80;
}

}  // namespace mma_tile
}  // namespace kernels
}  // namespace deepinfer
