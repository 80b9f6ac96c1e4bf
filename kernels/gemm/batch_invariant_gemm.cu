// The batch-invariant GEMMs (batch_invariant_gemm.h). The tensor-core kernel follows the
// fragment layout of GroupedGemmBf16's tensor-core variant (kernels/moe/grouped_gemm.cu): A = 16
// weight rows x 16 k, B = 16 k x 8 activation rows, each thread loading 8 CONTIGUOUS k values of
// a weight row and of an activation row, the fragment registers filled so that MMA-logical k
// (2t, 2t+1 | 2t+8, 2t+9) of half h maps to physical 8t + 4h + (0, 1 | 2, 3) inside a 32-wide k
// step, for A and B alike (a permutation of k inside each MMA, the same for every row).
// Unlike it, the block's warps split k (a split fixed for every m) for enough blocks and loads
// in flight at few rows.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/common/cp_async.cuh"
#include "kernels/gemm/batch_invariant_gemm.h"

namespace deepinfer {
namespace kernels {
namespace {

// A block: 16 output columns x up to 32 rows, its 8 warps splitting k (warp w takes the 32-wide k
// steps w, w + 8, w + 16, ...), their partial sums added in warp order through shared memory.
// The split is fixed (never chosen by m), so every output has the same sum order at any m.
constexpr int kTcWarps = 8;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kTcColumnsPerBlock = 16;
constexpr int kTcRowsPerBlock = 32;  // passes of 8, 16 or 32 rows (NT = 1, 2, 4 row tiles)

__device__ __forceinline__ void MmaBf16(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ unsigned PackBf16x2(float f0, float f1) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(f0, f1);
  return *reinterpret_cast<const unsigned*>(&h);
}

// The block's columns [col0, col0 + 16 * CT) times rows [row0, row0 + 8 * NT) (rows >= row_end
// read a clamped valid row and are not stored): this warp's k steps, then the sum over warps in
// warp order into c, one 16-column tile after another through red. CT (16-column tiles a block)
// changes only which outputs a block holds: each output's MMAs and sum are the same at every CT.
template <int NT, int CT, bool kBf16A>
__device__ __forceinline__ void TcPass(const BatchInvariantGemmParams& p, const char* a,
                                       const uint16_t* w, float* c, int64_t col0, int64_t row0,
                                       int64_t row_end,
                                       float (*red)[kTcColumnsPerBlock][kTcRowsPerBlock]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint4* wr[CT][2];
#pragma unroll
  for (int x = 0; x < CT; ++x) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t col = min(col0 + x * kTcColumnsPerBlock + half * 8 + g, p.n - 1);
      wr[x][half] = reinterpret_cast<const uint4*>(w + col * p.ldw);
    }
  }
  const size_t a_size = kBf16A ? sizeof(uint16_t) : sizeof(float);
  const char* ar[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int64_t row = min(row0 + j * 8 + g, row_end - 1);
    ar[j] = a + row * p.lda * a_size;
  }
  float acc[CT][NT][4];
#pragma unroll
  for (int x = 0; x < CT; ++x)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[x][j][i] = 0.0f;

