// BatchInvariantGemmPipelined (batch_invariant_gemm.h): a block computes a tile of `columns`
// output columns (the weights, the MMA's 16-row A side) x `rows` activation rows (the MMA's 8-wide
// B side) over one of the shape's k splits, its 64-wide k steps staged in shared memory by a
// multi-stage cp.async pipeline and read into fragments by ldmatrix. Each warp owns 32 columns x
// rows / 2 rows. The splits of one tile are one thread-block cluster: after the k loop each block
// writes its fp32 partial tile to its own shared memory, and block r adds slice r of the tile over
// the cluster's blocks in rank order (distributed shared memory) and stores it.
//
// One output's sum: for split s (steps [s * steps / S, (s + 1) * steps / S) of ceil(k / 64)), the
// accumulator starts at zero and takes one m16n8k16 MMA per 16 k in increasing k (the standard
// fragment layout, no permutation); then total = p_0, total += p_1, ..., and c = total or c +
// total. Nothing in it depends on the tile, the row count or the row's place in its tile: an MMA's
// output element depends only on its A row and B column, and rows past m and k past the end are
// zeros that every tile adds alike.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/attention/mma_sm80.cuh"
#include "kernels/common/kernel_facts.h"
#include "kernels/gemm/batch_invariant_gemm.h"

namespace deepinfer {
namespace kernels {
namespace {

namespace cg = cooperative_groups;

constexpr int kStepK = 64;                      // k per pipeline step
constexpr int kSmemRowBytes = kStepK * 2 + 16;  // 144: ldmatrix's 8 rows hit distinct banks
constexpr int kWarpsM = 2;                      // warps along the rows; kWarpsN along the columns
constexpr int kMaxSplits = 8;                   // the portable cluster size
// The splits: doubled (up to kMaxSplits) while the shape has fewer than this many tiles of 64
// columns x splits (about one block per SM of the H200 at one row tile) and every split keeps at
// least kMinSplitSteps steps (docs/engine.md). Guesses, not measured crossovers; changing them
// changes the sum order (the bits), never the invariance.
constexpr int64_t kSplitMinBlocks = 128;
constexpr int64_t kMinSplitSteps = 4;
// The tile picked (it changes no bit; `small_m_gemm_bench batch-invariant-tiles` times every
// tile, docs/engine.md "Batch invariance"): up to 64 rows the smallest row tile that holds m,
// 128 columns where that still gives kWideMinBlocks blocks (one a SM), else 64; above 64 rows
// 128 columns, and 128 rows where that gives kTallMinBlocks blocks, else 64.
constexpr int64_t kWideMinBlocks = 132;
constexpr int64_t kTallMinBlocks = 128;
// Rasterization: the blocks walk kGroupRowTiles row tiles down one column tile after another,
// so the blocks in flight share a few activation tiles and each weight tile comes from memory
// about once.
constexpr int64_t kGroupRowTiles = 8;

template <int kWarpsN, int kN8>
struct Pipe {
  static constexpr int kThreads = 32 * kWarpsN * kWarpsM;
  static constexpr int kColumns = 32 * kWarpsN;
  static constexpr int kRows = 8 * kN8 * kWarpsM;
  static constexpr int kStageBytes = (kColumns + kRows) * kSmemRowBytes;
  // As many stages (up to 8) as leave room for two blocks an SM: the small row tiles, whose
  // blocks stream weights, keep more steps in flight.
  static constexpr int kStages =
      (112 * 1024) / kStageBytes < 8 ? (112 * 1024) / kStageBytes : 8;
  static constexpr int kRedPitch = kColumns + 4;  // floats; the fragment writes hit distinct banks
  static constexpr int kRedBytes = kRows * kRedPitch * 4;
  static constexpr int kSmemBytes =
      kStages * kStageBytes > kRedBytes ? kStages * kStageBytes : kRedBytes;
  static_assert(kStages >= 3, "the pipeline keeps two steps in flight behind the one summed");
  static constexpr int kWLoads = kColumns * (kStepK / 8) / kThreads;  // 16-byte copies a stage
  static constexpr int kALoads = (kRows * (kStepK / 8) + kThreads - 1) / kThreads;
};

__device__ __forceinline__ void LdMatrixX2(uint32_t* r, uint32_t addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr)
               : "memory");
#endif
}

// The cluster barrier (release / acquire: the blocks' shared-memory writes before it are
// visible to the cluster after it), and a block's shared-memory address in cluster block `rank`.
// Below sm_90 (the compute_75 PTX, never launched: BatchInvariantGemmPipelinedSupports) nothing.
__device__ __forceinline__ void ClusterSync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cg::this_cluster().sync();
#endif
}

