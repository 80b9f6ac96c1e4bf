// MXFP4 weights times e4m3 activations on FP8 tensor cores: see mxfp4_w4a8_gemm.h. The block and
// reduction structure is mma_weight_tile.cuh's (8 warps = feature tiles x k-slices, the k-slices'
// partial sums added in warp order in shared memory, one block row per non-empty group), the
// inner loop its own.
//
// k order: thread t of a quad takes values 8t .. 8t + 7 of each 32-value scale block (one 32-bit
// word of a weight row: nibble 2i + h of the word is value 8t + 2i + h). The even values (low
// nibbles) become A registers 0 and 1 (weight rows g, g + 8) and B register 0 (activation row g,
// its 8 bytes split by byte permutes), the odd values (high nibbles) A registers 2 and 3 and B
// register 1, byte i of each holding value 8t + 2i (+ 1). The MMA pairs A and B bytes at the same
// register and byte of the same thread index with the same k (the fragment layouts of the 8-bit
// m16n8k32 shape), so each weight value meets the activation of its own k: the MMA's sum over the
// block is the same sum in another order, whatever k order the layout gives those places.
//
// Scale: the MMA's fp32 sum over one block is exact products of e2m1 * 2^-6 and e4m3 codes. It is
// multiplied by 2^6 times the activation's block scale (fp32: Fp8QuantizeRows' scales are at most
// FLT_MAX / 448), then fused-multiply-added times the weight's 2^(b - 127) (b = 0: the fp32
// subnormal 2^-127), a power of two, so only a result beyond fp32's range overflows.
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>

#include "kernels/common/nonempty_group.cuh"
#include "kernels/gemm/mma_grouped_kernel.cuh"
#include "kernels/gemm/mma_weight_tile.cuh"
#include "kernels/gemm/mxfp4_w4a8_gemm.h"