  const int64_t chunks = p.k / 8;  // 8-value chunks per row; step s holds chunks 4s .. 4s + 3
#pragma unroll 2
  for (int64_t step = warp; 4 * step < chunks; step += kTcWarps) {
    const int64_t ch = 4 * step + t;  // this thread's chunk
    const bool ok = ch < chunks;
    uint4 wv[CT][2];
#pragma unroll
    for (int x = 0; x < CT; ++x)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        wv[x][half] = ok ? __ldg(wr[x][half] + ch) : make_uint4(0, 0, 0, 0);
    unsigned b[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if (kBf16A) {
        const uint4 v =
            ok ? __ldg(reinterpret_cast<const uint4*>(ar[j]) + ch) : make_uint4(0, 0, 0, 0);
        b[j][0] = v.x, b[j][1] = v.y, b[j][2] = v.z, b[j][3] = v.w;
      } else {
        float4 v0 = make_float4(0, 0, 0, 0), v1 = v0;
        if (ok) {
          v0 = __ldg(reinterpret_cast<const float4*>(ar[j]) + 2 * ch);
          v1 = __ldg(reinterpret_cast<const float4*>(ar[j]) + 2 * ch + 1);
        }
        b[j][0] = PackBf16x2(v0.x, v0.y);
        b[j][1] = PackBf16x2(v0.z, v0.w);
        b[j][2] = PackBf16x2(v1.x, v1.y);
        b[j][3] = PackBf16x2(v1.z, v1.w);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int x = 0; x < CT; ++x) {
        const unsigned frag[4] = {h ? wv[x][0].z : wv[x][0].x, h ? wv[x][1].z : wv[x][1].x,
                                  h ? wv[x][0].w : wv[x][0].y, h ? wv[x][1].w : wv[x][1].y};
#pragma unroll
        for (int j = 0; j < NT; ++j) MmaBf16(acc[x][j], frag, b[j][2 * h], b[j][2 * h + 1]);
      }
    }
  }
#pragma unroll
  for (int x = 0; x < CT; ++x) {
    if (x > 0) __syncthreads();  // the previous tile's sums have read red
      // C fragment: c0, c1 = (column g, rows 2t, 2t+1); c2, c3 = (column g + 8, same rows).
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        red[warp][g + (i >= 2 ? 8 : 0)][j * 8 + 2 * t + (i % 2)] = acc[x][j][i];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < kTcColumnsPerBlock * 8 * NT; e += kTcThreads) {
      const int col_in = e % kTcColumnsPerBlock, row_in = e / kTcColumnsPerBlock;
      const int64_t col = col0 + x * kTcColumnsPerBlock + col_in, row = row0 + row_in;
      if (col >= p.n || row >= row_end) continue;
      float sum = red[0][col_in][row_in];
#pragma unroll
      for (int q = 1; q < kTcWarps; ++q) sum += red[q][col_in][row_in];
      float* out = c + row * p.ldc + col;
      *out = p.accumulate ? *out + sum : sum;
    }
  }
}

// Grid: x = 32-row tiles, y = tiles of 16 * CT columns, z = the batch's products.
template <int CT, bool kBf16A>
__global__ void __launch_bounds__(kTcThreads)
    BatchInvariantGemmTcKernel(BatchInvariantGemmParams p) {
  __shared__ float red[kTcWarps][kTcColumnsPerBlock][kTcRowsPerBlock];
  const int64_t col0 = int64_t{blockIdx.y} * kTcColumnsPerBlock * CT;
  const int64_t b = blockIdx.z;
  const char* a =
      static_cast<const char*>(p.a) + b * p.stride_a * (kBf16A ? sizeof(uint16_t) : sizeof(float));
  const uint16_t* w = static_cast<const uint16_t*>(p.w) + b * p.stride_w;
  float* c = p.c + b * p.stride_c;
  const int64_t row0 = int64_t{blockIdx.x} * kTcRowsPerBlock;
  const int64_t row_end = min(row0 + kTcRowsPerBlock, p.m);
  const int64_t rows = row_end - row0;
  if (rows > 16) {
    TcPass<4, CT, kBf16A>(p, a, w, c, col0, row0, row_end, red);
  } else if (rows > 8) {
    TcPass<2, CT, kBf16A>(p, a, w, c, col0, row0, row_end, red);
  } else {
    TcPass<1, CT, kBf16A>(p, a, w, c, col0, row0, row_end, red);
  }
}

// The small kernel's column tiles: 32 columns a block (CT = 2) where that still gives this many
// blocks, else 16. The wider tile reads each activation row from L2 once per 32 columns instead
// of once per 16 (at 128 rows the activations, not the weights, are most of a 16-column block's
// bytes); the threshold (about two blocks per SM of the H200; CT = 2 takes 128 registers a
// thread, two blocks an SM) is a guess, not a measured crossover. (64 columns took 179 registers,
// one block an SM.)
constexpr int64_t kTcWideMinBlocks = 256;

