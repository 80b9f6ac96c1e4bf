// SinkAttentionF32's kTensorCoreBf16Rows kernel: kTensorCoreBf16's block (sink_attention_mma.cuh:
// 8 warps, 64 heads, tiles of 32 key rows, the same TileStep and epilogues, so the same output
// bit for bit) with another way of bringing the key rows in. Included only by sink_attention.cu.
//
// A row whose buffer has a bf16 copy in the params (kv_bf16, ring_bf16, entries_bf16: the bits
// kTensorCoreBf16 would round its values to) is copied with cp.async straight into the key tile
// (1 KiB a row instead of 2 KiB, no conversion); a row without one goes as in kTensorCoreBf16
// (fp32 into a staging buffer, converted by the thread that copied it). The key tile is double
// buffered: at the top of tile i every thread waits for its own copies, converts its staged
// rows into tile i's buffer and meets the block at one barrier (tile i complete, every warp
// done with tile i - 1), then starts tile i + 1's copies into the other buffer and computes
// tile i. kTensorCoreBf16 needs two barriers a tile (its single buffer is rewritten between
// them). Shared memory: Q 65 KiB, two key tiles 65 KiB, the staging buffer 64 KiB, the score
// exchange 16 KiB, the rope table 2 KiB: 212 KiB, one block per SM.
#ifndef DEEPINFER_KERNELS_V4_SINK_ATTENTION_BF16_ROWS_CUH_
#define DEEPINFER_KERNELS_V4_SINK_ATTENTION_BF16_ROWS_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/attention/mma_sm80.cuh"
#include "kernels/v4/sink_attention.h"
#include "kernels/v4/sink_attention_mma.cuh"
#include "kernels/v4/sink_attention_rows.cuh"

