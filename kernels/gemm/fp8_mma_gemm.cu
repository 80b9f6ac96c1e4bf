// FP8 block-scaled weights on bf16 tensor cores: see fp8_mma_gemm.h. The tile loop is
// mma_weight_tile.cuh's; this file has the FP8 weight format and the launches.
//
// Chunks: thread t's chunk c of k block kb is k kb * 128 + 64 c + 16 t .. + 15, one 16-byte load
// of FP8 weights per weight row (32 bytes of bf16 activations per activation row). A widened FP8
// word gives its even bytes (0, 2) and its odd bytes (1, 3) as two bf16 pairs directly, which is
// the fragment order. The block's MMA sums are multiplied by the rows' block scales.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <limits>

#include "kernels/common/streaming_load.cuh"
#include "kernels/gemm/fp8_mma_gemm.h"
#include "kernels/gemm/mma_grouped_kernel.cuh"
#include "kernels/gemm/mma_weight_tile.cuh"

namespace deepinfer {
namespace kernels {
namespace {

using mma_tile::kKBlock;
using mma_tile::kThreads;
using mma_tile::kTile;
using mma_tile::kWarps;
constexpr int64_t kIntMax = std::numeric_limits<int>::max();

using mma_tile::WidenFp8x4;

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// mma_tile's weight format for Fp8BlockWeight (fp8_block_gemm.h).
class Fp8Format {
 public:
  struct Matrix {
    const uint8_t* w;
    int64_t ldw;
    const float* scales;
    int64_t scale_ld, split;
  };
  struct Raw {
    uint4 w[2][2];  // [chunk][row fa, fb]
  };
  static constexpr bool kBlockScaled = true;

  Fp8Format() = default;
  __device__ Fp8Format(const Matrix& m, int64_t fa, int64_t fb, int t)
      : wa_(m.w + fa * m.ldw + 16 * t),
        wb_(m.w + fb * m.ldw + 16 * t),
        sa_(m.scales + Fp8ScaleRow(fa, m.split) * m.scale_ld),
        sb_(m.scales + Fp8ScaleRow(fb, m.split) * m.scale_ld),
        t_(t) {}
  __device__ static Matrix GroupMatrix(const Fp8MmaGroupedGemmParams& p, int group) {
    return {p.weights[group], p.k, p.scales[group], p.scale_ld, p.split_rows};
  }
  __device__ static int64_t ChunkK(int64_t kb, int c, int t) {
    return kb * kKBlock + c * 64 + 16 * t;
  }
  __device__ static bool ChunkOk(int64_t kb, int c, int t, int64_t k) {
    return ChunkK(kb, c, t) < k;
  }
  static constexpr int kHalfStride = 8;
  __device__ static bool HalfOk(int64_t kb, int c, int t, int, int64_t k) {
    return ChunkOk(kb, c, t, k);
  }
  __device__ void Load(int64_t kb, int64_t k, Raw* r) const {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int64_t off = kb * kKBlock + c * 64;
      const bool ok = ChunkOk(kb, c, t_, k);
      r->w[c][0] = ok ? LoadStreaming16(wa_ + off) : make_uint4(0, 0, 0, 0);
      r->w[c][1] = ok ? LoadStreaming16(wb_ + off) : make_uint4(0, 0, 0, 0);
    }
  }
  __device__ void Fragment(const Raw& r, int c, int s, uint32_t af[4]) const {
    WidenFp8x4(Word(r.w[c][0], s), &af[0], &af[2]);
    WidenFp8x4(Word(r.w[c][1], s), &af[1], &af[3]);
  }
  __device__ void BlockScales(int64_t kb, float* s0, float* s1) const {
    *s0 = __ldg(sa_ + kb);
    *s1 = __ldg(sb_ + kb);
  }

