// The tiled FP8-weight GEMM: see fp8_tiled_gemm.h.
//
// Shared memory, per stage: the weight tile [128 rows][128 bytes] then, after all stages' weight
// tiles, the activation tiles [BM rows][256 bytes], both in 16-byte chunks with the chunk index
// XOR-swizzled by the row so that the fragment reads are free of bank conflicts:
//  * weights: thread (g, t) of a warp reads 8 bytes, k 32 q + 8 t of rows r (g of a 16-row tile)
//    and r + 8, i.e. chunk 2 q + t / 2; chunk c of row r sits at c ^ 2 (r % 4), so a half-warp's
//    rows g = 0..3 hit 8 distinct chunks (128 bytes, every bank once);
//  * activations: thread (g, t) reads 16 bytes, k 32 q + 8 t of row 8 j + g, i.e. chunk 4 q + t;
//    chunk c of row r sits at c ^ 4 (r % 2), so a quarter-warp's rows g = 0, 1 use opposite
//    halves of the banks.
// Fragments of a 32-k step q (two MMA k steps s = 0, 1): the thread's 8 weight bytes e0..e7 of a
// row widen to the pairs (e0, e2), (e1, e3) (step 0) and (e4, e6), (e5, e7) (step 1) as the MMA's
// k (2t, 2t+1) and (2t+8, 2t+9); its 8 activations of a row are paired the same way.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <limits>

#include "kernels/common/cp_async.cuh"
#include "kernels/gemm/fp8_tiled_gemm.h"
#include "kernels/gemm/mma_weight_tile.cuh"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kBN = 128;  // weight rows a block
constexpr int kBK = 128;  // k a stage: one scale block
constexpr int kWarpsM = 2, kWarpsN = 4;
constexpr int kWarpWeights = kBN / kWarpsN;  // 32 weight rows a warp
constexpr int kMT = kWarpWeights / 16;       // its 16-row MMA tiles
constexpr int kWeightStageBytes = kBN * kBK;
constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kTargetBlocks = 132;  // one per SM of the H200 at one row tile

// Stages of the cp.async pipeline (96, 128 and 192 KiB of shared memory at 32, 64 and 128 rows)
// and blocks an SM should fit: two at 32 rows, one at 64 and 128 (ptxas for sm_90: 114, 153 and
// 237 registers a thread; 64 rows capped at 128 registers spill).
constexpr int kStages = 4;
__host__ __device__ constexpr int MinBlocks(int bm) { return bm == 32 ? 2 : 1; }
__host__ __device__ constexpr int ActStageBytes(int bm) { return bm * kBK * 2; }
__host__ __device__ constexpr size_t SmemBytes(int bm) {
  return static_cast<size_t>(kStages) * (kWeightStageBytes + ActStageBytes(bm));
}

// Byte offsets of chunk c of row r in a stage (see the file comment).
__device__ __forceinline__ int WeightOffset(int r, int c) {
  return (r * 8 + (c ^ ((r & 3) << 1))) * 16;
}
__device__ __forceinline__ int ActOffset(int r, int c) {
  return (r * 16 + (c ^ ((r & 1) << 2))) * 16;
}

// k block kb's weight and activation tiles into stage memory ws, as (zeros past n, m and k).
template <int BM>
__device__ __forceinline__ void LoadStage(const Fp8TiledGemmParams& p, int64_t m0, int64_t n0,
                                          int64_t kb, uint8_t* ws, uint8_t* as) {
  const int64_t k0 = kb * kBK;
#pragma unroll
  for (int u = 0; u < kBN * 8 / kThreads; ++u) {
    const int e = threadIdx.x + u * kThreads, r = e >> 3, c = e & 7;
    const bool ok = n0 + r < p.n && k0 + 16 * c < p.k;
    const uint8_t* src = ok ? p.w.data + (n0 + r) * p.w.ldw + k0 + 16 * c : p.w.data;
    CpAsync16(ws + WeightOffset(r, c), src, ok);
  }
#pragma unroll
  for (int u = 0; u < BM * 16 / kThreads; ++u) {
    const int e = threadIdx.x + u * kThreads, r = e >> 4, c = e & 15;
    const bool ok = m0 + r < p.m && k0 + 8 * c < p.k;
    const uint16_t* src = ok ? p.a + (m0 + r) * p.lda + k0 + 8 * c : p.a;
    CpAsync16(as + ActOffset(r, c), src, ok);
  }
}

