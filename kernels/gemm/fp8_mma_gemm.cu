// FP8 block-scaled weights on bf16 tensor cores: see fp8_mma_gemm.h.
//
// Warp tile: 16 weight rows (output features) x 8 * NT activation rows, over a range of the
// 128-wide k blocks. mma.m16n8k16: A = 16 features x 16 k, B = 16 k x 8 activation rows, C fp32.
// k order: a sum over k does not care in which order its terms come, so each thread of a quad
// loads 16 CONTIGUOUS k values of its rows per 64-wide step (one 16-byte load of FP8 weights per
// weight row, 32 bytes of bf16 activations per activation row), and the fragment registers are
// filled so that thread t's MMA-logical k {2t, 2t+1 | 2t+8, 2t+9} of sub-step s are physical
// 16t + 4s + {0, 2 | 1, 3} for A and B alike: a widened FP8 word gives its even bytes (0, 2) and
// its odd bytes (1, 3) as two bf16 pairs directly, and the activations are paired to match.
//
// Block: 8 warps = fb feature tiles x ks k-slices (fb * ks = 8, ks chosen per launch so the grid
// has about two blocks per SM); the k-slices' partial sums meet in shared memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>

#include "kernels/common/streaming_load.cuh"
#include "kernels/gemm/fp8_mma_gemm.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kTile = 16;               // weight rows per warp tile (the MMA's M)
constexpr int64_t kKBlock = 128;        // k per scale block: two steps of 64
constexpr int64_t kTargetBlocks = 264;  // two per SM of the H200 (132 SMs)
constexpr int64_t kIntMax = std::numeric_limits<int>::max();

__device__ __forceinline__ void MmaBf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// bf16x2 a * 2^120, exact: fma with -0 keeps the sign of a zero product. bf16 arithmetic keeps
// subnormal inputs (PTX has no .ftz for it), and every product here is a normal number.
__device__ __forceinline__ uint32_t TimesTwoTo120(uint32_t a) {
  uint32_t d = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(0x7B807B80u), "r"(0x80008000u));
#endif
  return d;
}

// The e4m3 bytes b0..b3 of w (b0 the lowest) as the bf16 pairs (b0, b2) and (b1, b3), low half
// first. e4m3's 7 magnitude bits moved to a bf16's bits 10..4 make its exponent field the e4m3
// one (bias 7 read as bias 127) and its top mantissa bits the e4m3 ones: the value times 2^-120
// (e4m3 subnormals become bf16 subnormals with the same mantissa), which 2^120 restores.
__device__ __forceinline__ void WidenFp8x4(uint32_t w, uint32_t* even, uint32_t* odd) {
  const uint32_t v = w << 8;
  *even = TimesTwoTo120((v & 0x80008000u) | ((v & 0x7F007F00u) >> 4));
  *odd = TimesTwoTo120((w & 0x80008000u) | ((w & 0x7F007F00u) >> 4));
}

__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);  // nearest even, lo in the low half
  return *reinterpret_cast<const uint32_t*>(&h);
}

// B fragments of activation row `row` for the thread's 16 physical k from kk (zeros if !ok):
// b[s] = {(x[4s], x[4s + 2]), (x[4s + 1], x[4s + 3])}.
template <bool kBf16A>
__device__ __forceinline__ void LoadActivations(const void* a, int64_t lda, int64_t row, int64_t kk,
                                                bool ok, uint32_t b[4][2]) {
  if constexpr (kBf16A) {
    uint4 v0 = make_uint4(0, 0, 0, 0), v1 = v0;
    if (ok) {
      const uint4* p =
          reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a) + row * lda + kk);
      v0 = __ldg(p);
      v1 = __ldg(p + 1);
    }
    const uint32_t x[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      b[s][0] = __byte_perm(x[2 * s], x[2 * s + 1], 0x5410);
      b[s][1] = __byte_perm(x[2 * s], x[2 * s + 1], 0x7632);
    }
  } else {
    float f[16];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (ok)
        v = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(a) + row * lda + kk) +
                  q);
      f[4 * q] = v.x;
      f[4 * q + 1] = v.y;
      f[4 * q + 2] = v.z;
      f[4 * q + 3] = v.w;
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      b[s][0] = PackBf16x2(f[4 * s], f[4 * s + 2]);
      b[s][1] = PackBf16x2(f[4 * s + 1], f[4 * s + 3]);
    }
  }
}