// The large tile for many rows: a block owns 128 rows x 64 output columns (8 warps, each 32 rows x
// 32 columns), its k steps staged in shared memory by cp.async. It adds the same products in the
// same order as TcPass: the 32-wide k steps of "warp" q (steps q, q + 8, ...) are one partition,
// the block runs the partitions one after another, each from zero through the same MMAs (the
// same fragment permutation, h = 0 then 1 per step), and adds partition q's sum to the running
// total in order q = 0 .. 7, as TcPass adds red[q]. So every output is bit for bit the value
// TcPass gives, and the kernels may be picked by m.
constexpr int kBigRows = 128;
constexpr int kBigColumns = 64;
constexpr int kBigStages = 3;
constexpr int kBigThreads = 256;
// Large tiles from this many (row tile, column tile, product) blocks: below it the small kernel's
// 8-way k split keeps more loads in flight (about two waves of 132 SMs). And only above one
// small row tile: up to 32 rows the small kernel reads each weight once, as a stream, and the
// large tile would run 128-row MMAs for them.
constexpr int64_t kBigMinBlocks = 264;
constexpr int64_t kBigMinRows = kTcRowsPerBlock + 1;
// Rasterization: the blocks walk kBigGroupRows row tiles down one column tile after another, so
// the blocks in flight share a few activation tiles and weight tiles from L2.
constexpr int64_t kBigGroupRows = 8;

template <bool kBf16A>
struct BigTile {
  static constexpr int kARowBytes = 32 * (kBf16A ? 2 : 4);  // one k step of an activation row
  static constexpr int kWBytes = kBigColumns * 64;
  static constexpr int kStageBytes = kWBytes + kBigRows * kARowBytes;
  static constexpr int kSmemBytes = kBigStages * kStageBytes;
};

// The k step of the l-th position in partition order: partitions q = 0 .. 7 of steps q, q + 8, ...
// (of `steps`), the first steps % 8 holding one step more than the rest.
__device__ __forceinline__ int64_t StepAt(int64_t l, int64_t steps) {
  const int64_t lo = steps / kTcWarps, r = steps % kTcWarps;
  int64_t q, i;
  if (l < r * (lo + 1)) {
    q = l / (lo + 1), i = l % (lo + 1);
  } else {
    const int64_t l2 = l - r * (lo + 1);
    q = r + l2 / lo, i = l2 % lo;
  }
  return q + kTcWarps * i;
}

__device__ __forceinline__ int64_t PartitionSteps(int64_t q, int64_t steps) {
  return q < steps ? (steps - q + kTcWarps - 1) / kTcWarps : 0;
}

