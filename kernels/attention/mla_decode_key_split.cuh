// MlaBf16KeySplitKernel: the key-split tensor-core MLA decode kernel for latent 512 + rope 64,
// with its cluster merge of 2-3 splits, over a bf16 cache or an FP8 one (kFp8 below: the entries'
// bytes staged in the key tile and converted there into the bf16 values that mla_fp8_gather.h's
// copy holds), in two forms: kStages = 2 (mma_variant 9, the default below 16 tokens or for head
// counts that are not a multiple of 64: double-buffered, two blocks per SM) and kStages =
// kSplitRingStages (mma_variant 11: a ring of key tiles, one block per SM; the arithmetic that
// sizes it is at kSplitRingStages). Included only by mla_attention.cu.
#ifndef DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_KEY_SPLIT_CUH_
#define DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_KEY_SPLIT_CUH_

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <math.h>

#include <cstdint>

#include "kernels/attention/mla_attention.h"
#include "kernels/attention/mla_decode_common.cuh"
#include "kernels/attention/mla_decode_mma.cuh"

namespace deepinfer {
namespace kernels {
namespace mla {

// ---- Key-split tensor-core kernel (variant 9): latent 512 + rope 64 ----
//
// The FlashMLA work split over mma.sync: one block of 4 warps per (token, context split, group
// of 16 heads), keys in tiles of kSplitKeys (32, two blocks per SM), double-buffered with
// cp.async, with a short start-up (below). (64-key tiles at one block per SM, and the start-up
// without its overlap, the removed variants 5 and 6, measured slower:
// docs/cuda/bf16-and-kv-cache.md.) Per tile:
//   score    warp w computes S[16 heads x its kSplitKeys / 4 keys] over the whole 576-deep dot
//            product (Q fragments read from shared memory, where they were staged once per
//            block; independent accumulator chains per k-step modulo 4), so no partial scores
//            are summed across warps;
//   softmax  each warp takes its keys' row maxima, the four warps exchange them through shared
//            memory (one barrier), and every warp applies the same tile maximum; each warp keeps
//            its own keys' part of the running denominator (summed across warps once, at the
//            end);
//   value    warp w's P goes to shared memory as its part of the bf16 A fragments of P·V
//            (one barrier); every warp then owns 128 of the 512 output columns and
//            accumulates O[16 x 128] += P[16 x kSplitKeys] V[kSplitKeys x 128].
// Q and P enter the MMAs as plain bf16 (the kernel's description below).
constexpr int kSplitLatent = 512, kSplitRope = 64;
constexpr int kSplitKeys = 32;  // keys per tile
constexpr int kSplitDim = kSplitLatent + kSplitRope;
constexpr int kSplitKSteps = kSplitDim / 16;  // score k-steps (36)
constexpr int kSplitLd = kSplitDim + 8;       // bf16 row stride: ldmatrix rows in distinct banks
constexpr int kSplitRowThreads = 8;           // threads copying one key row (128 bytes a step)
constexpr int kSplitRowsPerPass = kMmaThreads / kSplitRowThreads;        // 16
constexpr int kSplitPiecesPerThread = kSplitDim / 8 / kSplitRowThreads;  // 9 16-byte pieces
constexpr int kSplitWarpCols = kSplitLatent / kMmaWarps;                 // 128 columns per warp
constexpr int kSplitNT = kSplitWarpCols / 8;                             // 16 output n-tiles
static_assert(kSplitDim % (8 * kSplitRowThreads) == 0, "whole 16-byte pieces per copying thread");
static_assert(kSplitKSteps % 2 == 0, "8-key warps load two score k-steps per ldmatrix");

// The kernel keeps the block-table entries of its split's keys in shared memory, up to
// kSplitTableSlots of them (a split needing more reads the table in global memory): at block
// size 16, 4096 keys.
constexpr int kSplitTableSlots = 256;
constexpr int kSplitTablePerThread = kSplitTableSlots / kMmaThreads;  // loads per thread: 2
static_assert(kSplitTableSlots % kMmaThreads == 0, "whole table loads per thread");

// Shared memory of a block with `stages` key tiles: Q fragments [k-step][lane] (uint4), keys
// [stages][kSplitKeys][kSplitLd] (bf16), P fragments [P·V k-step][lane] (uint4; the space of two
// parts is kept), row maxima and row sums [warp][16] (fp32), and the block-table entries
// [kSplitTableSlots] (int32).
constexpr size_t KeySplitSmemBytes(int stages) {
  return size_t{kSplitKSteps} * 32 * sizeof(uint4) +
         static_cast<size_t>(stages) * kSplitKeys * kSplitLd * sizeof(__nv_bfloat16) +
         static_cast<size_t>(kSplitKeys / 16) * 2 * 32 * sizeof(uint4) +
         2 * kMmaWarps * kMmaHeads * sizeof(float) + size_t{kSplitTableSlots} * sizeof(int32_t);
}
constexpr size_t kSplitSmemBytes = KeySplitSmemBytes(2);  // variant 9: 94.5 KB
// Two blocks per SM on sm_90 (228 KB of shared memory per SM, 1 KB of it reserved per block).
// A third key buffer (3-stage ring) would not fit two blocks per SM, so variant 9 stays
// double-buffered.
static_assert(2 * (kSplitSmemBytes + 1024) <= 228 * 1024, "two blocks per SM");
static_assert(2 * (KeySplitSmemBytes(3) + 1024) > 228 * 1024,
              "a 3-stage ring would not fit two blocks per SM (revisit the ring)");

// ---- The ring form (mma_variant 11): kSplitRingStages key tiles, one block per SM ----
//
// What the cache stream needs (Little's law): ~4 TB/s at a loaded HBM latency of ~1-1.5 us is
// 4-6 MB in flight, 30-45 KB per SM on 132 SMs. A 32-key bf16 tile is 36.9 KB (32 x 1152
// bytes). Variant 9 has one tile per block in flight while it computes the other (its loop
// waits for the tile it is about to use, then issues the next one): 37 KB per SM at one block
// per SM, 74 KB at two; and a tile waits out most of a round trip whenever the previous tile's
// math is shorter than the latency, which at 16 heads it is (per warp per tile: 36 score MMAs
// in 4 chains, 32 P·V MMAs, 34 ldmatrix, 3 barriers, ~350 instructions: ~0.6 us at one warp
// per scheduler, against ~1.8 us per tile in the H200 profile of 128 x 1024: 58 us for 32
// tiles a block). A ring of S tiles keeps S - 1 tiles in flight while one is computed: S = 4
// is 3 x 36.9 = 111 KB in flight per SM (2.5-3.5x the Little's-law need, so the loaded latency
// can grow to ~3 us before the stream starves), in 167.5 KB of shared memory (Q fragments 18
// KB + 4 tiles 146 KB + 3.5 KB), i.e. one block of 4 warps per SM (two would need 335 KB). The
// math then sets the pace only if a tile's takes longer than ~37 KB / (4 TB/s / 132) = 1.2 us,
// twice the estimate above. Registers are not the limit (sm_90, -Xptxas -v: 175 for the bf16
// form, 245 for the FP8 one, no spills; up to 255 at one block of 128 threads). S = 5 (204 KB)
// also fits one block per SM; more stages only add start-up (the first S tiles are issued
// before Q's conversion) and matter less as the split rule shortens splits at one block per SM
// (8 tokens: 16 splits of 2 tiles each). Not chosen: 64-key tiles double-buffered at one block
// per SM (variant 5, measured slower: one 74 KB tile in flight and twice the math between
// waits); TMA bulk row copies (cp.async.bulk, one 1152-byte copy per key row, an mbarrier per
// stage) would save the 18 16-byte cp.async per thread and tile but not change the bytes in
// flight, and the FP8 staging (codes, rope key and scale piece to three places in the row)
// would take three bulk copies per row; the swap-AB wgmma form (keys as M = 64, 16 heads as N)
// computes the same products faster, but at 16 heads the products are not what bounds it.
constexpr int kSplitRingStages = 4;
constexpr size_t kSplitRingSmemBytes = KeySplitSmemBytes(kSplitRingStages);
static_assert(kSplitRingSmemBytes + 1024 <= 228 * 1024 &&
                  kSplitRingSmemBytes <= 227 * 1024,  // sm_90's per-block opt-in limit
              "one ring block per SM");

// Starts copying the tile's key rows threadIdx / 8 + 16 k (row offsets rows[k]; -1: zeroed, so
// that P·V never multiplies garbage) into dst [kKeys][kSplitLd], 16-byte pieces threadIdx % 8 +
// 8 i of each, and commits them as one copy group.
template <int kRows>
__device__ __forceinline__ void LoadSplitTile(const __nv_bfloat16* cache,
                                              const int64_t (&rows)[kRows], __nv_bfloat16* dst) {
  const int r0 = threadIdx.x / kSplitRowThreads, f0 = threadIdx.x % kSplitRowThreads;
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    __nv_bfloat16* d = dst + (r0 + k * kSplitRowsPerPass) * kSplitLd + f0 * 8;
    if (rows[k] < 0) {
#pragma unroll
      for (int i = 0; i < kSplitPiecesPerThread; ++i) {
        *reinterpret_cast<uint4*>(d + i * 8 * kSplitRowThreads) = make_uint4(0u, 0u, 0u, 0u);
      }
    } else {
      const __nv_bfloat16* s = cache + rows[k] + f0 * 8;
#pragma unroll
      for (int i = 0; i < kSplitPiecesPerThread; ++i) {
        CopyAsync16(d + i * 8 * kSplitRowThreads, s + i * 8 * kSplitRowThreads);
      }
    }
  }
  CopyAsyncCommit();
}

// ---- FP8 entries (kFp8) ----
//
// An FP8 tile is staged in the bf16 tile's own rows (no extra shared memory): key row r's
// latent codes (512 bytes) go to bytes [512, 1024) of the row, the upper half of the bf16
// latent it becomes; the rope key's bf16 values straight to their place (bf16 columns 512 ..
// 575); the 16-byte piece of the entry holding the scale to the row's padding (columns 576 ..
// 583, which no MMA reads). Each row is copied by 8 threads of one warp, so after the copies
// land the warp converts its rows in place (ConvertSplitTileFp8) with warp barriers only,
// before the block barrier that publishes the tile.
constexpr int kSplitFp8CodeByte = kSplitLatent;           // codes' byte offset in a tile row
constexpr int kSplitFp8CodePieces = kSplitLatent / 16;    // 32 16-byte pieces of codes
constexpr int kSplitFp8RopePieces = kSplitRope * 2 / 16;  // 8 16-byte pieces of rope key
constexpr int kSplitFp8ScaleByte = kSplitDim * 2;         // the scale piece: the row's padding
constexpr int kSplitFp8CodesPerThread = kSplitFp8CodePieces / kSplitRowThreads;  // 4 pieces
static_assert(kSplitFp8RopePieces == kSplitRowThreads, "one rope piece per copying thread");
static_assert(kSplitLd * 2 - kSplitFp8ScaleByte == 16, "the row's padding holds one piece");
static_assert(kSplitRowThreads <= 32 && 32 % kSplitRowThreads == 0, "a row's threads in one warp");

// Where an FP8 entry's parts are (PagedLatentCache's offsets, Fp8LatentCacheLayoutValid, the
// rope key 16-byte aligned: the plan checks it).
struct SplitFp8Layout {
  int32_t rope_byte;         // fp8_rope_offset
  int32_t scale_piece_byte;  // fp8_scale_offset rounded down to 16 (within the entry)
  int32_t scale_in_piece;    // fp8_scale_offset % 16
};

__device__ __forceinline__ SplitFp8Layout Fp8LayoutOf(const PagedLatentCache& c) {
  return {c.fp8_rope_offset, c.fp8_scale_offset & ~15, c.fp8_scale_offset & 15};
}

// LoadSplitTile for an FP8 cache (rows[k]: byte offsets of the entries; -1: the row's codes,
// rope key and scale piece zeroed, so that it converts to zeros), one copy group.
template <int kRows>
__device__ __forceinline__ void LoadSplitTileFp8(const uint8_t* cache, const int64_t (&rows)[kRows],
                                                 const SplitFp8Layout& layout, __nv_bfloat16* dst) {
  const int r0 = threadIdx.x / kSplitRowThreads, f0 = threadIdx.x % kSplitRowThreads;
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    uint8_t* d = reinterpret_cast<uint8_t*>(dst + (r0 + k * kSplitRowsPerPass) * kSplitLd);
    if (rows[k] < 0) {
      const uint4 z = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int i = 0; i < kSplitFp8CodesPerThread; ++i) {
        *reinterpret_cast<uint4*>(d + kSplitFp8CodeByte + (f0 + i * kSplitRowThreads) * 16) = z;
      }
      *reinterpret_cast<uint4*>(d + kSplitLatent * 2 + f0 * 16) = z;
      if (f0 == 0) *reinterpret_cast<uint4*>(d + kSplitFp8ScaleByte) = z;
    } else {
      const uint8_t* s = cache + rows[k];
#pragma unroll
      for (int i = 0; i < kSplitFp8CodesPerThread; ++i) {
        const int piece = f0 + i * kSplitRowThreads;
        CopyAsync16(d + kSplitFp8CodeByte + piece * 16, s + piece * 16);
      }
      CopyAsync16(d + kSplitLatent * 2 + f0 * 16, s + layout.rope_byte + f0 * 16);
      if (f0 == 0) CopyAsync16(d + kSplitFp8ScaleByte, s + layout.scale_piece_byte);
    }
  }
  CopyAsyncCommit();
}