// The thread's FP8 weights of k block kb: step h's 16 bytes of weight rows g (out[h][0]) and
// g + 8 (out[h][1]); zeros past k.
__device__ __forceinline__ void LoadWeightBlock(const uint8_t* wa, const uint8_t* wb, int64_t kb,
                                                int64_t k, int t, uint4 out[2][2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t off = kb * kKBlock + h * 64;
    const bool ok = off + 16 * t < k;
    out[h][0] = ok ? LoadStreaming16(wa + off) : make_uint4(0, 0, 0, 0);
    out[h][1] = ok ? LoadStreaming16(wb + off) : make_uint4(0, 0, 0, 0);
  }
}

// acc (C fragments of NT tiles) = the warp's 16 weight rows from f0 times activation rows
// row0 .. row0 + 8 NT - 1 (rows at or past row_end read row_end - 1, their sums unused) over k
// blocks [kb0, kb1), each block's MMA sum scaled by its weight block's scale.
template <int NT, bool kBf16A>
__device__ __forceinline__ void WarpTile(const uint8_t* w, int64_t ldw, const float* scales,
                                         int64_t scale_ld, int64_t split, int64_t n, int64_t f0,
                                         const void* a, int64_t lda, int64_t row0, int64_t row_end,
                                         int64_t k, int64_t kb0, int64_t kb1, float acc[NT][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
  }
  if (f0 >= n || kb0 >= kb1) return;
  const int64_t fa = min(f0 + g, n - 1), fb = min(f0 + g + 8, n - 1);
  const uint8_t* wa = w + fa * ldw + 16 * t;
  const uint8_t* wb = w + fb * ldw + 16 * t;
  const float* sa = scales + Fp8ScaleRow(fa, split) * scale_ld;
  const float* sb = scales + Fp8ScaleRow(fb, split) * scale_ld;
  int64_t arow[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) arow[j] = min(row0 + 8 * j + g, row_end - 1);

  // Weights are loaded one block ahead of their MMAs.
  uint4 cur[2][2], next[2][2];
  LoadWeightBlock(wa, wb, kb0, k, t, cur);
  for (int64_t kb = kb0; kb < kb1; ++kb) {
    if (kb + 1 < kb1) LoadWeightBlock(wa, wb, kb + 1, k, t, next);
    float part[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) part[j][i] = 0.0f;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t kk = kb * kKBlock + h * 64 + 16 * t;
      const bool ok = kk < k;
      uint32_t bf[NT][4][2];
#pragma unroll
      for (int j = 0; j < NT; ++j) LoadActivations<kBf16A>(a, lda, arow[j], kk, ok, bf[j]);
      const uint32_t ra[4] = {cur[h][0].x, cur[h][0].y, cur[h][0].z, cur[h][0].w};
      const uint32_t rb[4] = {cur[h][1].x, cur[h][1].y, cur[h][1].z, cur[h][1].w};
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint32_t af[4];  // rows g, g + 8 at logical k (2t, 2t+1), then (2t+8, 2t+9)
        WidenFp8x4(ra[s], &af[0], &af[2]);
        WidenFp8x4(rb[s], &af[1], &af[3]);
#pragma unroll
        for (int j = 0; j < NT; ++j) MmaBf16(part[j], af, bf[j][s][0], bf[j][s][1]);
      }
    }
    const float s0 = __ldg(sa + kb), s1 = __ldg(sb + kb);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      acc[j][0] = fmaf(part[j][0], s0, acc[j][0]);
      acc[j][1] = fmaf(part[j][1], s0, acc[j][1]);
      acc[j][2] = fmaf(part[j][2], s1, acc[j][2]);
      acc[j][3] = fmaf(part[j][3], s1, acc[j][3]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      cur[h][0] = next[h][0];
      cur[h][1] = next[h][1];
    }
  }
}

// C fragment (feature g / g + 8, rows 2t, 2t + 1 of tile j) into red[feature][row].
template <int NT>
__device__ __forceinline__ void StoreFragments(const float acc[NT][4], float (*red)[8 * NT]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) red[g + (i >= 2 ? 8 : 0)][8 * j + 2 * t + (i & 1)] = acc[j][i];
  }
}