template <bool kBf16A>
__global__ void __launch_bounds__(kBigThreads, 2)
    BatchInvariantGemmBigKernel(BatchInvariantGemmParams p, int64_t row_tiles,
                                int64_t column_tiles) {
  using Tile = BigTile<kBf16A>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // Grouped rasterization of blockIdx.x into (row tile, column tile).
  const int64_t pid = blockIdx.x;
  const int64_t per_group = kBigGroupRows * column_tiles;
  const int64_t first_row_tile = (pid / per_group) * kBigGroupRows;
  const int64_t group_rows = min(kBigGroupRows, row_tiles - first_row_tile);
  const int64_t in_group = pid % per_group;
  const int64_t row0 = (first_row_tile + in_group % group_rows) * kBigRows;
  const int64_t col0 = (in_group / group_rows) * kBigColumns;
  const int64_t b = blockIdx.z;
  const size_t a_size = kBf16A ? sizeof(uint16_t) : sizeof(float);
  const char* a = static_cast<const char*>(p.a) + b * p.stride_a * a_size;
  const uint16_t* w = static_cast<const uint16_t*>(p.w) + b * p.stride_w;
  float* c = p.c + b * p.stride_c;

  const int64_t chunks = p.k / 8;
  const int64_t steps = (chunks + 3) / 4;

  // This thread's cp.async sources: one 16-byte piece of a weight row per stage, and 2 (bf16) or
  // 4 (fp32) of activation rows; rows past the end read a clamped valid row (not stored).
  const int w_row = tid / 4, w_chunk = tid % 4;
  const uint16_t* w_src = w + min(col0 + w_row, p.n - 1) * p.ldw;
  constexpr int kAPieces = kBf16A ? 2 : 4;
  constexpr int kPiecesPerRow = kBf16A ? 4 : 8;
  const char* a_src[kAPieces];
#pragma unroll
  for (int i = 0; i < kAPieces; ++i) {
    const int e = tid + i * kBigThreads;
    a_src[i] = a + min(row0 + e / kPiecesPerRow, p.m - 1) * p.lda * a_size;
  }
  auto load = [&](int stage, int64_t step) {
    unsigned char* base = smem + stage * Tile::kStageBytes;
    const int64_t wch = 4 * step + w_chunk;
    CpAsync16(base + w_row * 64 + w_chunk * 16, w_src + (wch < chunks ? wch * 8 : 0), wch < chunks);
    unsigned char* abase = base + Tile::kWBytes;
#pragma unroll
    for (int i = 0; i < kAPieces; ++i) {
      const int e = tid + i * kBigThreads;
      const int row = e / kPiecesPerRow, piece = e % kPiecesPerRow;
      // bf16: a piece is one 8-value chunk; fp32: half of one.
      const int64_t ch = 4 * step + (kBf16A ? piece : piece / 2);
      const int64_t byte = kBf16A ? ch * 16 : ch * 32 + (piece % 2) * 16;
      CpAsync16(abase + row * Tile::kARowBytes + piece * 16, a_src[i] + (ch < chunks ? byte : 0),
                ch < chunks);
    }
  };

  // [column tile of 16][row tile of 8][C fragment]
  float acc[2][4][4], total[2][4][4];
#pragma unroll
  for (int x = 0; x < 2; ++x)
#pragma unroll
    for (int y = 0; y < 4; ++y)
#pragma unroll
      for (int z = 0; z < 4; ++z) acc[x][y][z] = 0.0f, total[x][y][z] = 0.0f;
  int q = 0;  // the partition being summed
  int64_t left = PartitionSteps(0, steps);
  // total = partition 0's sum, then + partition q's for q = 1 .. 7 (TcPass's order over red[q]).
  auto fold = [&] {
#pragma unroll
    for (int x = 0; x < 2; ++x)
#pragma unroll
      for (int y = 0; y < 4; ++y)
#pragma unroll
        for (int z = 0; z < 4; ++z) {
          total[x][y][z] = q == 0 ? acc[x][y][z] : total[x][y][z] + acc[x][y][z];
          acc[x][y][z] = 0.0f;
        }
    ++q;
  };

#pragma unroll
  for (int s = 0; s < kBigStages - 1; ++s) {
    if (s < steps) load(s, StepAt(s, steps));
    CpAsyncCommit();
  }
  const int warp_rows = (warp % 4) * 32, warp_cols = (warp / 4) * 32;
  for (int64_t l = 0; l < steps; ++l) {
    CpAsyncWait<kBigStages - 2>();
    __syncthreads();
    const int64_t next = l + kBigStages - 1;
    if (next < steps) load(static_cast<int>(next % kBigStages), StepAt(next, steps));
    CpAsyncCommit();
    const unsigned char* base = smem + (l % kBigStages) * Tile::kStageBytes;
    uint4 wv[2][2];
#pragma unroll
    for (int x = 0; x < 2; ++x)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        wv[x][half] = *reinterpret_cast<const uint4*>(
            base + (warp_cols + 16 * x + 8 * half + g) * 64 + t * 16);
    unsigned bv[4][4];
    const unsigned char* abase = base + Tile::kWBytes;
#pragma unroll
    for (int y = 0; y < 4; ++y) {
      const unsigned char* row = abase + (warp_rows + 8 * y + g) * Tile::kARowBytes;
      if (kBf16A) {
        const uint4 v = *reinterpret_cast<const uint4*>(row + t * 16);
        bv[y][0] = v.x, bv[y][1] = v.y, bv[y][2] = v.z, bv[y][3] = v.w;
      } else {
        const float4 v0 = *reinterpret_cast<const float4*>(row + t * 32);
        const float4 v1 = *reinterpret_cast<const float4*>(row + t * 32 + 16);
        bv[y][0] = PackBf16x2(v0.x, v0.y);
        bv[y][1] = PackBf16x2(v0.z, v0.w);
        bv[y][2] = PackBf16x2(v1.x, v1.y);
        bv[y][3] = PackBf16x2(v1.z, v1.w);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const unsigned frag[4] = {h ? wv[x][0].z : wv[x][0].x, h ? wv[x][1].z : wv[x][1].x,
                                  h ? wv[x][0].w : wv[x][0].y, h ? wv[x][1].w : wv[x][1].y};
#pragma unroll
        for (int y = 0; y < 4; ++y) MmaBf16(acc[x][y], frag, bv[y][2 * h], bv[y][2 * h + 1]);
      }
    }
    if (--left == 0) {
      fold();
      left = PartitionSteps(q, steps);
    }
  }
  // Partitions without steps (k < 8 steps) add zeros, as TcPass adds their warps' red[q].
  while (q < kTcWarps) {
    fold();
  }

  // C fragment: z = 0, 1: (column g, rows 2t, 2t + 1); z = 2, 3: (column g + 8, same rows).
#pragma unroll
  for (int x = 0; x < 2; ++x)
#pragma unroll
    for (int y = 0; y < 4; ++y)
#pragma unroll
      for (int z = 0; z < 4; ++z) {
        const int64_t col = col0 + warp_cols + 16 * x + g + (z >= 2 ? 8 : 0);
        const int64_t row = row0 + warp_rows + 8 * y + 2 * t + (z % 2);
        if (col >= p.n || row >= p.m) continue;
        float* out = c + row * p.ldc + col;
        *out = p.accumulate ? *out + total[x][y][z] : total[x][y][z];
      }
}