__device__ __forceinline__ const float* InClusterBlock(float* local, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cg::this_cluster().map_shared_rank(local, rank);
#else
  return local;
#endif
}

// Grid: x = tiles * splits (a tile's splits are consecutive blocks, one cluster; the tiles in
// grouped raster order), z = the batch's products.
template <int kWarpsN, int kN8>
__global__ void __launch_bounds__(Pipe<kWarpsN, kN8>::kThreads, 2)
    PipelinedKernel(BatchInvariantGemmParams p, int splits, int64_t row_tiles,
                    int64_t column_tiles) {
  using T = Pipe<kWarpsN, kN8>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t tile = blockIdx.x / splits;
  const int rank = static_cast<int>(blockIdx.x % splits);
  const int64_t per_group = kGroupRowTiles * column_tiles;
  const int64_t first_row_tile = (tile / per_group) * kGroupRowTiles;
  const int64_t group_rows = min(kGroupRowTiles, row_tiles - first_row_tile);
  const int64_t in_group = tile % per_group;
  const int64_t row0 = (first_row_tile + in_group % group_rows) * T::kRows;
  const int64_t col0 = (in_group / group_rows) * T::kColumns;
  const int64_t b = blockIdx.z;
  const uint16_t* a = static_cast<const uint16_t*>(p.a) + b * p.stride_a;
  const uint16_t* w = static_cast<const uint16_t*>(p.w) + b * p.stride_w;
  float* c = p.c + b * p.stride_c;

  const int64_t steps = (p.k + kStepK - 1) / kStepK;
  const int64_t step_begin = rank * steps / splits;
  const int nsteps = static_cast<int>((rank + 1) * steps / splits - step_begin);

  // This thread's copies: 16-byte chunk e % 8 of tile row e / 8 for e = tid + i * kThreads; rows
  // past n or m are zero-filled (their source clamped to a valid address, unread).
  const uint16_t* w_src[T::kWLoads];
  bool w_ok[T::kWLoads];
  int w_dst[T::kWLoads], w_chunk[T::kWLoads];
#pragma unroll
  for (int i = 0; i < T::kWLoads; ++i) {
    const int e = tid + i * T::kThreads, r = e / 8;
    w_chunk[i] = e % 8;
    w_ok[i] = col0 + r < p.n;
    w_src[i] = w + (w_ok[i] ? (col0 + r) * p.ldw : 0) + w_chunk[i] * 8;
    w_dst[i] = r * kSmemRowBytes + w_chunk[i] * 16;
  }
  const uint16_t* a_src[T::kALoads];
  bool a_ok[T::kALoads];
  int a_dst[T::kALoads], a_chunk[T::kALoads];
#pragma unroll
  for (int i = 0; i < T::kALoads; ++i) {
    const int e = tid + i * T::kThreads, r = e / 8;
    a_chunk[i] = e % 8;
    a_ok[i] = e < T::kRows * 8 && row0 + r < p.m;
    a_src[i] = a + (a_ok[i] ? (row0 + r) * p.lda : 0) + a_chunk[i] * 8;
    a_dst[i] = T::kColumns * kSmemRowBytes + r * kSmemRowBytes + a_chunk[i] * 16;
  }
  const uint32_t smem_base = sm80::SharedAddr(smem);
  auto load = [&](int stage, int64_t step) {
    const uint32_t base = smem_base + stage * T::kStageBytes;
    const int64_t k0 = step * kStepK;
#pragma unroll
    for (int i = 0; i < T::kWLoads; ++i) {
      const bool ok = w_ok[i] && k0 + w_chunk[i] * 8 < p.k;
      sm80::CopyAsync16(base + w_dst[i], ok ? w_src[i] + k0 : w, ok);
    }
#pragma unroll
    for (int i = 0; i < T::kALoads; ++i) {
      if (i * T::kThreads + tid < T::kRows * 8) {
        const bool ok = a_ok[i] && k0 + a_chunk[i] * 8 < p.k;
        sm80::CopyAsync16(base + a_dst[i], ok ? a_src[i] + k0 : a, ok);
      }
    }
  };

  // ldmatrix row addresses (stage 0, k 0). A (weights, 16 x 16 per MMA): lane l gives row
  // l % 8 + 8 * ((l / 8) % 2), k 8 * (l / 16) -> registers (rows 0-7 | 8-15) x (k 0-7 | 8-15) in
  // the MMA's a0..a3 order. B (activations, two 8-row tiles per x4): lane l gives row l % 8 +
  // 8 * (l / 16), k 8 * ((l / 8) % 2) -> tile 0's (k 0-7, k 8-15), then tile 1's.
  const int warp_n = warp % kWarpsN, warp_m = warp / kWarpsN;
  uint32_t a_addr[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = warp_n * 32 + i * 16 + lane % 8 + 8 * ((lane / 8) % 2);
    a_addr[i] = smem_base + row * kSmemRowBytes + (lane / 16) * 16;
  }
  const int warp_row0 = warp_m * 8 * kN8;
  const bool warp_has_rows = row0 + warp_row0 < p.m;
  const uint32_t b_addr =
      kN8 == 1 ? smem_base + T::kColumns * kSmemRowBytes +
                     (warp_row0 + lane % 8) * kSmemRowBytes + ((lane / 8) % 2) * 16
               : smem_base + T::kColumns * kSmemRowBytes +
                     (warp_row0 + lane % 8 + 8 * (lane / 16)) * kSmemRowBytes +
                     ((lane / 8) % 2) * 16;

  float acc[2][kN8][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < kN8; ++j)
#pragma unroll
      for (int z = 0; z < 4; ++z) acc[i][j][z] = 0.0f;

#pragma unroll
  for (int s = 0; s < T::kStages - 1; ++s) {
    if (s < nsteps) load(s, step_begin + s);
    sm80::CopyAsyncCommit();
  }
  for (int l = 0; l < nsteps; ++l) {
    sm80::CopyAsyncWait<T::kStages - 2>();
    __syncthreads();
    const int next = l + T::kStages - 1;
    if (next < nsteps) load(next % T::kStages, step_begin + next);
    sm80::CopyAsyncCommit();
    const uint32_t stage = (l % T::kStages) * T::kStageBytes;
    // A warp whose rows all lie past m has nothing to sum (its rows are never stored).
    if (!warp_has_rows) continue;
#pragma unroll
    for (int kk = 0; kk < kStepK / 16; ++kk) {
      uint32_t af[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i) sm80::LdMatrixX4<false>(af[i], a_addr[i] + stage + kk * 32);
      uint32_t bf[kN8][2];
      if (kN8 == 1) {
        LdMatrixX2(bf[0], b_addr + stage + kk * 32);
      } else {
#pragma unroll
        for (int jp = 0; jp < kN8 / 2; ++jp) {
          uint32_t r[4];
          sm80::LdMatrixX4<false>(r, b_addr + stage + jp * 16 * kSmemRowBytes + kk * 32);
          bf[2 * jp][0] = r[0], bf[2 * jp][1] = r[1];
          bf[2 * jp + 1][0] = r[2], bf[2 * jp + 1][1] = r[3];
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < kN8; ++j) sm80::MmaBf16(acc[i][j], af[i], bf[j][0], bf[j][1]);
    }
  }
  sm80::CopyAsyncWait<0>();
  __syncthreads();  // the stages are free for the partial tile

  // The partial tile, red[row][column]. C fragment z: column 16 i + g + 8 (z / 2), row 8 j + 2 t +
  // z % 2 of the warp's tile.
  float* red = reinterpret_cast<float*>(smem);
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < kN8; ++j)
#pragma unroll
      for (int z = 0; z < 4; ++z) {
        const int col = warp_n * 32 + 16 * i + g + 8 * (z / 2);
        const int row = warp_row0 + 8 * j + 2 * t + z % 2;
        red[row * T::kRedPitch + col] = acc[i][j][z];
      }
  if (splits > 1) {
    ClusterSync();  // every block's partial tile is complete and visible to the cluster
  } else {
    __syncthreads();
  }
  // Slice `rank` of the tile's rows x columns, row-major, in groups of 4 consecutive columns
  // (consecutive threads, consecutive groups of c). A group's partials from every split are
  // loaded before any is added, so their distributed-shared-memory latencies overlap; the sum is
  // still p_0 + p_1 + ... in split order.
  constexpr int kGroup = 4;
  static_assert(T::kColumns % kGroup == 0 && T::kRedPitch % kGroup == 0, "float4 groups");
  const float* parts[kMaxSplits];
#pragma unroll
  for (int q = 0; q < kMaxSplits; ++q) {
    parts[q] = q < splits ? (splits > 1 ? InClusterBlock(red, q) : red) : red;
  }
  const bool c_vectors = p.ldc % kGroup == 0 && (p.batch == 1 || p.stride_c % kGroup == 0) &&
                         reinterpret_cast<uintptr_t>(p.c) % 16 == 0;
  const int groups = T::kRows * T::kColumns / kGroup / splits;
  const int valid_rows = static_cast<int>(min(static_cast<int64_t>(T::kRows), p.m - row0));
  for (int e = rank * groups + tid; e < (rank + 1) * groups; e += T::kThreads) {
    const int row = e * kGroup / T::kColumns, col = e * kGroup % T::kColumns;
    if (row >= valid_rows || col0 + col >= p.n) continue;
    const int at = row * T::kRedPitch + col;
    float4 part[kMaxSplits];
#pragma unroll
    for (int q = 0; q < kMaxSplits; ++q) {
      if (q < splits) part[q] = *reinterpret_cast<const float4*>(parts[q] + at);
    }
    float4 sum = part[0];
#pragma unroll
    for (int q = 1; q < kMaxSplits; ++q) {
      if (q < splits) {
        sum.x += part[q].x, sum.y += part[q].y, sum.z += part[q].z, sum.w += part[q].w;
      }
    }
    float* out = c + (row0 + row) * p.ldc + col0 + col;
    if (c_vectors && col0 + col + kGroup <= p.n) {
      float4* out4 = reinterpret_cast<float4*>(out);
      if (p.accumulate) {
        const float4 o = *out4;
        sum.x = o.x + sum.x, sum.y = o.y + sum.y, sum.z = o.z + sum.z, sum.w = o.w + sum.w;
      }
      *out4 = sum;
    } else {
      const float s[kGroup] = {sum.x, sum.y, sum.z, sum.w};
      for (int z = 0; z < kGroup && col0 + col + z < p.n; ++z) {
        out[z] = p.accumulate ? out[z] + s[z] : s[z];
      }
    }
  }
  if (splits > 1) ClusterSync();  // no block leaves while others read its shared memory
}