// The k-slice of warp `ks` of ks_count over ceil(k / 128) blocks: [*kb0, *kb1).
__device__ __forceinline__ void KSlice(int64_t k, int ks, int ks_count, int64_t* kb0,
                                       int64_t* kb1) {
  const int64_t blocks = (k + kKBlock - 1) / kKBlock;
  const int64_t per = (blocks + ks_count - 1) / ks_count;
  *kb0 = min(blocks, ks * per);
  *kb1 = min(blocks, *kb0 + per);
}

template <int NT, bool kBf16A>
__global__ void __launch_bounds__(kThreads) Fp8MmaGemmKernel(Fp8MmaGemmParams p, int ks_count) {
  __shared__ float red[kWarps][kTile][8 * NT];
  const int warp = threadIdx.x >> 5;
  const int fb_count = kWarps / ks_count, fb = warp / ks_count, ks = warp % ks_count;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * fb_count;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * 8 * NT;
  int64_t kb0, kb1;
  KSlice(p.k, ks, ks_count, &kb0, &kb1);
  float acc[NT][4];
  WarpTile<NT, kBf16A>(p.w.data, p.w.ldw, p.w.scales, p.w.scale_ld, p.w.split_rows, p.n,
                       (tile0 + fb) * kTile, p.a, p.lda, row0, p.m, p.k, kb0, kb1, acc);
  StoreFragments<NT>(acc, red[warp]);
  __syncthreads();
  constexpr int kRows = 8 * NT;
  for (int e = threadIdx.x; e < fb_count * kRows * kTile; e += kThreads) {
    const int f = e % kTile, r = (e / kTile) % kRows, tile = e / (kTile * kRows);
    const int64_t j = (tile0 + tile) * kTile + f, i = row0 + r;
    if (j >= p.n || i >= p.m) continue;
    float s = red[tile * ks_count][f][r];
    for (int q = 1; q < ks_count; ++q) s += red[tile * ks_count + q][f][r];
    float* c = p.c + i * p.ldc + j;
    *c = p.accumulate ? *c + s : s;
  }
}

// The block serves the blockIdx.y-th non-empty group: warp 0 finds it in the device offsets
// and leaves {group, first row, end row} in work (end <= first: no such group).
__device__ void FindGroup(const Fp8MmaGroupedGemmParams& p, int work[3]) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int seen = 0;
    bool found = false;
    for (int base = 0; base < p.num_groups && !found; base += 32) {
      const int s = base + lane;
      int b = 0, e = 0;
      if (s < p.num_groups) {
        b = min(p.offsets[s], p.max_rows);
        e = min(p.offsets[s + 1], p.max_rows);
      }
      const unsigned nonempty = __ballot_sync(0xffffffffu, e > b);
      const int rank = static_cast<int>(blockIdx.y) - seen;
      if (rank < __popc(nonempty)) {
        found = true;
        if (e > b && __popc(nonempty & ((1u << lane) - 1u)) == rank) {
          work[0] = s;
          work[1] = b;
          work[2] = e;
        }
      }
      seen += __popc(nonempty);
    }
    if (!found && lane == 0) work[1] = work[2] = 0;
  }
  __syncthreads();
}