template <typename T>
__device__ __forceinline__ float Load(const void* base, int64_t i);
template <>
__device__ __forceinline__ float Load<float>(const void* base, int64_t i) {
  return static_cast<const float*>(base)[i];
}
template <>
__device__ __forceinline__ float Load<uint16_t>(const void* base, int64_t i) {
  return __uint_as_float(static_cast<unsigned>(static_cast<const uint16_t*>(base)[i]) << 16);
}

constexpr int kWarpThreads = 256;

// One warp per tile of R rows x J output columns of one product (b), grid-strided. Each output
// is summed as with R = J = 1: lane l adds the products q = l, l + 32, ... in order with fmaf into
// its own partial sum, then a fixed butterfly across the warp (xor 16, 8, 4, 2, 1). A tile only
// lets the warp use each activation value for J columns and each weight value for R rows; rows
// and columns past the end read a clamped valid one and are not stored.
template <typename TA, typename TW, int R, int J>
__global__ void __launch_bounds__(kWarpThreads)
    BatchInvariantGemmWarpKernel(BatchInvariantGemmParams p) {
  constexpr int kUnroll = 4;  // loads of 4 k positions issued before their FMAs (same order)
  const int lane = threadIdx.x % 32;
  const int64_t row_tiles = (p.m + R - 1) / R, column_tiles = (p.n + J - 1) / J;
  const int64_t total = p.batch * row_tiles * column_tiles;
  const int64_t warps = int64_t{gridDim.x} * (kWarpThreads / 32);
  const bool round_a = !std::is_same<TA, uint16_t>::value && std::is_same<TW, uint16_t>::value;
  for (int64_t e = int64_t{blockIdx.x} * (kWarpThreads / 32) + threadIdx.x / 32; e < total;
       e += warps) {
    const int64_t j0 = (e % column_tiles) * J, i0 = ((e / column_tiles) % row_tiles) * R;
    const int64_t b = e / (column_tiles * row_tiles);
    int64_t a0[R], w0[J];
#pragma unroll
    for (int r = 0; r < R; ++r) a0[r] = b * p.stride_a + min(i0 + r, p.m - 1) * p.lda;
#pragma unroll
    for (int j = 0; j < J; ++j) w0[j] = b * p.stride_w + min(j0 + j, p.n - 1) * p.ldw;
    float sum[R][J];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < J; ++j) sum[r][j] = 0.0f;
    for (int64_t q0 = lane; q0 < p.k; q0 += 32 * kUnroll) {
      float x[kUnroll][R], wv[kUnroll][J];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t q = q0 + 32 * u;
        if (q >= p.k) break;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          x[u][r] = Load<TA>(p.a, a0[r] + q);
          if (round_a) x[u][r] = __bfloat162float(__float2bfloat16_rn(x[u][r]));
        }
#pragma unroll
        for (int j = 0; j < J; ++j) wv[u][j] = Load<TW>(p.w, w0[j] + q);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (q0 + 32 * u >= p.k) break;
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int j = 0; j < J; ++j) sum[r][j] = fmaf(x[u][r], wv[u][j], sum[r][j]);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int j = 0; j < J; ++j) {
        float s = sum[r][j];
#pragma unroll
        for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
        // Every lane holds the sum; spread the stores over lanes.
        const int64_t i = i0 + r, col = j0 + j;
        if (i < p.m && col < p.n && lane == (r * J + j) % 32) {
          float* out = p.c + b * p.stride_c + i * p.ldc + col;
          *out = p.accumulate ? *out + s : s;
        }
      }
    }
  }
}

