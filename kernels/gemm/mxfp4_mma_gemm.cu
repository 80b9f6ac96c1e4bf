// MXFP4 weights on bf16 tensor cores: see mxfp4_mma_gemm.h. The tile loop is
// mma_weight_tile.cuh's; this file has the MXFP4 weight format and the launch.
//
// Chunks: thread t's two chunks of k block kb are k kb * 128 + 32 t + 16 c .. + 15 (c = 0, 1):
// its 32 values are one scale block, 16 bytes of a weight row, loaded at once, with one scale
// byte per row. Sub-step s of chunk c takes the chunk's values 4s .. 4s + 3, bytes 2s and 2s + 1
// of the chunk's 8: the low nibbles (values 4s, 4s + 2) are the even pair of the fragment, the
// high nibbles (4s + 1, 4s + 3) the odd pair.
//
// Widening: a nibble's three magnitude bits moved to a bf16's bits 8..6 make its exponent field
// the e2m1 exponent and its top mantissa bit the e2m1 one: the value times 2^-126 (e2m1's
// subnormal 0.5 becomes the bf16 subnormal 2^-127). Multiplying by 2^(b - 1) (b the scale byte)
// gives e2m1 * 2^(b - 127); 2^(b - 1) is a bf16 value up to b = 128, above that the product is
// taken in two exact steps (2^127, then 2^(b - 128)).
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>

#include "kernels/common/streaming_load.cuh"
#include "kernels/gemm/mma_grouped_kernel.cuh"
#include "kernels/gemm/mma_weight_tile.cuh"
#include "kernels/gemm/mxfp4_mma_gemm.h"

namespace deepinfer {
namespace kernels {
namespace {

using mma_tile::kKBlock;
constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr uint32_t kOnePair = 0x3F803F80u;  // bf16x2 (1, 1)

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// bf16x2 with exponent field f in both halves (2^(f - 127)).
__device__ __forceinline__ uint32_t Pow2Pair(uint32_t f) { return (f << 7) | (f << 23); }

// mma_tile's weight format for MXFP4 (mxfp4_mma_gemm.h's layout).
class Mxfp4Format {
 public:
  struct Matrix {
    const uint8_t* w;
    int64_t ldw;  // bytes
    const uint8_t* scales;
    int64_t scale_ld;
  };
  struct Raw {
    uint4 w[2];                    // rows fa, fb: the thread's 32 values of the block
    uint32_t first[2], second[2];  // each row's scale as one or two bf16x2 powers of two
  };
  static constexpr bool kBlockScaled = false;

  Mxfp4Format() = default;
  __device__ Mxfp4Format(const Matrix& m, int64_t fa, int64_t fb, int t)
      : wa_(m.w + fa * m.ldw + 16 * t),
        wb_(m.w + fb * m.ldw + 16 * t),
        sa_(m.scales + fa * m.scale_ld + t),
        sb_(m.scales + fb * m.scale_ld + t),
        t_(t) {}
  __device__ static Matrix GroupMatrix(const Mxfp4MmaGroupedGemmParams& p, int group) {
    return {p.weights[group], p.k / 2, p.scales[group], p.scale_ld};
  }
  __device__ static int64_t ChunkK(int64_t kb, int c, int t) {
    return kb * kKBlock + 32 * t + 16 * c;
  }
  // k is a multiple of 32: the thread's scale block is in range or wholly past k.
  __device__ static bool ChunkOk(int64_t kb, int c, int t, int64_t k) {
    return kb * kKBlock + 32 * t < k;
  }
  static constexpr int kHalfStride = 8;
  __device__ static bool HalfOk(int64_t kb, int c, int t, int, int64_t k) {
    return ChunkOk(kb, c, t, k);
  }
  __device__ void Load(int64_t kb, int64_t k, Raw* r) const {
    const bool ok = ChunkOk(kb, 0, t_, k);
    r->w[0] = ok ? LoadStreaming16(wa_ + kb * (kKBlock / 2)) : make_uint4(0, 0, 0, 0);
    r->w[1] = ok ? LoadStreaming16(wb_ + kb * (kKBlock / 2)) : make_uint4(0, 0, 0, 0);
    LoadScales(kb, ok, r);
  }
  __device__ void Fragment(const Raw& r, int c, int s, uint32_t af[4]) const {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      // Bytes 2s and 2s + 1 of the chunk to bytes 0 and 2.
      const uint32_t y = __byte_perm(Word(r.w[i], 2 * c + s / 2), 0, (s & 1) ? 0x4342 : 0x4140);
      uint32_t even = ((y & 0x00070007u) << 6) | ((y & 0x00080008u) << 12);
      uint32_t odd = ((y & 0x00700070u) << 2) | ((y & 0x00800080u) << 8);
      even = mma_tile::TimesPow2(even, r.first[i]);
      odd = mma_tile::TimesPow2(odd, r.first[i]);
      if (r.second[i] != kOnePair) {
        even = mma_tile::TimesPow2(even, r.second[i]);
        odd = mma_tile::TimesPow2(odd, r.second[i]);
      }
      af[i] = even;
      af[2 + i] = odd;
    }
  }

 private:
  // Rows fa, fb's scale bytes of block kb as first / second (past k: byte 127, a factor of 1).
  __device__ void LoadScales(int64_t kb, bool ok, Raw* r) const {
    const uint32_t b[2] = {ok ? __ldg(sa_ + kb * (kKBlock / 32)) : 127u,
                           ok ? __ldg(sb_ + kb * (kKBlock / 32)) : 127u};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      r->first[i] = Pow2Pair(min(b[i] + 126u, 254u));
      r->second[i] = b[i] > 128u ? Pow2Pair(b[i] - 1u) : kOnePair;
    }
  }

  const uint8_t* wa_;
  const uint8_t* wb_;
  const uint8_t* sa_;
  const uint8_t* sb_;
  int t_;
};

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool Mxfp4MmaGemmAvailable() {
  static const bool available =
      mma_tile::GroupedKernelHasMmaCode<Mxfp4Format, Mxfp4MmaGroupedGemmParams>();
  return available;
}

bool Mxfp4MmaGroupedGemmSupports(const Mxfp4MmaGroupedGemmParams& p) {
  return p.num_groups >= 1 && p.max_rows >= 0 && p.n >= 1 && p.k >= 1 && p.n <= kIntMax &&
         p.k % kMxfp4BlockSize == 0 && std::min(p.num_groups, p.max_rows) <= 65535 &&
         p.offsets != nullptr && p.a != nullptr && Aligned16(p.a) && p.weights != nullptr &&
         p.scales != nullptr && p.c != nullptr && p.scale_ld >= p.k / kMxfp4BlockSize &&
         Mxfp4MmaGemmAvailable();
}

cudaError_t Mxfp4MmaGroupedGemm(const Mxfp4MmaGroupedGemmParams& p, cudaStream_t stream) {
  if (!Mxfp4MmaGroupedGemmSupports(p)) return cudaErrorInvalidValue;
  if (p.max_rows == 0) return cudaSuccess;
  return mma_tile::LaunchGroupedTile<Mxfp4Format>(p, /*k_split=*/0, stream);
}

}  // namespace kernels
}  // namespace deepinfer
