// GatherFp8LatentCacheBf16: the entries of an FP8 paged latent cache (PagedLatentCache with
// type kFp8E4M3, fp8_latent_entry.h's layout) that an attention call reads, dequantised into a
// bf16 paged cache of the same block size, so that the bf16 tensor-core attention kernels run
// over them. Value i of a latent: bf16(e4m3_to_float(q_i) * s) (one fp32 product, then nearest
// even), as the host's DequantizeFp8LatentEntry followed by FloatToBf16Bits; the rope key's bf16
// bits are copied. A destination entry is latent_dim then rope_dim bf16 values, as in a bf16
// cache (PagedLatentCache type kBFloat16).
//
// The copy is organised in rows, one per block-table row that the attention call reads: row r
// takes entries 0 .. len_r - 1 of source block-table row src_r into destination blocks
// dst_block_r, dst_block_r + 1, ... (entry j at destination block dst_block_r + j / block_size,
// offset j % block_size), and writes row r of a destination block table of table_width
// columns: column j is dst_block_r + j for j < ceil(len_r / block_size), the row's last block
// (dst_block_r where len_r is 0) beyond, so every column names a block of the copy.
#ifndef DEEPINFER_KERNELS_ATTENTION_MLA_FP8_GATHER_H_
#define DEEPINFER_KERNELS_ATTENTION_MLA_FP8_GATHER_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention/mla_attention.h"

namespace deepinfer {
namespace kernels {

// One row of the copy, described on the host.
struct Fp8GatherRow {
  int32_t src_row = 0;    // the source block-table row
  int32_t len = 0;        // entries 0 .. len - 1 of it
  int32_t dst_block = 0;  // the row's first destination block
};

// Rows a launch carries in its parameters (host rows take ceil(num_rows / this) launches).
constexpr int32_t kFp8GatherRowsPerLaunch = 64;

struct Fp8GatherParams {
  PagedLatentCache src;                   // kFp8E4M3, Fp8LatentCacheLayoutValid
  const int32_t* block_tables = nullptr;  // device [source rows, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  // The rows, one of:
  //   host rows: rows (HOST array of num_rows; len_r <= table_width * block_size);
  //   token rows (rows null): row t for token t of num_rows tokens, src_row token_seq[t], len
  //     context_len[t] (device arrays; lengths clamped to [0, table_width * block_size]),
  //     dst_block t * table_width; token_seq_out[t] = t when token_seq_out is not null (the
  //     tokens' rows of the destination table).
  const Fp8GatherRow* rows = nullptr;
  const int32_t* token_seq = nullptr;
  const int32_t* context_len = nullptr;
  int32_t* token_seq_out = nullptr;
  int32_t num_rows = 0;
  // Destination: bf16 bits, dst_blocks blocks of block_size entries of latent_dim + rope_dim
  // values (16-byte aligned), and the block table [num_rows, table_width].
  uint16_t* dst = nullptr;
  int64_t dst_blocks = 0;
  int32_t* dst_tables = nullptr;
  int32_t table_width = 0;
};

// Bytes of a destination of `blocks` blocks (the entries only).
inline size_t Fp8GatherDstBytes(int64_t blocks, const PagedLatentCache& src) {
  return static_cast<size_t>(blocks) * src.block_size * (src.latent_dim + src.rope_dim) *
         sizeof(uint16_t);
}

// Launches the copy on `stream` (no host synchronisation; graph-capturable). cudaErrorInvalidValue
// for a source that is not a valid FP8 layout, a destination not 16-byte aligned, host rows
// whose blocks fall outside dst_blocks or whose length exceeds table_width * block_size, token
// rows whose blocks exceed dst_blocks, or more than 65535 token rows.
cudaError_t GatherFp8LatentCacheBf16(const Fp8GatherParams& params, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_ATTENTION_MLA_FP8_GATHER_H_