namespace deepinfer {
namespace kernels {
namespace sink {

struct RowsShape {
  using Tile = MmaShape<false>;
  static constexpr int kRows = Tile::kRows;
  static constexpr size_t kSmemBytes = Tile::kQBytes + 2 * Tile::kKBytes + Tile::kStageBytes +
                                       Tile::kExchangeBytes + Tile::kRopeBytes + 16;
};
static_assert(RowsShape::kSmemBytes <= 227 * 1024, "fits sm_90's opt-in shared memory");

// Window row j's buffer (kv or the ring: *base) and its bf16 copy (*base16, null where the
// params give none): element e of the buffer is element e of the copy.
__device__ __forceinline__ void WindowBuffers(const SinkAttentionParams& p, const TokenRows& rows,
                                              int32_t j, const float** base,
                                              const uint16_t** base16) {
  const int64_t pos = rows.pos - rows.window_len + 1 + j;
  if (pos >= rows.step_start) {
    *base = p.kv;
    *base16 = p.kv_bf16;
  } else {
    *base = p.ring;
    *base16 = p.ring_bf16;
  }
}

// Element e of the token's entry stream in entries_bf16 (SinkEntriesBf16's layout).
__device__ __forceinline__ const uint16_t* EntryBf16(const SinkAttentionParams& p,
                                                     const TokenRows& rows, int64_t e) {
  const SinkEntriesBf16& c = p.entries_bf16;
  const int32_t* tables = c.block_tables != nullptr ? c.block_tables : p.entries.block_tables;
  const int64_t stride = c.block_tables != nullptr ? c.table_stride : p.entries.table_stride;
  const int64_t bf = p.entries.block_floats;
  return c.data + int64_t{tables[rows.seq * stride + e / bf]} * bf + e % bf;
}

// Starts copying the tile of rows row0 .. row0 + kRows - 1 (zeros at and past `end`) and commits
// the copies as one group: rows with a bf16 copy into kb [kRows][kMmaLd] (this thread's 16-byte
// pieces threadIdx % 16 + 16 c of 8 values), the others' fp32 values into stage [kRows][kMmaDim]
// (IssueTile's pieces). This thread's rows are threadIdx / 16 + 16 i; bit i of the result says
// row i went to stage.
__device__ __forceinline__ uint32_t IssueRowsTile(const SinkAttentionParams& p,
                                                  const TokenRows& rows, int32_t row0, int32_t end,
                                                  __nv_bfloat16* kb, float* stage) {
  constexpr int kRowsPerPass = kMmaThreads / 16;
  constexpr int kBf16Steps = kMmaDim / 8 / 16;
  const int r0 = threadIdx.x / 16, c0 = threadIdx.x % 16;
  uint32_t staged = 0;
#pragma unroll
  for (int i = 0; i < RowsShape::kRows / kRowsPerPass; ++i) {
    const int r = r0 + i * kRowsPerPass;
    const int32_t j = row0 + r;
    const bool valid = j < end;
    const bool entry = valid && j >= rows.window_len;
    // Null: an entry spread over blocks, each piece through its block. A row past the end
    // copies nothing (zeros) from kv's first row (or its copy).
    const float* src = valid ? rows.RowStart(j) : p.kv;
    // The bf16 source: a window row's (or the zeros') from its buffer's copy, an entry's from
    // entries_bf16 (its first element where the entry lies in one block, else null).
    const float* base = p.kv;
    const uint16_t* base16 = p.kv_bf16;
    const uint16_t* entry16 = nullptr;
    int64_t e0 = 0;  // an entry's first element in its stream
    if (entry) {
      base16 = p.entries_bf16.data;
      const int32_t k = j - rows.window_len;
      e0 = (rows.selected != nullptr ? rows.selected[k] : k) * rows.dim;
      if (base16 != nullptr && rows.entries_whole) entry16 = EntryBf16(p, rows, e0);
    } else if (valid) {
      WindowBuffers(p, rows, j, &base, &base16);
    }
    if (base16 != nullptr) {
#pragma unroll
      for (int c = 0; c < kBf16Steps; ++c) {
        const int piece = c0 + 16 * c;
        const uint16_t* from = !entry               ? base16 + (src + 8 * piece - base)
                               : entry16 != nullptr ? entry16 + 8 * piece
                                                    : EntryBf16(p, rows, e0 + 8 * piece);
        sm80::CopyAsync16(sm80::SharedAddr(kb + r * kMmaLd + 8 * piece), from, valid);
      }
    } else {
      staged |= 1u << i;
#pragma unroll
      for (int c = 0; c < kPieceSteps; ++c) {
        const int piece = c0 + 16 * c;
        const float* from = src != nullptr ? src + 4 * piece : rows.At(j, 4 * piece);
        sm80::CopyAsync16(sm80::SharedAddr(stage + r * kMmaDim + 4 * piece), from, valid);
      }
    }
  }
  sm80::CopyAsyncCommit();
  return staged;
}

// Converts this thread's staged rows (the bits of `staged`, its own copies: no barrier needed
// first) to bf16 rows of kb, as ConvertTile converts them.
__device__ __forceinline__ void ConvertStagedRows(const float* stage, __nv_bfloat16* kb,
                                                  uint32_t staged) {
  constexpr int kRowsPerPass = kMmaThreads / 16;
  const int r0 = threadIdx.x / 16, c0 = threadIdx.x % 16;
#pragma unroll
  for (int i = 0; i < RowsShape::kRows / kRowsPerPass; ++i) {
    if (((staged >> i) & 1u) == 0) continue;
    const int r = r0 + i * kRowsPerPass;
#pragma unroll
    for (int c = 0; c < kPieceSteps; ++c) {
      const int piece = c0 + 16 * c;
      const float4 v = *reinterpret_cast<const float4*>(stage + r * kMmaDim + 4 * piece);
      StoreFour<false>(v, kb + r * kMmaLd + 4 * piece, nullptr);
    }
  }
}

__device__ void MmaRowsBody(SinkAttentionParams p, int32_t num_splits) {
  constexpr int kRows = RowsShape::kRows, kNt = MmaShape<false>::kScoreTiles;
  constexpr int kTile = kRows * kMmaLd;  // bf16 values of a key tile buffer
  extern __shared__ __align__(16) unsigned char sink_smem[];
  __nv_bfloat16* qh = reinterpret_cast<__nv_bfloat16*>(sink_smem);
  __nv_bfloat16* kbuf = qh + kMmaHeads * kMmaLd;  // two tiles
  float* stage = reinterpret_cast<float*>(kbuf + 2 * kTile);
  float4* exchange = reinterpret_cast<float4*>(stage + kRows * kMmaDim);
  float2* rope = reinterpret_cast<float2*>(exchange + kMmaThreads * kNt);
  int32_t* scratch = reinterpret_cast<int32_t*>(rope + kMmaDim / 2);

  const int64_t t = blockIdx.x, h0 = static_cast<int64_t>(blockIdx.y) * kMmaHeads;
  const int split = blockIdx.z;
  const TokenRows rows = LoadTokenRows(p, t, scratch);
  int32_t begin, end;
  SplitRows<kRows>(rows.count, split, num_splits, &begin, &end);
  uint32_t staged = 0;
  if (begin < end) staged = IssueRowsTile(p, rows, begin, end, kbuf, stage);
  if (p.q_bf16 != nullptr) {
    LoadQueryBf16(p, t, h0, qh);
  } else {
    LoadQuery<false>(p, t, h0, qh, qh);
  }
  const bool out_bf16 = p.out_bf16 != nullptr;  // one split (SinkAttentionF32 checks)
  if (out_bf16) RopeTable(p, t, rope);

  float m[2], l[2];
  StartHeads(p, h0, split, m, l);
  float o[kMmaOutTiles][4] = {};
  const float scale2 = p.scale * kLog2e;

  int buf = 0;
#pragma unroll 1
  for (int32_t row0 = begin; row0 < end; row0 += kRows) {
    __nv_bfloat16* kb = kbuf + buf * kTile;
    sm80::CopyAsyncWait<0>();
    ConvertStagedRows(stage, kb, staged);
    // The tile is complete in kb (and Q, the rope table stored); every warp is done with the
    // previous tile (the other buffer, its exchange slots).
    __syncthreads();
    buf ^= 1;
    if (row0 + kRows < end) {
      staged = IssueRowsTile(p, rows, row0 + kRows, end, kbuf + buf * kTile, stage);
    }
    TileStep<false>(qh, qh, kb, kb, exchange, row0, end, scale2, m, l, o);
  }

  if (out_bf16) {
    if (begin >= end) __syncthreads();  // no tile: the rope table and Q's stores are complete
    StoreOutBf16(p, t, h0, o, l, rope, qh);
    return;
  }
  StoreOutF32(p, t, h0, num_splits, split, m, l, o);
}

}  // namespace sink
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_V4_SINK_ATTENTION_BF16_ROWS_CUH_
