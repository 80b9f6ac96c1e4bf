// GatherFp8LatentCacheBf16 (mla_fp8_gather.h): a block row y of the grid copies row y of the
// launch, its blocks striding over the row's (entry, piece) pairs. With latent_dim and rope_dim
// multiples of 8 and the rope key 16-byte aligned in the entry, a thread writes 8 bf16 values
// (one 16-byte store) a step: 8 latent codes (an 8-byte load) times the entry's scale, or 8 rope
// values copied; other shapes (or a source not 16-byte aligned) go one value a step.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "kernels/attention/mla_fp8_gather.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;
// Blocks a launch aims at (a few waves on the H200's 132 SMs); a row gets its share, at most
// what its longest length needs.
constexpr int64_t kTargetBlocks = 2048;

struct Launch {
  PagedLatentCache src;
  const int32_t* block_tables;
  int32_t max_blocks_per_seq;
  const int32_t* token_seq;    // token rows (host_rows false)
  const int32_t* context_len;  // token rows
  int32_t* token_seq_out;      // token rows, may be null
  uint16_t* dst;
  int32_t* dst_tables;
  int32_t table_width;
  int32_t first_row;  // host rows: the first row of this launch in the destination table
  Fp8GatherRow rows[kFp8GatherRowsPerLaunch];  // host rows
};

__device__ __forceinline__ uint16_t DequantBf16(uint8_t code, float scale) {
  const __half h(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3));
  return __bfloat16_as_ushort(__float2bfloat16_rn(__half2float(h) * scale));
}

template <bool kVec, bool kHostRows>
__global__ void __launch_bounds__(kThreads) GatherKernel(const __grid_constant__ Launch a) {
  int32_t src_row, len, dst_block, table_row;
  if constexpr (kHostRows) {
    const Fp8GatherRow& r = a.rows[blockIdx.y];
    src_row = r.src_row;
    len = r.len;
    dst_block = r.dst_block;
    table_row = a.first_row + static_cast<int32_t>(blockIdx.y);
  } else {
    const int32_t t = static_cast<int32_t>(blockIdx.y);
    src_row = a.token_seq[t];
    len = min(max(a.context_len[t], 0), a.table_width * a.src.block_size);
    dst_block = t * a.table_width;
    table_row = t;
    if (a.token_seq_out != nullptr && blockIdx.x == 0 && threadIdx.x == 0) a.token_seq_out[t] = t;
  }
  const int32_t bs = a.src.block_size;
  if (blockIdx.x == 0) {
    const int32_t blocks = (len + bs - 1) / bs;
    int32_t* table = a.dst_tables + static_cast<int64_t>(table_row) * a.table_width;
    for (int32_t j = threadIdx.x; j < a.table_width; j += kThreads) {
      table[j] = dst_block + (j < blocks ? j : max(blocks - 1, 0));
    }
  }
  const int32_t latent = a.src.latent_dim, dim = latent + a.src.rope_dim;
  const int32_t pieces = kVec ? dim / 8 : dim;  // per entry
  const int32_t latent_pieces = kVec ? latent / 8 : latent;
  const int64_t total = static_cast<int64_t>(len) * pieces;
  const int32_t* table = a.block_tables + static_cast<int64_t>(src_row) * a.max_blocks_per_seq;
  const uint8_t* cache = static_cast<const uint8_t*>(a.src.cache);
  for (int64_t v = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; v < total;
       v += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int32_t j = static_cast<int32_t>(v / pieces);
    const int32_t c = static_cast<int32_t>(v - static_cast<int64_t>(j) * pieces);
    const int64_t src_slot = static_cast<int64_t>(__ldg(table + j / bs)) * bs + j % bs;
    const uint8_t* e = cache + src_slot * a.src.fp8_entry_bytes;
    const int64_t dst_slot = (static_cast<int64_t>(dst_block) + j / bs) * bs + j % bs;
    uint16_t* d = a.dst + dst_slot * dim;
    if constexpr (kVec) {
      uint4 out;
      if (c < latent_pieces) {
        const float s = __ldg(reinterpret_cast<const float*>(e + a.src.fp8_scale_offset));
        const uint2 codes = __ldg(reinterpret_cast<const uint2*>(e) + c);
        uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint32_t src = k < 2 ? codes.x : codes.y;
          const int shift = (k % 2) * 16;
          const uint16_t lo = DequantBf16(static_cast<uint8_t>(src >> shift), s);
          const uint16_t hi = DequantBf16(static_cast<uint8_t>(src >> (shift + 8)), s);
          w[k] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
        }
        out = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
        out =
            __ldg(reinterpret_cast<const uint4*>(e + a.src.fp8_rope_offset) + (c - latent_pieces));
      }
      reinterpret_cast<uint4*>(d)[c] = out;
    } else {
      if (c < latent) {
        const float s = __ldg(reinterpret_cast<const float*>(e + a.src.fp8_scale_offset));
        d[c] = DequantBf16(e[c], s);
      } else {
        d[c] = __ldg(reinterpret_cast<const uint16_t*>(e + a.src.fp8_rope_offset) + (c - latent));
      }
    }
  }
}