// The warp kernel's tiles of kWarpTileRows x kWarpTileColumns outputs from this many tiles (about
// 4 warps an SM), else one output a warp (more warps for few outputs). Either gives the same
// bits; the sizes are guesses, not measured.
constexpr int kWarpTileRows = 2, kWarpTileColumns = 4;
constexpr int64_t kWarpTileMinTiles = 512;

constexpr int64_t kIntMax = std::numeric_limits<int>::max();

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

bool TcAvailable() {
  static const bool available = [] {
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, BatchInvariantGemmTcKernel<1, false>) != cudaSuccess) {
      return false;
    }
    return attr.binaryVersion >= 80 && attr.ptxVersion >= 80;
  }();
  return available;
}

bool SizesValid(const BatchInvariantGemmParams& p) {
  return p.m >= 1 && p.n >= 1 && p.k >= 0 && p.batch >= 1 && p.m <= kIntMax && p.n <= kIntMax &&
         p.k <= kIntMax && p.batch <= 65535 && p.lda >= p.k && p.ldw >= p.k && p.ldc >= p.n &&
         p.a != nullptr && p.w != nullptr && p.c != nullptr &&
         (p.batch == 1 || (p.stride_a >= 0 && p.stride_w >= 0 && p.stride_c >= 0));
}

}  // namespace

bool BatchInvariantGemmTcSupports(const BatchInvariantGemmParams& p) {
  const int64_t a_size = p.a_bf16 ? 2 : 4;
  return SizesValid(p) && p.w_bf16 && p.k % 8 == 0 && Aligned16(p.a) && Aligned16(p.w) &&
         (p.lda * a_size) % 16 == 0 && (p.ldw * 2) % 16 == 0 && (p.stride_a * a_size) % 16 == 0 &&
         (p.stride_w * 2) % 16 == 0 &&
         (p.n + kTcColumnsPerBlock - 1) / kTcColumnsPerBlock <= 65535 && TcAvailable();
}