// Converts this thread's part of an FP8 tile staged by LoadSplitTileFp8 (its copies have
// landed: CopyAsyncWait) in place into the bf16 latent columns, a row at a time: the thread reads
// the code pieces it copied and the row's scale into registers, the warp synchronises (the
// row's bf16 values overwrite codes that its other threads read), and the thread writes 16 bf16
// values per piece. The caller's block barrier publishes the tile.
template <int kRows>
__device__ __forceinline__ void ConvertSplitTileFp8(__nv_bfloat16* tile, int scale_in_piece) {
  const int r0 = threadIdx.x / kSplitRowThreads, f0 = threadIdx.x % kSplitRowThreads;
  __syncwarp();  // the scale pieces (copied by one thread of each row) are visible
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    uint8_t* row = reinterpret_cast<uint8_t*>(tile + (r0 + k * kSplitRowsPerPass) * kSplitLd);
    const float scale = *reinterpret_cast<const float*>(row + kSplitFp8ScaleByte + scale_in_piece);
    uint4 codes[kSplitFp8CodesPerThread];
#pragma unroll
    for (int i = 0; i < kSplitFp8CodesPerThread; ++i) {
      codes[i] = *reinterpret_cast<const uint4*>(row + kSplitFp8CodeByte +
                                                 (f0 + i * kSplitRowThreads) * 16);
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kSplitFp8CodesPerThread; ++i) {
      // Piece p's 16 codes are latent values 16 p .. 16 p + 15: bf16 bytes [32 p, 32 p + 32).
      uint4* d = reinterpret_cast<uint4*>(row + (f0 + i * kSplitRowThreads) * 32);
      const uint2 v0 = DequantFp8x4Bf16(codes[i].x, scale);
      const uint2 v1 = DequantFp8x4Bf16(codes[i].y, scale);
      const uint2 v2 = DequantFp8x4Bf16(codes[i].z, scale);
      const uint2 v3 = DequantFp8x4Bf16(codes[i].w, scale);
      d[0] = make_uint4(v0.x, v0.y, v1.x, v1.y);
      d[1] = make_uint4(v2.x, v2.y, v3.x, v3.y);
    }
  }
}

