// bf16 weights on bf16 tensor cores: see bf16_mma_gemm.h. The tile loop is mma_weight_tile.cuh's;
// this file has the bf16 weight format and the launch.
//
// Chunks: half h of thread t's chunk c of k block kb is k kb * 128 + 64 c + 32 h + 8 t .. + 7, one
// 16-byte load per weight row (the quad's four loads 64 contiguous bytes of the row), and the same
// 16 bytes of each activation row; with k a multiple of 8 a half is wholly in range or wholly
// past k (zeros then, weights and activations alike). A chunk's sub-step s takes words 2 (s & 1)
// and 2 (s & 1) + 1 of half s / 2, values (v0, v1) and (v2, v3): the fragment's even pair is
// (v0, v2), its odd pair (v1, v3), one byte permutation each.
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>

#include "kernels/common/streaming_load.cuh"
#include "kernels/gemm/bf16_mma_gemm.h"
#include "kernels/gemm/mma_grouped_kernel.cuh"
#include "kernels/gemm/mma_weight_tile.cuh"

namespace deepinfer {
namespace kernels {
namespace {

using mma_tile::kKBlock;
constexpr int64_t kIntMax = std::numeric_limits<int>::max();

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// mma_tile's weight format for bf16 weights [n, k] (row stride ldw elements).
class Bf16Format {
 public:
  struct Matrix {
    const uint16_t* w;
    int64_t ldw;
  };
  struct Raw {
    uint4 w[2][2][2];  // [chunk][row fa, fb][half]
  };
  static constexpr bool kBlockScaled = false;

  Bf16Format() = default;
  __device__ Bf16Format(const Matrix& m, int64_t fa, int64_t fb, int t)
      : wa_(m.w + fa * m.ldw + 8 * t), wb_(m.w + fb * m.ldw + 8 * t), t_(t) {}
  __device__ static Matrix GroupMatrix(const Bf16MmaGroupedGemmParams& p, int group) {
    return {p.weights[group], p.k};
  }
  __device__ static int64_t ChunkK(int64_t kb, int c, int t) {
    return kb * kKBlock + 64 * c + 8 * t;
  }
  static constexpr int kHalfStride = 32;
  // k is a multiple of 8: a half is in range or wholly past k.
  __device__ static bool HalfOk(int64_t kb, int c, int t, int h, int64_t k) {
    return ChunkK(kb, c, t) + kHalfStride * h < k;
  }
  __device__ void Load(int64_t kb, int64_t k, Raw* r) const {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t off = kb * kKBlock + 64 * c + kHalfStride * h;
        const bool ok = HalfOk(kb, c, t_, h, k);
        r->w[c][0][h] = ok ? LoadStreaming16(wa_ + off) : make_uint4(0, 0, 0, 0);
        r->w[c][1][h] = ok ? LoadStreaming16(wb_ + off) : make_uint4(0, 0, 0, 0);
      }
    }
  }
  __device__ void Fragment(const Raw& r, int c, int s, uint32_t af[4]) const {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint4& v = r.w[c][i][s >> 1];
      const uint32_t lo = Word(v, 2 * (s & 1)), hi = Word(v, 2 * (s & 1) + 1);
      af[i] = __byte_perm(lo, hi, 0x5410);      // (v0, v2)
      af[2 + i] = __byte_perm(lo, hi, 0x7632);  // (v1, v3)
    }
  }

 private:
  const uint16_t* wa_;
  const uint16_t* wb_;
  int t_;
};

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether a fixed k split (the params' k_split) is one the kernels take.
bool KSplitValid(int32_t k_split, int64_t k) {
  if (k_split == 0 || k_split == 1) return true;
  const int64_t kblocks = (k + kKBlock - 1) / kKBlock;
  return (k_split == 2 || k_split == 4 || k_split == mma_tile::kWarps) && 2 * k_split <= kblocks;
}

}  // namespace

bool Bf16MmaGemmAvailable() {
  static const bool available =
      mma_tile::GroupedKernelHasMmaCode<Bf16Format, Bf16MmaGroupedGemmParams>();
  return available;
}

bool Bf16MmaGroupedGemmSupports(const Bf16MmaGroupedGemmParams& p) {
  return p.num_groups >= 1 && p.max_rows >= 0 && p.n >= 1 && p.k >= 1 && p.n <= kIntMax &&
         p.k % 8 == 0 && std::min(p.num_groups, p.max_rows) <= 65535 && p.offsets != nullptr &&
         p.a != nullptr && Aligned16(p.a) && p.weights != nullptr && p.c != nullptr &&
         KSplitValid(p.k_split, p.k) && !(p.tile.rows_by_group && p.tile.wide) &&
         Bf16MmaGemmAvailable();
}

cudaError_t Bf16MmaGroupedGemm(const Bf16MmaGroupedGemmParams& p, cudaStream_t stream) {
  if (!Bf16MmaGroupedGemmSupports(p)) return cudaErrorInvalidValue;
  if (p.max_rows == 0) return cudaSuccess;
  if (p.tile.all_rows) return mma_tile::LaunchGroupedAllRows<Bf16Format>(p, p.k_split, stream);
  if (p.tile.rows_by_group) {
    return mma_tile::LaunchGroupedTileByRows<Bf16Format>(p, p.k_split, stream);
  }
  return mma_tile::LaunchGroupedTile<Bf16Format>(p, p.k_split, stream);
}

}  // namespace kernels
}  // namespace deepinfer