cudaError_t BatchInvariantGemmTc(const BatchInvariantGemmParams& p, cudaStream_t stream) {
  if (!BatchInvariantGemmTcSupports(p)) return cudaErrorInvalidValue;
  // x: the row blocks, so that the blocks of one column tile are launched together and all but
  // the first find its weights in L2 (the weights are read from memory about once at any m).
  const int64_t row_blocks = (p.m + kTcRowsPerBlock - 1) / kTcRowsPerBlock;
  auto column_tiles_of = [&](int ct) {
    return (p.n + kTcColumnsPerBlock * ct - 1) / (kTcColumnsPerBlock * ct);
  };
  const int ct = column_tiles_of(2) * row_blocks * p.batch >= kTcWideMinBlocks ? 2 : 1;
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(column_tiles_of(ct)),
                  static_cast<unsigned>(p.batch));
  const int64_t row_tiles = (p.m + kBigRows - 1) / kBigRows;
  const int64_t column_tiles = (p.n + kBigColumns - 1) / kBigColumns;
  if (p.m >= kBigMinRows && row_tiles * column_tiles * p.batch >= kBigMinBlocks &&
      row_tiles * column_tiles <= kIntMax) {
    const dim3 big_grid(static_cast<unsigned>(row_tiles * column_tiles), 1,
                        static_cast<unsigned>(p.batch));
    if (p.a_bf16) {
      BatchInvariantGemmBigKernel<true>
          <<<big_grid, kBigThreads, BigTile<true>::kSmemBytes, stream>>>(p, row_tiles,
                                                                         column_tiles);
    } else {
      // Every call: the attribute belongs to the current device.
      const cudaError_t attr = cudaFuncSetAttribute(BatchInvariantGemmBigKernel<false>,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    BigTile<false>::kSmemBytes);
      if (attr != cudaSuccess) return attr;
      BatchInvariantGemmBigKernel<false>
          <<<big_grid, kBigThreads, BigTile<false>::kSmemBytes, stream>>>(p, row_tiles,
                                                                          column_tiles);
    }
    return cudaGetLastError();
  }
  auto launch = [&](auto kernel) { kernel<<<grid, kTcThreads, 0, stream>>>(p); };
  if (ct == 2) {
    p.a_bf16 ? launch(BatchInvariantGemmTcKernel<2, true>)
             : launch(BatchInvariantGemmTcKernel<2, false>);
  } else {
    p.a_bf16 ? launch(BatchInvariantGemmTcKernel<1, true>)
             : launch(BatchInvariantGemmTcKernel<1, false>);
  }
  return cudaGetLastError();
}

cudaError_t BatchInvariantGemmWarp(const BatchInvariantGemmParams& p, cudaStream_t stream) {
  if (!SizesValid(p)) return cudaErrorInvalidValue;
  const int64_t tiles = p.batch * ((p.m + kWarpTileRows - 1) / kWarpTileRows) *
                        ((p.n + kWarpTileColumns - 1) / kWarpTileColumns);
  const bool tiled = tiles >= kWarpTileMinTiles;
  const int64_t warps = tiled ? tiles : p.batch * p.m * p.n;
  const int64_t blocks =
      std::min<int64_t>((warps + kWarpThreads / 32 - 1) / (kWarpThreads / 32), int64_t{1} << 20);
  const dim3 grid(static_cast<unsigned>(blocks));
  auto launch = [&](auto tile_kernel, auto one_kernel) {
    (tiled ? tile_kernel : one_kernel)<<<grid, kWarpThreads, 0, stream>>>(p);
  };
  if (p.a_bf16 && p.w_bf16) {
    launch(BatchInvariantGemmWarpKernel<uint16_t, uint16_t, kWarpTileRows, kWarpTileColumns>,
           BatchInvariantGemmWarpKernel<uint16_t, uint16_t, 1, 1>);
  } else if (p.a_bf16) {
    launch(BatchInvariantGemmWarpKernel<uint16_t, float, kWarpTileRows, kWarpTileColumns>,
           BatchInvariantGemmWarpKernel<uint16_t, float, 1, 1>);
  } else if (p.w_bf16) {
    launch(BatchInvariantGemmWarpKernel<float, uint16_t, kWarpTileRows, kWarpTileColumns>,
           BatchInvariantGemmWarpKernel<float, uint16_t, 1, 1>);
  } else {
    launch(BatchInvariantGemmWarpKernel<float, float, kWarpTileRows, kWarpTileColumns>,
           BatchInvariantGemmWarpKernel<float, float, 1, 1>);
  }
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace deepinfer