// ---- The key-split kernel's start-up ----
//
// Q of one head group as fp32 float4s: element e = threadIdx + i * kMmaThreads of the
// [16 heads][144 float4] group, i < kSplitQLoads; dims 4 f .. 4 f + 3 of [latent | rope].
constexpr int kSplitQF4PerHead = kSplitDim / 4;                           // 144
constexpr int kSplitQLoads = kMmaHeads * kSplitQF4PerHead / kMmaThreads;  // 18 per thread
static_assert(kMmaHeads * kSplitQF4PerHead % kMmaThreads == 0, "whole Q loads per thread");
static_assert(kSplitLatent % 4 == 0, "a float4 of Q lies in the latent or in the rope part");

// Issues all of this thread's Q loads (nothing waits for them here): 16-byte loads where the
// query pointers and strides allow (q_vec), else four 4-byte loads; heads past num_heads are 0.
__device__ __forceinline__ void LoadQueryF4(const MlaAttentionParams& p, int64_t t, int h0,
                                            bool q_vec, float4 (&q)[kSplitQLoads]) {
#pragma unroll
  for (int i = 0; i < kSplitQLoads; ++i) {
    const int e = threadIdx.x + i * kMmaThreads;
    const int hl = e / kSplitQF4PerHead, f = e - hl * kSplitQF4PerHead, h = h0 + hl;
    q[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (h >= p.num_heads) continue;
    if (4 * f < kSplitLatent) {  // q_latent rows are whole float4s when q_vec
      const float* src = p.q_latent + (t * p.num_heads + h) * kSplitLatent + 4 * f;
      q[i] = q_vec ? *reinterpret_cast<const float4*>(src)
                   : make_float4(src[0], src[1], src[2], src[3]);
    } else {
      const float* src =
          p.q_rope + t * p.q_rope_token_stride + h * p.q_rope_head_stride + (4 * f - kSplitLatent);
      q[i] = q_vec ? *reinterpret_cast<const float4*>(src)
                   : make_float4(src[0], src[1], src[2], src[3]);
    }
  }
}

// Writes the loaded Q, rounded to bf16 (nearest even), as the A fragments of the score MMAs:
// qf[ks * 32 + lane] register r holds head g + 8 (r & 1), dims 16 ks + 2 tq + 8 (r >> 1) +
// {0, 1} (lane = 4 g + tq). A float4 at dim c is two such pairs: (c, c + 1) at tq = (c % 8) / 2
// and (c + 2, c + 3) at the next tq.
__device__ __forceinline__ void StoreQueryFragments(const float4 (&q)[kSplitQLoads], uint4* qf) {
  uint32_t* words = reinterpret_cast<uint32_t*>(qf);
#pragma unroll
  for (int i = 0; i < kSplitQLoads; ++i) {
    const int e = threadIdx.x + i * kMmaThreads;
    const int hl = e / kSplitQF4PerHead, c = 4 * (e - hl * kSplitQF4PerHead);
    const int ks = c / 16, o = c % 16;
    const int r = hl / 8 + 2 * (o / 8), lane = (hl % 8) * 4 + (o % 8) / 2;
    words[(ks * 32 + lane) * 4 + r] = Bf16x2Bits(__floats2bfloat162_rn(q[i].x, q[i].y));
    words[(ks * 32 + lane + 1) * 4 + r] = Bf16x2Bits(__floats2bfloat162_rn(q[i].z, q[i].w));
  }
}

// Where the key-split kernel finds the block-table entries of its split: table entries first_block
// .. first_block + kSplitTableSlots - 1 in shared memory (stab) when in_smem, else the table
// itself.
struct SplitTable {
  const int32_t* table;  // the token's row of block_tables (global)
  const int32_t* stab;   // shared copy of entries first_block ...
  int32_t first_block;
  bool in_smem;
};

// Copies the table entries of keys [begin, end) into stab when they fit (one round of
// kSplitTablePerThread independent loads per thread). The caller syncs before stab is read.
__device__ __forceinline__ SplitTable PrefetchSplitTable(const MlaAttentionParams& p,
                                                         const int32_t* table, int32_t* stab,
                                                         int32_t begin, int32_t end) {
  const int32_t bs = p.cache.block_size;
  SplitTable st{table, stab, begin / bs, false};
  const int32_t n = (end - 1) / bs - st.first_block + 1;
  st.in_smem = n <= kSplitTableSlots;
  if (st.in_smem) {
    int32_t v[kSplitTablePerThread];
#pragma unroll
    for (int k = 0; k < kSplitTablePerThread; ++k) {
      const int32_t i = threadIdx.x + k * kMmaThreads;
      v[k] = i < n ? table[st.first_block + i] : 0;
    }
#pragma unroll
    for (int k = 0; k < kSplitTablePerThread; ++k) {
      const int32_t i = threadIdx.x + k * kMmaThreads;
      if (i < n) stab[i] = v[k];
    }
  }
  return st;
}

// Cache offset of key j (< 2^31: context lengths are int32) of the split, -1 at or past end:
// 32-bit index math and, when the table is in shared memory, no global load. row_stride: the
// entry's size in the offset's unit (kSplitDim bf16 values, or an FP8 entry's bytes).
__device__ __forceinline__ int64_t SplitRowOrNone(const MlaAttentionParams& p, const SplitTable& st,
                                                  int32_t j, int32_t end, int32_t row_stride) {
  if (j >= end) return -1;
  const int32_t bs = p.cache.block_size;
  const int32_t b = j / bs, o = j - b * bs;
  const int32_t block = st.in_smem ? st.stab[b - st.first_block] : st.table[b];
  return (static_cast<int64_t>(block) * bs + o) * row_stride;
}

// ---- The key-split kernel's split merge (kClusterMerge) ----
//
// The largest cluster (= split count) the kernel merges in distributed shared memory; more
// splits write the workspace for the combine kernels. Measured on the H200
// (docs/cuda/bf16-and-kv-cache.md): clusters of 2 and 3 beat the workspace + combine, clusters of 4
// lost to it (64 x 1024, 4 splits: 50.3 vs 36.5 us in a graph). The merge itself takes up to 8 (the
// portable size).
constexpr int kMaxClusterSplits = 8;
static_assert(kMlaClusterMergeMaxSplits >= 2 && kMlaClusterMergeMaxSplits <= kMaxClusterSplits,
              "the cluster merge's split range");
// Row stride (floats) of a block's partial O in shared memory: rows 16-byte aligned for the
// merge's float4 reads, and the fragment stores' rows g = 0..7 in different banks.
constexpr int kMergeLd = kSplitLatent + 8;
constexpr size_t kMergeFloats =
    size_t{kMmaHeads} * kMergeLd + kMmaHeads * 2 + kMmaHeads * kMaxClusterSplits + kMmaHeads;
static_assert(kMergeFloats * sizeof(float) <= size_t{2} * 32 * kSplitLd * sizeof(__nv_bfloat16),
              "the merge's buffers fit in the key tiles' shared memory");
static_assert(kMergeLd % 4 == 0, "float4 rows");

// The end of a cluster-merge block (split `split` of a cluster of num_splits): this block's
// unnormalised O (acc: warp w's columns 128 w ..., the mma C-fragment layout), its row maxima
// (log2 units) and denominators go to shared memory (buf: the key tiles' space, free now);
// after a cluster barrier the block merges its slice of the output columns from every block
// of the cluster: out = sum_s w_s O_s / sum_s w_s l_s, w_s = 2^(m_s - max m), weight 0 for an
// empty split (l = 0). A second barrier keeps every block's shared memory alive until all
// have read it.
__device__ __forceinline__ void ClusterMergeSplits(const MlaAttentionParams& p, int64_t t, int h0,
                                                   int split, int num_splits,
                                                   const float (&acc)[kSplitNT][4],
                                                   const float (&run_max)[2],
                                                   const float (&total)[2], float* buf) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
  float* part_o = buf;                                     // [16][kMergeLd]
  float* part_ml = part_o + kMmaHeads * kMergeLd;          // [16][2]: max (log2), sum
  float* merge_w = part_ml + kMmaHeads * 2;                // [16][kMaxClusterSplits]
  float* denom = merge_w + kMmaHeads * kMaxClusterSplits;  // [16]
  CopyAsyncWait<0>();  // no copy group may still write the key tiles (all are empty by now)
#pragma unroll
  for (int n = 0; n < kSplitNT; ++n) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      *reinterpret_cast<float2*>(part_o + (g + 8 * r) * kMergeLd + warp * kSplitWarpCols + n * 8 +
                                 2 * tq) = make_float2(acc[n][2 * r], acc[n][2 * r + 1]);
    }
  }
  if (warp == 0 && tq == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      part_ml[2 * (g + 8 * r)] = run_max[r];
      part_ml[2 * (g + 8 * r) + 1] = total[r];
    }
  }
  cluster.sync();  // every block's partial is complete and visible to the cluster
  if (tid < kMmaHeads) {
    const int h = tid;
    float m[kMaxClusterSplits], l[kMaxClusterSplits];
    float mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      m[s] = -INFINITY;
      l[s] = 0.0f;
      if (s < num_splits) {
        const float* remote = cluster.map_shared_rank(part_ml, s);
        m[s] = remote[2 * h];
        l[s] = remote[2 * h + 1];
        if (l[s] > 0.0f) mx = fmaxf(mx, m[s]);
      }
    }
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      // Empty splits (l = 0, m = -inf) get weight 0 without evaluating 2^(-inf - -inf).
      const float w = l[s] > 0.0f ? exp2f(m[s] - mx) : 0.0f;
      merge_w[h * kMaxClusterSplits + s] = w;
      sum = fmaf(w, l[s], sum);
    }
    denom[h] = sum;  // > 0: split 0 always holds key 0
  }
  __syncthreads();
  // This block's float4 columns [c4_begin, c4_begin + n4) of the 16 heads.
  constexpr int kCols4 = kSplitLatent / 4;
  const int per_block = (kCols4 + num_splits - 1) / num_splits;
  const int c4_begin = split * per_block;
  const int n4 = c4_begin >= kCols4 ? 0 : min(per_block, kCols4 - c4_begin);
  for (int i = tid; i < kMmaHeads * n4; i += kMmaThreads) {
    const int h = i / n4, c4 = c4_begin + i % n4;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = 0; s < num_splits; ++s) {
      const float w = merge_w[h * kMaxClusterSplits + s];
      const float4 x =
          reinterpret_cast<const float4*>(cluster.map_shared_rank(part_o, s) + h * kMergeLd)[c4];
      o.x = fmaf(w, x.x, o.x);
      o.y = fmaf(w, x.y, o.y);
      o.z = fmaf(w, x.z, o.z);
      o.w = fmaf(w, x.w, o.w);
    }
    if (h0 + h < p.num_heads) {
      const float d = denom[h];
      reinterpret_cast<float4*>(p.out_latent + (t * p.num_heads + h0 + h) * kSplitLatent)[c4] =
          make_float4(o.x / d, o.y / d, o.z / d, o.w / d);
    }
  }
  cluster.sync();  // no block leaves while others read its shared memory