// part += the warp's weight rows wr0 + [0, 32) times its activation rows ar0 + [0, BM / 2) over
// one staged k block.
template <int NT>
__device__ __forceinline__ void MultiplyStage(const uint8_t* ws, const uint8_t* as, int wr0,
                                              int ar0, float part[kMT][NT][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t af[kMT][2][4];
#pragma unroll
    for (int i = 0; i < kMT; ++i) {
      const int r = wr0 + 16 * i + g, c = 2 * q + (t >> 1), b = 8 * (t & 1);
      const uint2 w0 = *reinterpret_cast<const uint2*>(ws + WeightOffset(r, c) + b);
      const uint2 w1 = *reinterpret_cast<const uint2*>(ws + WeightOffset(r + 8, c) + b);
      mma_tile::WidenFp8x4(w0.x, &af[i][0][0], &af[i][0][2]);
      mma_tile::WidenFp8x4(w1.x, &af[i][0][1], &af[i][0][3]);
      mma_tile::WidenFp8x4(w0.y, &af[i][1][0], &af[i][1][2]);
      mma_tile::WidenFp8x4(w1.y, &af[i][1][1], &af[i][1][3]);
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const uint4 x = *reinterpret_cast<const uint4*>(as + ActOffset(ar0 + 8 * j + g, 4 * q + t));
      const uint32_t b[2][2] = {{__byte_perm(x.x, x.y, 0x5410), __byte_perm(x.x, x.y, 0x7632)},
                                {__byte_perm(x.z, x.w, 0x5410), __byte_perm(x.z, x.w, 0x7632)}};
#pragma unroll
      for (int s = 0; s < 2; ++s) {
#pragma unroll
        for (int i = 0; i < kMT; ++i) mma_tile::MmaBf16(part[i][j], af[i][s], b[s][0], b[s][1]);
      }
    }
  }
}

// grid x: row tiles of BM, y: weight tiles of 128 rows, z: k ranges. With one range the sums go
// to c (onto it with accumulate), else to workspace[z][m][n].
template <int BM>
__global__ void __launch_bounds__(kThreads, MinBlocks(BM)) Fp8TiledKernel(Fp8TiledGemmParams p) {
  constexpr int NT = BM / kWarpsM / 8;
  extern __shared__ uint4 smem[];
  uint8_t* const w_stages = reinterpret_cast<uint8_t*>(smem);
  uint8_t* const a_stages = w_stages + kStages * kWeightStageBytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wr0 = (warp % kWarpsN) * kWarpWeights, ar0 = (warp / kWarpsN) * (BM / kWarpsM);
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * BM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kBN;
  // k range z of Z: blocks [z * blocks / Z, (z + 1) * blocks / Z), none empty (Z <= blocks).
  const int64_t blocks = (p.k + kBK - 1) / kBK;
  const int64_t kb0 = blockIdx.z * blocks / gridDim.z;
  const int nk = static_cast<int>((blockIdx.z + 1) * blocks / gridDim.z - kb0);

  // The scale rows of the thread's weight rows wr0 + 16 i + g (+ 8), as offsets (the scale grid
  // has fewer than 2^31 entries: Fp8TiledGemmSupports).
  int srow[kMT][2];
#pragma unroll
  for (int i = 0; i < kMT; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t f = min(n0 + wr0 + 16 * i + g + 8 * h, p.n - 1);
      srow[i][h] = static_cast<int>(Fp8ScaleRow(f, p.w.split_rows) * p.w.scale_ld);
    }
  }
  float acc[kMT][NT][4];