 private:
  const uint8_t* wa_;
  const uint8_t* wb_;
  const float* sa_;
  const float* sb_;
  int t_;
};

// grid x: blocks of 8 / ks_count feature tiles of 16 MT rows; y: passes of 8 NT rows.
// kMinBlocks: as mma_tile::MmaGroupedKernel's.
template <int NT, int MT, bool kSharedB, bool kBf16A, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    Fp8MmaGemmKernel(Fp8MmaGemmParams p, int ks_count) {
  extern __shared__ uint4 frag[];
  __shared__ float red[kWarps][kTile * MT][8 * NT];
  const int warp = threadIdx.x >> 5;
  const int fb_count = kWarps / ks_count, fb = warp / ks_count, ks = warp % ks_count;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * fb_count;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * 8 * NT;
  const int64_t f0 = (tile0 + fb) * kTile * MT;
  float acc[MT][NT][4];
  const Fp8Format::Matrix m{p.w.data, p.w.ldw, p.w.scales, p.w.scale_ld, p.w.split_rows};
  if constexpr (kSharedB) {
    mma_tile::WarpTileSharedB<NT, MT, kBf16A, Fp8Format>(m, p.n, f0, p.a, p.lda, row0, p.m, p.k, ks,
                                                         ks_count, frag, acc);
  } else {
    int64_t kb0, kb1;
    mma_tile::KSlice(p.k, ks, ks_count, &kb0, &kb1);
    mma_tile::WarpTile<NT, MT, kBf16A, Fp8Format>(m, p.n, f0, p.a, p.lda, row0, p.m, p.k, kb0, kb1,
                                                  acc);
  }
  mma_tile::StoreFragments<NT, MT>(acc, red[warp]);
  __syncthreads();
  mma_tile::ReduceAndStore<NT, MT>(red, fb_count, ks_count, tile0, row0, p.m, p.n, p.c, p.ldc,
                                   p.accumulate);
}

// MmaTileOptions::all_rows: grid x as Fp8MmaGemmKernel's (feature tiles of 16 rows), y: passes
// of 8 NT rows; the activation fragments and then the k-slices' partial sums in the dynamic
// shared memory (AllRowsBytes<NT>()).
template <int NT>
constexpr size_t AllRowsBytes() {
  const size_t frag = size_t{2048} * mma_tile::kAllRowsUnits(NT);
  const size_t red = sizeof(float) * kWarps * kTile * 8 * NT;
  return frag > red ? frag : red;
}

template <int NT, bool kBf16A>
__global__ void __launch_bounds__(kThreads) Fp8MmaAllRowsKernel(Fp8MmaGemmParams p, int ks_count) {
  extern __shared__ uint4 frag[];
  const int warp = threadIdx.x >> 5;
  const int fb_count = kWarps / ks_count, fb = warp / ks_count, ks = warp % ks_count;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * fb_count;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * 8 * NT;
  float acc[1][NT][4];
  const Fp8Format::Matrix m{p.w.data, p.w.ldw, p.w.scales, p.w.scale_ld, p.w.split_rows};
  mma_tile::WarpTileAllRows<NT, kBf16A, Fp8Format>(m, p.n, (tile0 + fb) * kTile, p.a, p.lda, row0,
                                                   p.m, p.k, ks, ks_count, frag, acc);
  __syncthreads();  // every warp is done with the fragments: the memory holds the partial sums
  auto red = reinterpret_cast<float(*)[kTile][8 * NT]>(frag);
  mma_tile::StoreFragments<NT, 1>(acc, red[warp]);
  __syncthreads();
  mma_tile::ReduceAndStore<NT, 1>(red, fb_count, ks_count, tile0, row0, p.m, p.n, p.c, p.ldc,
                                  p.accumulate);
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether a fixed k split (Fp8MmaGemmParams::k_split) is one the kernels take.
bool KSplitValid(int32_t k_split, int64_t k) {
  if (k_split == 0 || k_split == 1) return true;
  const int64_t kblocks = (k + kKBlock - 1) / kKBlock;
  return (k_split == 2 || k_split == 4 || k_split == kWarps) && 2 * k_split <= kblocks;
}

template <int NT, bool kBf16A>
cudaError_t LaunchAllRowsKernel(const Fp8MmaGemmParams& p, int ks, int64_t passes,
                                cudaStream_t stream) {
  constexpr size_t kBytes = AllRowsBytes<NT>();
  const auto kernel = Fp8MmaAllRowsKernel<NT, kBf16A>;
  static std::atomic<uint64_t> allowed_on{0};
  const cudaError_t allowed =
      mma_tile::AllowDynamicSmem(reinterpret_cast<const void*>(kernel), kBytes, &allowed_on);
  if (allowed != cudaSuccess) return allowed;
  const int64_t tiles = (p.n + kTile - 1) / kTile, per_block = kWarps / ks;
  const dim3 grid(static_cast<unsigned>((tiles + per_block - 1) / per_block),
                  static_cast<unsigned>(passes));
  kernel<<<grid, kThreads, kBytes, stream>>>(p, ks);
  return cudaGetLastError();
}

// MmaTileOptions::all_rows: passes of 32, 64 or 128 rows by m; the k split p's or KSplit's,
// capped where a pass's fragments would not fit kAllRowsUnits (a fixed split takes a smaller
// pass instead).
template <bool kBf16A>
cudaError_t LaunchAllRows(const Fp8MmaGemmParams& p, cudaStream_t stream) {
  int nt = p.m <= 32 ? 4 : p.m <= 64 ? 8 : 16;
  if (p.k_split > 0) {
    while (p.k_split * nt > mma_tile::kAllRowsUnits(nt)) nt /= 2;
  }
  const int64_t passes = (p.m + 8 * nt - 1) / (8 * nt);
  int ks = p.k_split > 0 ? p.k_split : mma_tile::KSplit(p.n, p.k, passes);
  while (ks * nt > mma_tile::kAllRowsUnits(nt)) ks /= 2;
  switch (nt) {
    case 4:
      return LaunchAllRowsKernel<4, kBf16A>(p, ks, passes, stream);
    case 8:
      return LaunchAllRowsKernel<8, kBf16A>(p, ks, passes, stream);
    default:
      return LaunchAllRowsKernel<16, kBf16A>(p, ks, passes, stream);
  }
}

template <int NT, int MT, bool kSharedB, bool kBf16A, int kMinBlocks>
cudaError_t LaunchDenseKernel(const Fp8MmaGemmParams& p, int ks, dim3 grid, cudaStream_t stream) {
  const auto kernel = Fp8MmaGemmKernel<NT, MT, kSharedB, kBf16A, kMinBlocks>;
  if constexpr (kSharedB) {
    static std::atomic<uint64_t> allowed_on{0};
    const cudaError_t allowed = mma_tile::AllowDynamicSmem(reinterpret_cast<const void*>(kernel),
                                                           mma_tile::kSharedBBytes, &allowed_on);
    if (allowed != cudaSuccess) return allowed;
  }
  kernel<<<grid, kThreads, kSharedB ? mma_tile::kSharedBBytes : 0, stream>>>(p, ks);
  return cudaGetLastError();
}

template <int NT, int MT, bool kBf16A, int kMinBlocks>
cudaError_t LaunchDense(const Fp8MmaGemmParams& p, cudaStream_t stream) {
  const int64_t passes = (p.m + 8 * NT - 1) / (8 * NT);
  const int ks = p.k_split > 0 ? p.k_split : mma_tile::KSplit(p.n, p.k, passes, kTile * MT);
  const int64_t tiles = (p.n + kTile * MT - 1) / (kTile * MT), per_block = kWarps / ks;
  const dim3 grid(static_cast<unsigned>((tiles + per_block - 1) / per_block),
                  static_cast<unsigned>(passes));
  if (p.tile.shared_activations && mma_tile::SharedBFits(NT, ks)) {
    return LaunchDenseKernel<NT, MT, true, kBf16A, kMinBlocks>(p, ks, grid, stream);
  }
  return LaunchDenseKernel<NT, MT, false, kBf16A, kMinBlocks>(p, ks, grid, stream);
}

template <int MT, bool kBf16A, int kMinBlocks>
cudaError_t LaunchDenseRows(const Fp8MmaGemmParams& p, cudaStream_t stream) {
  switch (mma_tile::RowTiles(p.m)) {
    case 1:
      return LaunchDense<1, MT, kBf16A, kMinBlocks>(p, stream);
    case 2:
      return LaunchDense<2, MT, kBf16A, kMinBlocks>(p, stream);
    default:
      return LaunchDense<4, MT, kBf16A, kMinBlocks>(p, stream);
  }
}

template <bool kBf16A>
cudaError_t LaunchDenseTile(const Fp8MmaGemmParams& p, cudaStream_t stream) {
  if (p.tile.all_rows) return LaunchAllRows<kBf16A>(p, stream);
  if (p.tile.two_blocks_per_sm) {
    return p.tile.wide ? LaunchDenseRows<2, kBf16A, 2>(p, stream)
                       : LaunchDenseRows<1, kBf16A, 2>(p, stream);
  }
  return p.tile.wide ? LaunchDenseRows<2, kBf16A, 1>(p, stream)
                     : LaunchDenseRows<1, kBf16A, 1>(p, stream);
}

}  // namespace

bool Fp8MmaGemmAvailable() {
  static const bool available =
      mma_tile::GroupedKernelHasMmaCode<Fp8Format, Fp8MmaGroupedGemmParams>();
  return available;
}

MmaTileOptions Fp8MmaDenseTile(int64_t /*m*/) { return MmaTileOptions(); }

bool Fp8MmaGemmSupports(const Fp8MmaGemmParams& p) {
  const int64_t a_elem = p.a_bf16 ? 2 : 4;
  return p.m >= 1 && p.n >= 1 && p.k >= 1 && p.m <= kIntMax && p.n <= kIntMax &&
         (p.m + 7) / 8 <= 65535 && p.k % 16 == 0 && p.a != nullptr && p.w.data != nullptr &&
         p.w.scales != nullptr && p.c != nullptr && p.lda >= p.k && (p.lda * a_elem) % 16 == 0 &&
         Aligned16(p.a) && p.w.ldw >= p.k && p.w.ldw % 16 == 0 && Aligned16(p.w.data) &&
         p.ldc >= p.n && p.w.scale_ld >= Fp8ScaleCols(p.k) && p.w.split_rows >= 0 &&
         KSplitValid(p.k_split, p.k) && Fp8MmaGemmAvailable();
}

cudaError_t Fp8MmaGemm(const Fp8MmaGemmParams& p, cudaStream_t stream) {
  if (!Fp8MmaGemmSupports(p)) return cudaErrorInvalidValue;
  return p.a_bf16 ? LaunchDenseTile<true>(p, stream) : LaunchDenseTile<false>(p, stream);
}

bool Fp8MmaGroupedGemmSupports(const Fp8MmaGroupedGemmParams& p) {
  return p.num_groups >= 1 && p.max_rows >= 0 && p.n >= 1 && p.k >= 1 && p.n <= kIntMax &&
         p.k % 16 == 0 && std::min(p.num_groups, p.max_rows) <= 65535 && p.offsets != nullptr &&
         p.a != nullptr && Aligned16(p.a) && p.weights != nullptr && p.scales != nullptr &&
         p.c != nullptr && p.scale_ld >= Fp8ScaleCols(p.k) && p.split_rows >= 0 &&
         KSplitValid(p.k_split, p.k) && Fp8MmaGemmAvailable();
}

cudaError_t Fp8MmaGroupedGemm(const Fp8MmaGroupedGemmParams& p, cudaStream_t stream) {
  if (!Fp8MmaGroupedGemmSupports(p)) return cudaErrorInvalidValue;
  if (p.max_rows == 0) return cudaSuccess;
  return mma_tile::LaunchGroupedTile<Fp8Format>(p, p.k_split, stream);
}

}  // namespace kernels
}  // namespace deepinfer