#endif             // __CUDA_ARCH__ >= 900
}

// Block index = (token * num_splits + split) * num_groups + group, as MlaGroupedKernel. Needs a
// 16-byte aligned cache (vec_loads is implied; PlanGrouped checks it). The start-up takes few
// dependent steps: all of Q's fp32 loads are issued first
// (16-byte loads), the split's block-table entries are copied into shared memory in one round,
// tiles 0 and 1 are both put in flight, and only then is Q converted into its fragments (so the
// conversion overlaps the key copies); tile row offsets come from the shared table with 32-bit
// index math.
//
// Q and P enter the MMAs as plain bf16 (round to nearest even), one MMA per product (as FlashMLA
// / FlashInfer; the hi + lo pairs of MlaBf16MmaKernel measured slower here); the scores' four
// accumulator chains are the k-step modulo 4. Scores then carry Q's bf16 rounding (2^-9
// relative per element) and the output P's.
//
// kClusterMerge (2 <= num_splits <= kMlaClusterMergeMaxSplits, sm_90): the num_splits
// blocks of one (token, head group) are a thread-block cluster (block index = (token *
// num_groups + group) * num_splits + split, split = the block's cluster rank); instead of
// writing partials to a workspace for MlaCombineKernel, each block leaves its unnormalised O
// and (max, sum) in its shared memory, and after a cluster barrier block r merges output
// columns [r, r + 1) * 512 / num_splits of every block's partial through distributed shared
// memory (the FlashDecoding merge, as MlaDecodeSmall's). An empty split takes part with max
// -inf and sum 0 (weight 0).
//
// kStages: key tiles in the cp.async ring. 2 (variant 9): tiles 0 and 1 in flight at the
// start, then each tile's copy issued (into the buffer the previous tile used) once every warp
// is past that tile. kSplitRingStages (variant 11): tiles 0 .. kStages - 1 in flight at the
// start, then tile i + kStages - 1 issued at tile i, so kStages - 1 tiles stream while one is
// computed; each tile from 1 on commits one copy group (empty past the split's end), so that
// waiting until kStages - 2 groups remain in flight means tile i has landed. One block per SM
// (kSplitRingSmemBytes).
//
// kFp8: an FP8 cache (PagedLatentCache kFp8E4M3 with the rope key 16-byte aligned in the
// entry): each tile's entries are staged with the same copies (LoadSplitTileFp8: 656 bytes a
// key for DeepSeek's layout instead of 1152) and each warp converts its rows into the bf16
// tile (ConvertSplitTileFp8) before the barrier that starts the tile, so the MMAs read the
// values of the bf16 copy GatherFp8LatentCacheBf16 would write, and the output is bit for bit
// that of the kernel over such a copy (the same split count).
template <bool kClusterMerge, bool kFp8 = false, int kStages = 2>
__global__ void __launch_bounds__(kMmaThreads, kStages == 2 ? 2 : 1)
    MlaBf16KeySplitKernel(MlaAttentionParams p, int num_groups, int num_splits, bool /*vec_loads*/,
                          float* ws_out, float* ws_ml) {
  constexpr int kKeys = kSplitKeys;
  constexpr int kWarpKeys = kKeys / kMmaWarps;      // keys scored per warp: 8
  constexpr int kWarpTiles = kWarpKeys / 8;         // their score n-tiles: 1
  constexpr int kPvSteps = kKeys / 16;              // P·V k-steps per tile
  constexpr int kRows = kKeys / kSplitRowsPerPass;  // key rows each thread copies
  static_assert(kWarpTiles == 1, "one score n-tile per warp");
  static_assert(kStages >= 2, "a ring of at least two key tiles");
  extern __shared__ float4 smem4[];
  uint4* qf = reinterpret_cast<uint4*>(smem4);
  __nv_bfloat16* kbuf = reinterpret_cast<__nv_bfloat16*>(qf + kSplitKSteps * 32);
  uint4* pf = reinterpret_cast<uint4*>(kbuf + kStages * kKeys * kSplitLd);  // 16-byte aligned
  float* red_max = reinterpret_cast<float*>(pf + kPvSteps * 2 * 32);
  float* red_sum = red_max + kMmaWarps * kMmaHeads;
  int32_t* stab = reinterpret_cast<int32_t*>(red_sum + kMmaWarps * kMmaHeads);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, tq = lane % 4;  // mma fragment coordinates: row group, pair in row
  // Cluster merge: the splits of one (token, group) are consecutive blocks (one cluster).
  const int group =
      kClusterMerge ? (blockIdx.x / num_splits) % num_groups : blockIdx.x % num_groups;
  const int split =
      kClusterMerge ? blockIdx.x % num_splits : (blockIdx.x / num_groups) % num_splits;
  const int64_t t = blockIdx.x / num_groups / num_splits;
  const int h0 = group * kMmaHeads;
  float4 q4[kSplitQLoads];
  {
    // First, so that these loads are in flight with the token's sequence and length loads.
    const uintptr_t q_bases =
        reinterpret_cast<uintptr_t>(p.q_latent) | reinterpret_cast<uintptr_t>(p.q_rope);
    const bool q_vec =
        q_bases % 16 == 0 && p.q_rope_token_stride % 4 == 0 && p.q_rope_head_stride % 4 == 0;
    LoadQueryF4(p, t, h0, q_vec, q4);
  }
  const int32_t* table =
      p.block_tables + static_cast<int64_t>(p.token_seq[t]) * p.max_blocks_per_seq;
  int64_t begin = 0, end = 0;
  if constexpr (kClusterMerge) {
    // No early exit: every block of the cluster takes part in the merge (an empty split runs
    // no tile and leaves max -inf, sum 0). ws_ml is null here.
    SplitRange<kKeys>(p, t, split, num_splits, &begin, &end);
  } else if (SplitIsEmpty<kKeys, kMmaHeads>(p, t, split, num_splits, h0, ws_ml, &begin, &end)) {
    return;
  }
  const __nv_bfloat16* cache = static_cast<const __nv_bfloat16*>(p.cache.cache);
  const uint8_t* cache_fp8 = static_cast<const uint8_t*>(p.cache.cache);
  const SplitFp8Layout fp8_layout = kFp8 ? Fp8LayoutOf(p.cache) : SplitFp8Layout{0, 0, 0};
  const int32_t row_stride = kFp8 ? p.cache.fp8_entry_bytes : kSplitDim;
  // Base-2 softmax: log2 e folded into the scale; the workspace's maxima in natural-log units.
  const float score_scale = p.softmax_scale * 1.4426950408889634f;

  const int my_row = tid / kSplitRowThreads;
  int64_t rows[kRows];
  SplitTable st{};
  // The row offsets of the tile starting at key j0 into rows[].
  auto tile_rows = [&](int64_t j0) {
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int64_t j = j0 + my_row + k * kSplitRowsPerPass;
      rows[k] = SplitRowOrNone(p, st, static_cast<int32_t>(j < end ? j : end),
                               static_cast<int32_t>(end), row_stride);
    }
  };
  // The tile's copies into dst (one copy group).
  auto load_tile = [&](__nv_bfloat16* dst) {
    if constexpr (kFp8) {
      LoadSplitTileFp8(cache_fp8, rows, fp8_layout, dst);
    } else {
      LoadSplitTile(cache, rows, dst);
    }
  };
  // The split's table entries into shared memory (one round of loads), then tiles 0 ..
  // kStages - 1 in flight (kStages copy groups; empty past the split's end) before Q's
  // conversion; rows[] then holds tile kStages' row offsets (kStages tiles ahead, see the loop).
  st = PrefetchSplitTable(p, table, stab, static_cast<int32_t>(begin), static_cast<int32_t>(end));
  __syncthreads();
  tile_rows(begin);
  load_tile(kbuf);