#pragma unroll
  for (int i = 0; i < kMT; ++i) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;
    }
  }

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nk) {
      LoadStage<BM>(p, m0, n0, kb0 + s, w_stages + s * kWeightStageBytes,
                    a_stages + s * ActStageBytes(BM));
    }
    CpAsyncCommit();
  }
  for (int it = 0; it < nk; ++it) {
    CpAsyncWait<kStages - 2>();  // stage `it` has landed (for this thread's copies)
    __syncthreads();             // for every thread's; and the stage refilled below is free
    const int next = it + kStages - 1;
    if (next < nk) {
      const int slot = next % kStages;
      LoadStage<BM>(p, m0, n0, kb0 + next, w_stages + slot * kWeightStageBytes,
                    a_stages + slot * ActStageBytes(BM));
    }
    CpAsyncCommit();
    const int64_t kb = kb0 + it;
    float scale[kMT][2];
#pragma unroll
    for (int i = 0; i < kMT; ++i) {
      scale[i][0] = __ldg(p.w.scales + srow[i][0] + kb);
      scale[i][1] = __ldg(p.w.scales + srow[i][1] + kb);
    }
    float part[kMT][NT][4];
#pragma unroll
    for (int i = 0; i < kMT; ++i) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int r = 0; r < 4; ++r) part[i][j][r] = 0.0f;
      }
    }
    const int slot = it % kStages;
    MultiplyStage<NT>(w_stages + slot * kWeightStageBytes, a_stages + slot * ActStageBytes(BM), wr0,
                      ar0, part);
#pragma unroll
    for (int i = 0; i < kMT; ++i) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          acc[i][j][r] = fmaf(part[i][j][r], scale[i][r >> 1], acc[i][j][r]);
        }
      }
    }
  }
  CpAsyncWait<0>();

  const bool direct = gridDim.z == 1;
  float* const out = direct ? p.c : p.workspace + blockIdx.z * p.m * p.n;
  const int64_t ld = direct ? p.ldc : p.n;
#pragma unroll
  for (int i = 0; i < kMT; ++i) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int64_t row = m0 + ar0 + 8 * j + 2 * t + (r & 1);
        const int64_t f = n0 + wr0 + 16 * i + g + 8 * (r >> 1);
        if (row >= p.m || f >= p.n) continue;
        float* o = out + row * ld + f;
        *o = direct && p.accumulate ? *o + acc[i][j][r] : acc[i][j][r];
      }
    }
  }
}

// c[i, j] (+)= the sum of workspace[z][i][j] over the k ranges z in order.
__global__ void AddRangesKernel(Fp8TiledGemmParams p, int ranges) {
  const int64_t total = p.m * p.n, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += stride) {
    float s = p.workspace[e];
    for (int z = 1; z < ranges; ++z) s += p.workspace[z * total + e];
    float* o = p.c + (e / p.n) * p.ldc + e % p.n;
    *o = p.accumulate ? *o + s : s;
  }
}

bool Aligned16(const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; }

// Fp8TiledKernel<BM>'s shared memory raised on the calling thread's device (the devices where
// that is done kept in one bitmask per BM, so that Supports and the launch share the check);
// cudaErrorInvalidValue where the device has less shared memory per block than the tile takes
// (an sm_86 / sm_89 part's 99 KiB takes only BM 32).
template <int BM>
cudaError_t AllowTileSmem() {
  static std::atomic<uint64_t> allowed_on{0};
  return mma_tile::AllowDynamicSmem(reinterpret_cast<const void*>(Fp8TiledKernel<BM>),
                                    SmemBytes(BM), &allowed_on);
}

template <int BM>
cudaError_t LaunchTiles(const Fp8TiledGemmParams& p, int ranges, cudaStream_t stream) {
  const auto kernel = Fp8TiledKernel<BM>;
  const cudaError_t allowed = AllowTileSmem<BM>();
  if (allowed != cudaSuccess) return allowed;
  const dim3 grid(static_cast<unsigned>((p.m + BM - 1) / BM),
                  static_cast<unsigned>((p.n + kBN - 1) / kBN), static_cast<unsigned>(ranges));
  kernel<<<grid, kThreads, SmemBytes(BM), stream>>>(p);
  return cudaGetLastError();
}