using KernelFn = void (*)(BatchInvariantGemmParams, int, int64_t, int64_t);

struct Variant {
  int rows, columns;
  KernelFn kernel;
  int smem, threads;
};

template <int kWarpsN, int kN8>
Variant MakeVariant() {
  using T = Pipe<kWarpsN, kN8>;
  return {T::kRows, T::kColumns, PipelinedKernel<kWarpsN, kN8>, T::kSmemBytes, T::kThreads};
}

// Every tile the kernel has: rows 16, 32, 64, 128 x columns 64, 128.
const Variant kVariants[] = {
    MakeVariant<2, 1>(), MakeVariant<2, 2>(), MakeVariant<2, 4>(), MakeVariant<2, 8>(),
    MakeVariant<4, 1>(), MakeVariant<4, 2>(), MakeVariant<4, 4>(), MakeVariant<4, 8>(),
};

const Variant* FindVariant(int rows, int columns) {
  for (const Variant& v : kVariants) {
    if (v.rows == rows && v.columns == columns) return &v;
  }
  return nullptr;
}

constexpr int64_t kIntMax = std::numeric_limits<int>::max();

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// Whether every variant runs clusters of `splits` blocks on the current device (sm_90 code,
// cluster launch, at least one such cluster schedulable); once per (splits, device). Also raises
// each variant's dynamic shared-memory limit (KernelFactsFor).
bool VariantsRun(int splits) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  static std::mutex mu;
  static auto* cache = new std::map<std::pair<int, int>, bool>();
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(splits, device);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  int cluster_launch = 0;
  bool runs = cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device) ==
                  cudaSuccess &&
              cluster_launch != 0;
  for (const Variant& v : kVariants) {
    if (!runs) break;
    const KernelFacts f = KernelFactsFor(reinterpret_cast<const void*>(v.kernel), device, v.smem);
    runs = f.error == cudaSuccess && f.ptx_version >= 90 && f.max_smem >= v.smem;
    if (!runs || splits == 1) continue;
    // Cluster occupancy is asked in relaxed capture mode: the query must not invalidate a capture.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute attr;
    config.gridDim = dim3(static_cast<unsigned>(splits), 1, 1);
    config.blockDim = dim3(static_cast<unsigned>(v.threads), 1, 1);
    config.dynamicSmemBytes = static_cast<size_t>(v.smem);
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(splits);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, v.kernel, &config) != cudaSuccess) {
      cudaGetLastError();
      clusters = 0;
    }
    cudaThreadExchangeStreamCaptureMode(&mode);
    runs = clusters > 0;
  }
  cache->emplace(key, runs);
  return runs;
}

}  // namespace