#pragma unroll
  for (int s = 1; s < kStages; ++s) {
    if (begin + s * kKeys < end) {
      tile_rows(begin + s * kKeys);
      load_tile(kbuf + s * kKeys * kSplitLd);
    } else {
      CopyAsyncCommit();
    }
  }
  if (begin + (kStages - 1) * kKeys < end) tile_rows(begin + kStages * kKeys);
  StoreQueryFragments(q4, qf);  // published by the loop's first barrier

  float acc[kSplitNT][4];
#pragma unroll
  for (int n = 0; n < kSplitNT; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
  }
  // Rows g and g + 8: the running maximum (the same in every warp) and this lane's part of the
  // running denominator (its keys only).
  float run_max[2] = {-INFINITY, -INFINITY}, part_sum[2] = {0.0f, 0.0f};
  const int mat = lane / 8, mat_row = lane % 8;  // ldmatrix: which matrix / row this lane names
  const int key0 = warp * kWarpKeys, col0 = warp * kSplitWarpCols;

  int tile = 0;
  for (int64_t j0 = begin; j0 < end; j0 += kKeys, ++tile) {
    // Groups committed so far: tiles 0 .. kStages - 1 at the start, then one per tile from
    // tile 1 on. Tile 0: the later kStages - 1 groups may stay in flight; tile i >= 1: the
    // kStages - 2 groups after tile i's (for kStages = 2: none, this tile's group is the only
    // one in flight).
    if (tile == 0) {
      CopyAsyncWait<kStages - 1>();
    } else {
      CopyAsyncWait<kStages - 2>();
    }
    const int stage = tile % kStages;
    if constexpr (kFp8) {
      // Each warp converts its own rows of this tile's buffer (other warps may still read the
      // previous tile's buffer, never this one).
      ConvertSplitTileFp8<kRows>(kbuf + stage * kKeys * kSplitLd, fp8_layout.scale_in_piece);
    }
    __syncthreads();  // the tile is complete for every thread, every warp done with the last one
    const __nv_bfloat16* kc = kbuf + stage * kKeys * kSplitLd;
    // Tile + kStages - 1 into the buffer the previous tile used (tiles 1 .. kStages - 1 are in
    // flight already, so from tile 1 on; rows[] holds its offsets then).
    if (tile > 0 && j0 + (kStages - 1) * kKeys < end) {
      load_tile(kbuf + ((tile + kStages - 1) % kStages) * kKeys * kSplitLd);
      tile_rows(j0 + kStages * kKeys);
    } else if (kStages > 2 && tile > 0) {
      CopyAsyncCommit();  // keeps one group per tile for the wait above
    }

    // S[16 x this warp's keys]: sc[ks & 3][n] for n-tile n (keys 8n .. 8n + 7), so that 4
    // kWarpTiles independent MMA chains are in flight.
    float sc[4][kWarpTiles][4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int n = 0; n < kWarpTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[c][n][e] = 0.0f;
      }
    }