unsigned BlocksPerRow(int64_t longest, int32_t pieces, int32_t rows) {
  const int64_t need = std::max<int64_t>(1, (longest * pieces + kThreads - 1) / kThreads);
  const int64_t share = std::max<int64_t>(1, kTargetBlocks / std::max(rows, 1));
  return static_cast<unsigned>(std::min<int64_t>({need, share, 65535}));
}

}  // namespace

cudaError_t GatherFp8LatentCacheBf16(const Fp8GatherParams& p, cudaStream_t stream) {
  const PagedLatentCache& s = p.src;
  if (s.type != LatentCacheType::kFp8E4M3 || !Fp8LatentCacheLayoutValid(s) || s.block_size <= 0 ||
      s.latent_dim <= 0 || s.rope_dim < 0 || p.num_rows < 0 || p.table_width <= 0 ||
      p.dst == nullptr || p.dst_tables == nullptr || reinterpret_cast<uintptr_t>(p.dst) % 16 != 0 ||
      static_cast<int64_t>(p.table_width) * s.block_size > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  if (p.num_rows == 0) return cudaSuccess;
  const int32_t dim = s.latent_dim + s.rope_dim;
  const bool vec = s.latent_dim % 8 == 0 && s.rope_dim % 8 == 0 && s.fp8_rope_offset % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(s.cache) % 16 == 0;
  const int32_t pieces = vec ? dim / 8 : dim;
  const int64_t capacity = static_cast<int64_t>(p.table_width) * s.block_size;
  Launch a{};
  a.src = s;
  a.block_tables = p.block_tables;
  a.max_blocks_per_seq = p.max_blocks_per_seq;
  a.token_seq = p.token_seq;
  a.context_len = p.context_len;
  a.token_seq_out = p.token_seq_out;
  a.dst = p.dst;
  a.dst_tables = p.dst_tables;
  a.table_width = p.table_width;
  if (p.rows == nullptr) {
    if (p.num_rows > 65535 || p.token_seq == nullptr || p.context_len == nullptr ||
        static_cast<int64_t>(p.num_rows) * p.table_width > p.dst_blocks) {
      return cudaErrorInvalidValue;
    }
    const dim3 grid(BlocksPerRow(capacity, pieces, p.num_rows), static_cast<unsigned>(p.num_rows));
    if (vec) {
      GatherKernel<true, false><<<grid, kThreads, 0, stream>>>(a);
    } else {
      GatherKernel<false, false><<<grid, kThreads, 0, stream>>>(a);
    }
    return cudaGetLastError();
  }
  for (int32_t r = 0; r < p.num_rows; ++r) {
    const Fp8GatherRow& row = p.rows[r];
    const int64_t blocks = (static_cast<int64_t>(row.len) + s.block_size - 1) / s.block_size;
    if (row.len < 0 || row.len > capacity || row.src_row < 0 || row.dst_block < 0 ||
        row.dst_block + std::max<int64_t>(blocks, 1) > p.dst_blocks) {
      return cudaErrorInvalidValue;
    }
  }
  for (int32_t r0 = 0; r0 < p.num_rows; r0 += kFp8GatherRowsPerLaunch) {
    const int32_t n = std::min(kFp8GatherRowsPerLaunch, p.num_rows - r0);
    int64_t longest = 0;
    for (int32_t i = 0; i < n; ++i) {
      a.rows[i] = p.rows[r0 + i];
      longest = std::max<int64_t>(longest, p.rows[r0 + i].len);
    }
    a.first_row = r0;
    const dim3 grid(BlocksPerRow(longest, pieces, n), static_cast<unsigned>(n));
    if (vec) {
      GatherKernel<true, true><<<grid, kThreads, 0, stream>>>(a);
    } else {
      GatherKernel<false, true><<<grid, kThreads, 0, stream>>>(a);
    }
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace kernels
}  // namespace deepinfer