int BatchInvariantGemmSplits(int64_t batch, int64_t n, int64_t k) {
  const int64_t tiles = batch * ((n + 63) / 64);
  const int64_t steps = (k + kStepK - 1) / kStepK;
  int splits = 1;
  while (splits < kMaxSplits && tiles * splits < kSplitMinBlocks &&
         steps / (2 * splits) >= kMinSplitSteps) {
    splits *= 2;
  }
  return splits;
}

bool BatchInvariantGemmPipelinedSupports(const BatchInvariantGemmParams& p) {
  if (!(p.a_bf16 && p.w_bf16 && p.m >= 1 && p.n >= 1 && p.k >= 0 && p.batch >= 1 &&
        p.m <= kIntMax && p.n <= kIntMax && p.k <= kIntMax && p.batch <= 65535 && p.k % 8 == 0 &&
        p.lda >= p.k && p.ldw >= p.k && p.ldc >= p.n && p.a != nullptr && p.w != nullptr &&
        p.c != nullptr && Aligned16(p.a) && Aligned16(p.w) && p.lda % 8 == 0 && p.ldw % 8 == 0 &&
        (p.batch == 1 || (p.stride_a >= 0 && p.stride_w >= 0 && p.stride_c >= 0 &&
                          p.stride_a % 8 == 0 && p.stride_w % 8 == 0)))) {
    return false;
  }
  return VariantsRun(BatchInvariantGemmSplits(p.batch, p.n, p.k));
}