#pragma unroll
    for (int ks2 = 0; ks2 < kSplitKSteps; ks2 += 2) {
      uint32_t b[2][2];  // [k-step ks2 + i]: b0, b1 of the warp's n-tile (8 keys)
      {
        // Matrices: keys key0 + 0..7, dims 16 ks2 + 8 mat + 0..7 (k-steps ks2 and ks2 + 1).
        uint32_t r[4];
        LdMatrixX4<false>(r, kc + (key0 + mat_row) * kSplitLd + ks2 * 16 + mat * 8);
        b[0][0] = r[0];
        b[0][1] = r[1];
        b[1][0] = r[2];
        b[1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int ks = ks2 + i;
        const uint4 qh4 = qf[ks * 32 + lane];
        const uint32_t qh[4] = {qh4.x, qh4.y, qh4.z, qh4.w};
#pragma unroll
        for (int n = 0; n < kWarpTiles; ++n) {
          MmaBf16(sc[ks & 3][n], qh, b[i][2 * n], b[i][2 * n + 1]);
        }
      }
    }
    float s[kWarpTiles][4], mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kWarpTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = j0 + key0 + n * 8 + 2 * tq + (e & 1);
        const float v = (sc[0][n][e] + sc[2][n][e]) + (sc[1][n][e] + sc[3][n][e]);
        s[n][e] = key < end ? v * score_scale : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
    if (tq == 0) {
      red_max[warp * kMmaHeads + g] = mx[0];  // -inf when all this warp's keys are past the end
      red_max[warp * kMmaHeads + g + 8] = mx[1];
    }
    __syncthreads();
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = run_max[r];
#pragma unroll
      for (int w = 0; w < kMmaWarps; ++w) m = fmaxf(m, red_max[w * kMmaHeads + g + 8 * r]);
      alpha[r] = exp2f(run_max[r] - m);  // 0 on the first tile (run_max = -inf); m is finite
      run_max[r] = m;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < kWarpTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2f(s[n][e] - run_max[e >> 1]);  // 0 for keys past the end
        sum[e >> 1] += s[n][e];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      part_sum[r] = part_sum[r] * alpha[r] + sum[r];
    }
    // P·V k-step kk's A fragment (keys 16 kk .. 16 kk + 15): registers 0, 1 are the C fragment
    // of keys 16 kk + 0..7, registers 2, 3 that of keys 16 kk + 8..15; this warp's n-tile n
    // holds keys key0 + 8 n.