// Whether the current device gives a block of Fp8TiledKernel<bm> its shared memory.
bool SmemFits(int bm) {
  const cudaError_t allowed = bm == 32   ? AllowTileSmem<32>()
                              : bm == 64 ? AllowTileSmem<64>()
                                         : AllowTileSmem<128>();
  return allowed == cudaSuccess;
}

bool Available() {
  static const bool available = [] {
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, Fp8TiledKernel<32>) != cudaSuccess) return false;
    return attr.binaryVersion >= 80 && attr.ptxVersion >= 80;
  }();
  return available;
}

}  // namespace

int32_t Fp8TiledBlockRows(int64_t m) { return m <= 32 ? 32 : m <= 64 ? 64 : 128; }

int32_t Fp8TiledKSplit(int64_t n, int64_t k) {
  const int64_t tiles = (n + kBN - 1) / kBN, blocks = (k + kBK - 1) / kBK;
  if (tiles < 1) return 1;
  const int64_t split =
      std::min<int64_t>({kTargetBlocks / tiles, blocks / 2, int64_t{kFp8TiledMaxKSplit}});
  return static_cast<int32_t>(std::max<int64_t>(1, split));
}

int32_t Fp8TiledRanges(const Fp8TiledGemmParams& p) {
  return p.k_split > 0 ? p.k_split : Fp8TiledKSplit(p.n, p.k);
}

size_t Fp8TiledGemmWorkspaceBytes(const Fp8TiledGemmParams& p) {
  const int32_t ranges = Fp8TiledRanges(p);
  return ranges > 1 ? static_cast<size_t>(ranges) * p.m * p.n * sizeof(float) : 0;
}

bool Fp8TiledGemmSupports(const Fp8TiledGemmParams& p) {
  const int64_t blocks = (p.k + kBK - 1) / kBK;
  const int32_t bm = p.block_rows > 0 ? p.block_rows : Fp8TiledBlockRows(p.m);
  if (!(p.m >= 1 && p.n >= 1 && p.k >= 1 && p.m <= kIntMax && p.n <= kIntMax && p.k <= kIntMax &&
        p.k % 16 == 0 && (bm == 32 || bm == 64 || bm == 128) && p.k_split >= 0 &&
        p.k_split <= kFp8TiledMaxKSplit && p.k_split <= blocks && (p.n + kBN - 1) / kBN <= 65535 &&
        p.a != nullptr && Aligned16(p.a) && p.lda >= p.k && p.lda % 8 == 0 && p.w.data != nullptr &&
        Aligned16(p.w.data) && p.w.ldw >= p.k && p.w.ldw % 16 == 0 && p.w.scales != nullptr &&
        p.w.scale_ld >= Fp8ScaleCols(p.k) && p.w.split_rows >= 0 &&
        Fp8ScaleRows(p.n, p.w.split_rows) * p.w.scale_ld <= kIntMax && p.c != nullptr &&
        p.ldc >= p.n)) {
    return false;
  }
  if (Fp8TiledGemmWorkspaceBytes(p) > 0 && p.workspace == nullptr) return false;
  return Available() && SmemFits(bm);
}

cudaError_t Fp8TiledGemm(const Fp8TiledGemmParams& p, cudaStream_t stream) {
  if (!Fp8TiledGemmSupports(p)) return cudaErrorInvalidValue;
  const int32_t ranges = Fp8TiledRanges(p);
  cudaError_t err;
  switch (p.block_rows > 0 ? p.block_rows : Fp8TiledBlockRows(p.m)) {
    case 32:
      err = LaunchTiles<32>(p, ranges, stream);
      break;
    case 64:
      err = LaunchTiles<64>(p, ranges, stream);
      break;
    default:
      err = LaunchTiles<128>(p, ranges, stream);
      break;
  }
  if (err != cudaSuccess || ranges == 1) return err;
  const int64_t total = p.m * p.n;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 1024));
  AddRangesKernel<<<grid, 256, 0, stream>>>(p, ranges);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace deepinfer