namespace deepinfer {
namespace kernels {
namespace {

using mma_tile::kKBlock;
using mma_tile::kThreads;
using mma_tile::kTile;
using mma_tile::kWarps;
constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int kBlocksPerStep = kKBlock / 32;  // scale blocks (MMAs) per 128-wide k step

__device__ __forceinline__ void MmaE4m3(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// The even (low) nibbles of w's bytes as e4m3 bytes: magnitude bits 2..0 to bits 4..2, sign bit 3
// to bit 7.
__device__ __forceinline__ uint32_t EvenE4m3(uint32_t w) {
  return ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u);
}
// The odd (high) nibbles: magnitude bits 6..4 to 4..2, the sign already at bit 7.
__device__ __forceinline__ uint32_t OddE4m3(uint32_t w) {
  return ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);
}

// 2^(b - 127) in fp32 for a UE8M0 byte b < 255 (b = 0: the subnormal 2^-127).
__device__ __forceinline__ float Pow2Scale(uint32_t b) {
  return __int_as_float(b == 0 ? 0x00400000u : b << 23);
}

// One thread's weights of a 128-wide k step: rows fa, fb, one word per block, and the rows' four
// scale bytes (block j in bits 8j .. 8j + 7).
struct Step {
  uint32_t wa[kBlocksPerStep], wb[kBlocksPerStep];
  uint32_t sa, sb;
};

// A row's four scale bytes of step kb (blocks past k: byte 127): one 32-bit load where the
// group's scale rows are 4-byte aligned (scale_ld a multiple of 4: the word stays in the row).
__device__ __forceinline__ uint32_t LoadScaleBytes(const uint8_t* s, int64_t kb, int64_t k,
                                                   bool words) {
  if (words) {
    return kb * kKBlock < k ? __ldg(reinterpret_cast<const uint32_t*>(s + kb * kBlocksPerStep))
                            : 0x7F7F7F7Fu;
  }
  uint32_t r = 0;
#pragma unroll
  for (int j = 0; j < kBlocksPerStep; ++j) {
    const uint32_t b = kb * kKBlock + 32 * j < k ? __ldg(s + kb * kBlocksPerStep + j) : 127u;
    r |= b << (8 * j);
  }
  return r;
}

// Blocks past k load zero words (their MMAs are skipped).
__device__ __forceinline__ void LoadStep(const uint32_t* wa, const uint32_t* wb, const uint8_t* sa,
                                         const uint8_t* sb, bool scale_words, int64_t kb, int64_t k,
                                         Step* s) {
#pragma unroll
  for (int j = 0; j < kBlocksPerStep; ++j) {
    const bool ok = kb * kKBlock + 32 * j < k;
    // Word t of block kb * 4 + j: the row's words (kb * 4 + j) * 4 + t (wa, wb point at word t).
    s->wa[j] = ok ? __ldg(wa + (kb * kBlocksPerStep + j) * 4) : 0u;
    s->wb[j] = ok ? __ldg(wb + (kb * kBlocksPerStep + j) * 4) : 0u;
  }
  s->sa = LoadScaleBytes(sa, kb, k, scale_words);
  s->sb = LoadScaleBytes(sb, kb, k, scale_words);
}

// Passes of up to 8 NT activation rows over the block's group; grid x = blocks of kWarps /
// ks_count feature tiles of 16 rows, y = the non-empty groups.
template <int NT>
__global__ void __launch_bounds__(kThreads)
    W4a8GroupedKernel(Mxfp4W4a8GroupedGemmParams p, int ks_count) {
  __shared__ float red[kWarps][kTile][8 * NT];
  __shared__ int work[3];
  FindNonEmptyGroup(p.num_groups, p.max_rows, p.offsets, work);
  const int group = work[0];
  const int64_t row_begin = work[1], row_end = work[2];
  if (row_begin >= row_end) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int fb_count = kWarps / ks_count, fb = warp / ks_count, ks = warp % ks_count;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * fb_count;
  const int64_t f0 = (tile0 + fb) * kTile;
  const int64_t n = p.n, k = p.k;
  // The group's activation scales: block kb of the group's row i at as[kb * count + i].
  const int64_t first = p.offsets[group], count = p.offsets[group + 1] - first;
  const float* as = p.a_scales + first * ((k + kKBlock - 1) / kKBlock);
  int64_t kb0, kb1;
  mma_tile::KSlice(k, ks, ks_count, &kb0, &kb1);
  const bool active = f0 < n && kb0 < kb1;
  const int64_t fa = min(f0 + g, n - 1), fbr = min(f0 + g + 8, n - 1);
  const uint8_t* w = p.weights[group];
  const uint8_t* sc = p.scales[group];
  const uint32_t* wa = reinterpret_cast<const uint32_t*>(w + fa * (k / 2)) + t;
  const uint32_t* wb = reinterpret_cast<const uint32_t*>(w + fbr * (k / 2)) + t;
  const uint8_t* sa = sc + fa * p.scale_ld;
  const uint8_t* sb = sc + fbr * p.scale_ld;
  const bool scale_words = p.scale_ld % 4 == 0 && reinterpret_cast<uintptr_t>(sc) % 4 == 0;

  for (int64_t row0 = row_begin; row0 < row_end; row0 += 8 * NT) {
    float acc[1][NT][4];
    mma_tile::ZeroAcc<NT, 1>(acc);
    if (active) {
      // B rows (row g of each 8-row tile) and the C columns' rows 2t, 2t + 1 (their scales), rows
      // at or past row_end reading row_end - 1 (their sums unused).
      const uint8_t* arow[NT];
      int srow[NT][2];  // rows within the group (max_rows is an int)
#pragma unroll
      for (int jt = 0; jt < NT; ++jt) {
        arow[jt] = p.a + min(row0 + 8 * jt + g, row_end - 1) * k + 8 * t;
        srow[jt][0] = static_cast<int>(min(row0 + 8 * jt + 2 * t, row_end - 1) - first);
        srow[jt][1] = static_cast<int>(min(row0 + 8 * jt + 2 * t + 1, row_end - 1) - first);
      }
      // Weights one step ahead of their MMAs, two with one 8-row tile (the registers allow it
      // there within two blocks an SM).
      constexpr bool kTwoAhead = NT == 1;
      Step cur, next, after;
      LoadStep(wa, wb, sa, sb, scale_words, kb0, k, &cur);
      if (kTwoAhead && kb0 + 1 < kb1) LoadStep(wa, wb, sa, sb, scale_words, kb0 + 1, k, &next);
      for (int64_t kb = kb0; kb < kb1; ++kb) {
        if (kTwoAhead) {
          if (kb + 2 < kb1) LoadStep(wa, wb, sa, sb, scale_words, kb + 2, k, &after);
        } else if (kb + 1 < kb1) {
          LoadStep(wa, wb, sa, sb, scale_words, kb + 1, k, &next);
        }
        const float* step_scales = as + kb * count;
        float ascale[NT][2];
#pragma unroll
        for (int jt = 0; jt < NT; ++jt) {
          ascale[jt][0] = 64.0f * __ldg(step_scales + srow[jt][0]);
          ascale[jt][1] = 64.0f * __ldg(step_scales + srow[jt][1]);
        }
#pragma unroll
        for (int j = 0; j < kBlocksPerStep; ++j) {
          if (kb * kKBlock + 32 * j >= k) break;
          const uint32_t af[4] = {EvenE4m3(cur.wa[j]), EvenE4m3(cur.wb[j]), OddE4m3(cur.wa[j]),
                                  OddE4m3(cur.wb[j])};
          const float pa = Pow2Scale((cur.sa >> (8 * j)) & 0xFFu),
                      pb = Pow2Scale((cur.sb >> (8 * j)) & 0xFFu);
#pragma unroll
          for (int jt = 0; jt < NT; ++jt) {
            const uint2 v = __ldg(reinterpret_cast<const uint2*>(arow[jt] + kb * kKBlock + 32 * j));
            float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            MmaE4m3(part, af, __byte_perm(v.x, v.y, 0x6420), __byte_perm(v.x, v.y, 0x7531));
            acc[0][jt][0] = fmaf(part[0] * ascale[jt][0], pa, acc[0][jt][0]);
            acc[0][jt][1] = fmaf(part[1] * ascale[jt][1], pa, acc[0][jt][1]);
            acc[0][jt][2] = fmaf(part[2] * ascale[jt][0], pb, acc[0][jt][2]);
            acc[0][jt][3] = fmaf(part[3] * ascale[jt][1], pb, acc[0][jt][3]);
          }
        }
        cur = next;
        if (kTwoAhead) next = after;
      }
    }
    mma_tile::StoreFragments<NT, 1>(acc, red[warp]);
    __syncthreads();
    mma_tile::ReduceAndStore<NT, 1>(red, fb_count, ks_count, tile0, row0, row_end, n, p.c, n,
                                    false);
    __syncthreads();
  }
}

template <int NT>
cudaError_t LaunchRows(const Mxfp4W4a8GroupedGemmParams& p, cudaStream_t stream) {
  int ks = 1;
  const dim3 grid = mma_tile::GroupedGrid(p, p.k_split, kTile, &ks);
  W4a8GroupedKernel<NT><<<grid, kThreads, 0, stream>>>(p, ks);
  return cudaGetLastError();
}

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

bool Mxfp4W4a8GemmAvailable() {
  static const bool available = [] {
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, W4a8GroupedKernel<1>) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return attr.binaryVersion >= 89 && attr.ptxVersion >= 89;
  }();
  return available;
}

bool Mxfp4W4a8GroupedGemmSupports(const Mxfp4W4a8GroupedGemmParams& p) {
  const bool split_ok =
      p.k_split == 0 || p.k_split == 1 || p.k_split == 2 || p.k_split == 4 || p.k_split == 8;
  return p.num_groups >= 1 && p.max_rows >= 0 && p.n >= 1 && p.k >= 32 && p.n <= kIntMax &&
         p.k % 32 == 0 && std::min(p.num_groups, p.max_rows) <= 65535 && split_ok &&
         p.offsets != nullptr && p.a != nullptr && Aligned(p.a, 8) && p.a_scales != nullptr &&
         p.weights != nullptr && p.scales != nullptr && p.c != nullptr && p.scale_ld >= p.k / 32 &&
         Mxfp4W4a8GemmAvailable();
}

cudaError_t Mxfp4W4a8GroupedGemm(const Mxfp4W4a8GroupedGemmParams& p, cudaStream_t stream) {
  if (!Mxfp4W4a8GroupedGemmSupports(p)) return cudaErrorInvalidValue;
  if (p.max_rows == 0) return cudaSuccess;
  const int hint = p.rows_per_group_hint > 0 ? p.rows_per_group_hint : p.max_rows;
  switch (mma_tile::RowTiles(hint)) {
    case 1:
      return LaunchRows<1>(p, stream);
    case 2:
      return LaunchRows<2>(p, stream);
    default:
      return LaunchRows<4>(p, stream);
  }
}

}  // namespace kernels
}  // namespace deepinfer