#pragma unroll
    for (int n = 0; n < kWarpTiles; ++n) {
      const int kk = (key0 + 8 * n) / 16, half = ((key0 + 8 * n) / 8) % 2;
      const uint2 hi = make_uint2(Bf16x2Bits(__floats2bfloat162_rn(s[n][0], s[n][1])),
                                  Bf16x2Bits(__floats2bfloat162_rn(s[n][2], s[n][3])));
      reinterpret_cast<uint2*>(pf + kk * 32 + lane)[half] = hi;
    }
    __syncthreads();
    // The rescale is skipped when no row's maximum moved in this warp (alpha = 1 exactly: the
    // same bits), as it mostly does after the first tiles.
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int n = 0; n < kSplitNT; ++n) {
        acc[n][0] *= alpha[0];
        acc[n][1] *= alpha[0];
        acc[n][2] *= alpha[1];
        acc[n][3] *= alpha[1];
      }
    }
    // O[16 x this warp's 128 columns] += P V, V = the keys' latent part.
#pragma unroll
    for (int kk = 0; kk < kPvSteps; ++kk) {
      const uint4 ph4 = pf[kk * 32 + lane];
      const uint32_t ph[4] = {ph4.x, ph4.y, ph4.z, ph4.w};
#pragma unroll
      for (int np = 0; np < kSplitNT / 2; ++np) {
        // Matrices: keys 16 kk + 8 (mat & 1) + 0..7, columns c0 + 8 (mat >> 1) + 0..7.
        const int c0 = col0 + np * 16;
        uint32_t b[4];
        LdMatrixX4<true>(b,
                         kc + (kk * 16 + (mat & 1) * 8 + mat_row) * kSplitLd + c0 + (mat >> 1) * 8);
        MmaBf16(acc[2 * np], ph, b[0], b[1]);
        MmaBf16(acc[2 * np + 1], ph, b[2], b[3]);
      }
    }
  }

  // The denominators: this warp's keys over the quad, then the four warps in a fixed order.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    part_sum[r] += __shfl_xor_sync(0xffffffffu, part_sum[r], 1);
    part_sum[r] += __shfl_xor_sync(0xffffffffu, part_sum[r], 2);
  }
  if (tq == 0) {
    red_sum[warp * kMmaHeads + g] = part_sum[0];
    red_sum[warp * kMmaHeads + g + 8] = part_sum[1];
  }
  __syncthreads();
  float total[2] = {0.0f, 0.0f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) total[r] += red_sum[w * kMmaHeads + g + 8 * r];
  }
  if constexpr (kClusterMerge) {
    ClusterMergeSplits(p, t, h0, split, num_splits, acc, run_max, total,
                       reinterpret_cast<float*>(kbuf));
  } else {
    WriteSplitResult<kSplitNT, false>(p, t, h0, warp, g, tq, col0, kSplitLatent, num_splits, split,
                                      acc, run_max, total, ws_out, ws_ml);
  }
}

}  // namespace mla
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_KEY_SPLIT_CUH_