template <int NT>
__global__ void __launch_bounds__(kThreads)
    Fp8MmaGroupedKernel(Fp8MmaGroupedGemmParams p, int ks_count) {
  __shared__ float red[kWarps][kTile][8 * NT];
  __shared__ int work[3];
  FindGroup(p, work);
  const int group = work[0];
  const int64_t row_begin = work[1], row_end = work[2];
  if (row_begin >= row_end) return;
  const int warp = threadIdx.x >> 5;
  const int fb_count = kWarps / ks_count, fb = warp / ks_count, ks = warp % ks_count;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * fb_count;
  int64_t kb0, kb1;
  KSlice(p.k, ks, ks_count, &kb0, &kb1);
  const uint8_t* w = p.weights[group];
  const float* scales = p.scales[group];
  constexpr int kRows = 8 * NT;
  for (int64_t row0 = row_begin; row0 < row_end; row0 += kRows) {
    float acc[NT][4];
    WarpTile<NT, true>(w, p.k, scales, p.scale_ld, p.split_rows, p.n, (tile0 + fb) * kTile, p.a,
                       p.k, row0, row_end, p.k, kb0, kb1, acc);
    StoreFragments<NT>(acc, red[warp]);
    __syncthreads();
    for (int e = threadIdx.x; e < fb_count * kRows * kTile; e += kThreads) {
      const int f = e % kTile, r = (e / kTile) % kRows, tile = e / (kTile * kRows);
      const int64_t j = (tile0 + tile) * kTile + f, i = row0 + r;
      if (j >= p.n || i >= row_end) continue;
      float s = red[tile * ks_count][f][r];
      for (int q = 1; q < ks_count; ++q) s += red[tile * ks_count + q][f][r];
      p.c[i * p.n + j] = s;
    }
    __syncthreads();
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// k-slices per feature tile: the fewest that give the grid kTargetBlocks blocks of
// (8 / ks) feature tiles each, without slices left with no k block.
int KSplit(int64_t n, int64_t k, int64_t other_blocks) {
  const int64_t tiles = (n + kTile - 1) / kTile, kblocks = (k + kKBlock - 1) / kKBlock;
  int ks = 1;
  while (ks < kWarps && 2 * ks <= kblocks &&
         (tiles + kWarps / ks - 1) / (kWarps / ks) * other_blocks < kTargetBlocks) {
    ks *= 2;
  }
  return ks;
}

// Whether a fixed k split (Fp8MmaGemmParams::k_split) is one the kernels take.
bool KSplitValid(int32_t k_split, int64_t k) {
  if (k_split == 0 || k_split == 1) return true;
  const int64_t kblocks = (k + kKBlock - 1) / kKBlock;
  return (k_split == 2 || k_split == 4 || k_split == kWarps) && 2 * k_split <= kblocks;
}

int RowTiles(int64_t rows) { return rows <= 8 ? 1 : rows <= 16 ? 2 : 4; }

template <int NT, bool kBf16A>
cudaError_t LaunchDense(const Fp8MmaGemmParams& p, cudaStream_t stream) {
  const int64_t passes = (p.m + 8 * NT - 1) / (8 * NT);
  const int ks = p.k_split > 0 ? p.k_split : KSplit(p.n, p.k, passes);
  const int64_t tiles = (p.n + kTile - 1) / kTile, per_block = kWarps / ks;
  const dim3 grid(static_cast<unsigned>((tiles + per_block - 1) / per_block),
                  static_cast<unsigned>(passes));
  Fp8MmaGemmKernel<NT, kBf16A><<<grid, kThreads, 0, stream>>>(p, ks);
  return cudaGetLastError();
}

template <bool kBf16A>
cudaError_t LaunchDenseRows(const Fp8MmaGemmParams& p, cudaStream_t stream) {
  switch (RowTiles(p.m)) {
    case 1:
      return LaunchDense<1, kBf16A>(p, stream);
    case 2:
      return LaunchDense<2, kBf16A>(p, stream);
    default:
      return LaunchDense<4, kBf16A>(p, stream);
  }
}

}  // namespace

bool Fp8MmaGemmAvailable() {
  static const bool available = [] {
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, Fp8MmaGroupedKernel<1>) != cudaSuccess) return false;
    return attr.binaryVersion >= 80 && attr.ptxVersion >= 80;
  }();
  return available;
}

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
  return p.a_bf16 ? LaunchDenseRows<true>(p, stream) : LaunchDenseRows<false>(p, stream);
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
  const int64_t group_blocks = std::min(p.num_groups, p.max_rows);
  const int ks = p.k_split > 0 ? p.k_split : KSplit(p.n, p.k, group_blocks);
  const int64_t tiles = (p.n + kTile - 1) / kTile, per_block = kWarps / ks;
  const dim3 grid(static_cast<unsigned>((tiles + per_block - 1) / per_block),
                  static_cast<unsigned>(group_blocks));
  const int hint = p.rows_per_group_hint > 0 ? p.rows_per_group_hint : p.max_rows;
  switch (RowTiles(hint)) {
    case 1:
      Fp8MmaGroupedKernel<1><<<grid, kThreads, 0, stream>>>(p, ks);
      break;
    case 2:
      Fp8MmaGroupedKernel<2><<<grid, kThreads, 0, stream>>>(p, ks);
      break;
    default:
      Fp8MmaGroupedKernel<4><<<grid, kThreads, 0, stream>>>(p, ks);
      break;
  }
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace deepinfer