cudaError_t BatchInvariantGemmPipelined(const BatchInvariantGemmParams& p, cudaStream_t stream,
                                        BatchInvariantGemmTile tile) {
  if (!BatchInvariantGemmPipelinedSupports(p)) return cudaErrorInvalidValue;
  const int splits = BatchInvariantGemmSplits(p.batch, p.n, p.k);
  const int64_t wide_tiles = p.batch * ((p.n + 127) / 128) * splits;  // per row tile
  int rows = tile.rows;
  if (rows == 0) {
    rows = p.m <= 16 ? 16 : p.m <= 32 ? 32 : 64;
    if (p.m > 64 && (p.m + 127) / 128 * wide_tiles >= kTallMinBlocks) rows = 128;
  }
  const int64_t row_tiles = (p.m + rows - 1) / rows;
  int columns = tile.columns;
  if (columns == 0) columns = p.m > 64 || row_tiles * wide_tiles >= kWideMinBlocks ? 128 : 64;
  const Variant* v = FindVariant(rows, columns);
  if (v == nullptr) return cudaErrorInvalidValue;
  const int64_t column_tiles = (p.n + columns - 1) / columns;
  const int64_t blocks = row_tiles * column_tiles * splits;
  if (blocks > kIntMax) return cudaErrorInvalidValue;
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attr;
  config.gridDim =
      dim3(static_cast<unsigned>(blocks), 1, static_cast<unsigned>(p.batch));
  config.blockDim = dim3(static_cast<unsigned>(v->threads), 1, 1);
  config.dynamicSmemBytes = static_cast<size_t>(v->smem);
  config.stream = stream;
  if (splits > 1) {
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(splits);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, v->kernel, p, splits, row_tiles, column_tiles);
}

}  // namespace kernels
}  // namespace deepinfer
