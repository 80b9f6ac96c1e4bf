// MlaPrefillBf16: absorbed MLA for prefill (see mla_prefill.h). The cuBLAS path: the kernels here
// only move data (gather the paged cache, pack the queries) and run the causal softmax, the FLOPs
// are cuBLAS's bf16 tensor-core GEMMs. The fused path: flash::FusedKernel below.
#include <cuda_bf16.h>
#include <math.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/attention/mla_prefill.h"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/common/kernel_facts.h"

namespace deepinfer {
namespace kernels {
namespace {

using sm80::CopyAsync16;
using sm80::CopyAsyncCommit;
using sm80::CopyAsyncWait;
using sm80::LdMatrixX4;
using sm80::MmaBf16;
using sm80::PackBf16;
using sm80::SharedAddr;
using sm80::Swizzled;

constexpr int kThreads = 256;
constexpr int kVec = 8;  // elements per thread-step of the copy kernels (16 bytes of bf16)
// Soft cap on the workspace: sequences of a batch and query rows of a chunk are cut down until
// the chunk's buffers fit (never below one sequence and one token).
constexpr size_t kWorkspaceBudget = size_t{256} << 20;
constexpr size_t kAlign = 256;

size_t AlignUp(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }
int64_t RoundUp8(int64_t v) { return (v + 7) / 8 * 8; }

// Eight cache elements as fp32.
__device__ __forceinline__ void LoadEight(const float* src, float* v) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = src[i];
}
__device__ __forceinline__ void LoadEight(const uint16_t* src, float* v) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = __uint_as_float(static_cast<uint32_t>(src[i]) << 16);
}

__device__ __forceinline__ void StoreEightBf16(__nv_bfloat16* dst, const float* v) {
  __align__(16) __nv_bfloat16 b[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) b[i] = __float2bfloat16_rn(v[i]);
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(b);
}

// keys[g, j, :] = bf16(cache entry j of sequence seq0 + g), j < len, for g < batch.
template <typename T>
__global__ void GatherKeysKernel(const T* cache, int block_size, int dim, const int32_t* tables,
                                 int max_blocks, int seq0, int64_t len, int64_t batch,
                                 __nv_bfloat16* keys) {
  const int vecs = dim / kVec;
  const int64_t total = batch * len * vecs;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < total;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = v / vecs;
    const int c = static_cast<int>(v - row * vecs) * kVec;
    const int64_t g = row / len, j = row - g * len;
    const int32_t block = tables[(seq0 + g) * max_blocks + j / block_size];
    const T* src = cache + (static_cast<int64_t>(block) * block_size + j % block_size) * dim + c;
    float e[kVec];
    LoadEight(src, e);
    StoreEightBf16(keys + row * dim + c, e);
  }
}

// q[g, r, :] = bf16([q_latent | q_rope] of query row r of this chunk of sequence g), where row r
// is token first_token + g * seq_stride + r / heads, head r % heads.
__global__ void PackQueriesKernel(MlaPrefillParams p, int64_t first_token, int64_t seq_stride,
                                  int64_t rows, int64_t batch, __nv_bfloat16* q) {
  const int latent = p.latent_dim, dim = latent + p.rope_dim, vecs = dim / kVec;
  const int64_t total = batch * rows * vecs;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < total;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = v / vecs;
    const int c = static_cast<int>(v - row * vecs) * kVec;
    const int64_t g = row / rows, r = row - g * rows;
    const int64_t t = first_token + g * seq_stride + r / p.num_heads, h = r % p.num_heads;
    const float* src =
        c < latent ? p.q_latent + (t * p.num_heads + h) * latent + c
                   : p.q_rope + t * p.q_rope_token_stride + h * p.q_rope_head_stride + (c - latent);
    float e[kVec];
    LoadEight(src, e);
    StoreEightBf16(q + row * dim + c, e);
  }
}

__device__ __forceinline__ float BlockReduce(float v, bool is_max, float* shared) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // shared is reused by consecutive reductions
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? shared[lane] : (is_max ? -INFINITY : 0.0f);
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  return v;
}

// One block per query row of the chunk (all sequences of the batch): P = softmax of the row's
// visible scores (keys 0 .. past + token), rounded to bf16, zero for the masked keys up to ld.
// Row r of sequence g is token first + (r % rows) / heads of that sequence.
__global__ void __launch_bounds__(kThreads)
    CausalSoftmaxKernel(const float* scores, int64_t ld, int64_t rows, int heads,
                        int64_t visible_base, __nv_bfloat16* probs) {
  __shared__ float shared[kThreads / 32];
  const int64_t row = blockIdx.x;
  const int64_t visible = visible_base + (row % rows) / heads;
  const float* s = scores + row * ld;
  __nv_bfloat16* out = probs + row * ld;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < visible; j += kThreads) mx = fmaxf(mx, s[j]);
  mx = BlockReduce(mx, true, shared);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < visible; j += kThreads) sum += expf(s[j] - mx);
  sum = BlockReduce(sum, false, shared);
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < ld; j += kThreads) {
    out[j] = __float2bfloat16_rn(j < visible ? expf(s[j] - mx) * inv : 0.0f);
  }
}

unsigned GridFor(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 65535 * 16));
}

// A run of `count` sequences starting at sequences[first], all with the same shape, sharing
// every launch; query chunks of `chunk_tokens` tokens.
struct Batch {
  int32_t first = 0, count = 0;
  int64_t tokens = 0, context = 0, chunk_tokens = 0;
};

// Buffer offsets inside the workspace for one batch.
struct Layout {
  size_t keys = 0, queries = 0, scores = 0, probs = 0, total = 0;
};

Layout LayoutFor(const MlaPrefillParams& p, const Batch& b) {
  const int64_t dim = p.latent_dim + p.rope_dim;
  const int64_t rows = b.chunk_tokens * p.num_heads;
  const int64_t ld = RoundUp8(b.context);
  Layout l;
  l.keys = 0;
  l.queries = AlignUp(static_cast<size_t>(b.count * b.context * dim) * 2);
  l.scores = l.queries + AlignUp(static_cast<size_t>(b.count * rows * dim) * 2);
  l.probs = l.scores + AlignUp(static_cast<size_t>(b.count * rows * ld) * 4);
  l.total = l.probs + AlignUp(static_cast<size_t>(b.count * rows * ld) * 2);
  return l;
}

bool Valid(const MlaPrefillParams& p) {
  if (p.num_heads <= 0 || p.latent_dim <= 0 || p.latent_dim % kVec != 0 || p.rope_dim < 0 ||
      p.rope_dim % kVec != 0 || p.block_size <= 0 || p.num_sequences < 0 ||
      (p.num_sequences > 0 && p.sequences == nullptr) || p.chunk_rows < 0) {
    return false;
  }
  for (int32_t i = 0; i < p.num_sequences; ++i) {
    const MlaPrefillSequence& s = p.sequences[i];
    if (s.num_tokens <= 0 || s.num_tokens > s.context_len || s.first_token < 0 || s.seq < 0 ||
        static_cast<int64_t>(s.context_len) >
            static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size) {
      return false;
    }
  }
  return true;
}

// Splits the sequences into batches: consecutive sequences (next block-table row, next tokens)
// with equal shapes, as many as the workspace budget allows.
std::vector<Batch> PlanBatches(const MlaPrefillParams& p) {
  const int64_t want_rows = p.chunk_rows > 0 ? p.chunk_rows : kMlaPrefillChunkRows;
  std::vector<Batch> batches;
  for (int32_t i = 0; i < p.num_sequences;) {
    const MlaPrefillSequence& s = p.sequences[i];
    Batch b;
    b.first = i;
    b.tokens = s.num_tokens;
    b.context = s.context_len;
    // Chunk rows: the request, cut so that one sequence's scores + probabilities (6 bytes per
    // score) fit half the budget.
    const int64_t fit_rows = static_cast<int64_t>(kWorkspaceBudget / 2) / (6 * RoundUp8(b.context));
    const int64_t rows = std::max<int64_t>(p.num_heads, std::min(want_rows, fit_rows));
    b.chunk_tokens = std::min<int64_t>(b.tokens, std::max<int64_t>(1, rows / p.num_heads));
    b.count = 1;
    while (i + b.count < p.num_sequences) {
      const MlaPrefillSequence& prev = p.sequences[i + b.count - 1];
      const MlaPrefillSequence& next = p.sequences[i + b.count];
      if (next.num_tokens != s.num_tokens || next.context_len != s.context_len ||
          next.seq != prev.seq + 1 || next.first_token != prev.first_token + prev.num_tokens) {
        break;
      }
      Batch more = b;
      more.count = b.count + 1;
      if (LayoutFor(p, more).total > kWorkspaceBudget) break;
      b.count = more.count;
    }
    batches.push_back(b);
    i += b.count;
  }
  return batches;
}

// ---------------------------------------------------------------------------------------------
// The fused kernel (MlaPrefillKernel::kFused): flash attention for absorbed MLA.
//
// A block takes 64 query rows of one sequence (rows are (token, head) pairs, token-major, so 4
// tokens at 16 heads, half a token at 128: every row scores the same keys) and streams the
// sequence's keys in tiles of 64 from the paged bf16 cache. Shared memory, the constraint at
// 576 bf16 per row: Q tile 72 KiB + two key tiles 144 KiB (cp.async double buffering) + P 8 KiB
// + row statistics 2 KiB = 226 KiB, one block (8 warps) per SM. 32-key tiles would leave room
// for nothing more (the Q tile stays) and halve each warp's work per barrier; 128 keys or 128
// rows do not fit. Warp w owns rows 32 * (w / 4) .. + 32 in both phases:
//   S = Q K^T: its 32 rows x keys 16 * (w % 4) .. + 16 over the 576 columns (36 k-steps of
//     mma.m16n8k16), scaled and masked (key > position: -inf) in registers;
//   the row max and sum of the tile are combined across the 4 warps of a row group in shared
//     memory (every warp keeps the same running max m and sum l for its rows in registers);
//   P = exp(S - m) rounded to bf16 into shared memory;
//   O[32 rows x latent columns 128 * (w % 4) .. + 128] = O * exp(m_old - m) + P V (V = the
//     latent columns of the key tile, ldmatrix.trans): 128 fp32 accumulators per thread.
// Rows of shared tiles are 72 16-byte chunks; chunk c of row r sits at c ^ (r % 8), so the 8
// rows an ldmatrix reads fall in 8 different bank groups.
namespace flash {

constexpr int kRows = 64, kKeys = 64, kLatent = 512, kRope = 64, kDim = kLatent + kRope;
constexpr int kChunks = kDim / 8;    // 16-byte chunks per row
constexpr int kRowBytes = kDim * 2;  // 1152
constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kTileBytes = kRows * kRowBytes;  // Q tile; a key tile is the same size
constexpr int kPBytes = kRows * kKeys * 2;
constexpr int kStatBytes = 2 * 4 * kRows * 4;  // partial row max and sum of the 4 key slices
constexpr int kSmemBytes = 3 * kTileBytes + kPBytes + kStatBytes;
constexpr int kMaxSeqs = 64;  // sequences per launch (kernel parameter space)

struct Seq {
  int32_t seq, first_token, num_tokens, context_len, tiles;
};

struct Args {
  const float* q_latent;
  const float* q_rope;
  int64_t q_rope_token_stride, q_rope_head_stride;
  const __nv_bfloat16* cache;
  int32_t block_size, max_blocks, heads;
  int32_t max_tiles;  // tiles of the launch's longest sequence; block y covers tile
  int32_t y_offset;   // max_tiles - 1 - (y_offset + blockIdx.y)
  const int32_t* tables;
  float scale_log2;  // softmax_scale * log2(e): scores in the exp2 domain
  float* out;
  Seq seqs[kMaxSeqs];
};

// Starts the copy of key tile kt (keys kt * 64 ..) of sequence s into `tile`; keys at or past
// kv_end are zero-filled. Thread t copies chunks t % 4, t % 4 + 4, ... of key t / 4.
__device__ __forceinline__ void LoadKeyTile(const Args& a, const Seq& s, int kt, int kv_end,
                                            uint32_t tile) {
  const int key = threadIdx.x / 4, first = threadIdx.x % 4;
  const int pos = kt * kKeys + key;
  const bool valid = pos < kv_end;
  const __nv_bfloat16* src = a.cache;
  if (valid) {
    const int32_t block = a.tables[static_cast<int64_t>(s.seq) * a.max_blocks + pos / a.block_size];
    src += (static_cast<int64_t>(block) * a.block_size + pos % a.block_size) * kDim;
  }
#pragma unroll
  for (int c = first; c < kChunks; c += 4) {
    CopyAsync16(tile + Swizzled<kRowBytes>(key, c), valid ? src + c * 8 : a.cache, valid);
  }
}

// (Compiled for older virtual architectures too, where the mma / ldmatrix / cp.async helpers are
// empty: UseFused checks the kernel's PTX version before launching it.)
__global__ void __launch_bounds__(kThreads, 1) FusedKernel(const __grid_constant__ Args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Seq& s = a.seqs[blockIdx.x];
  // The tiles with the most keys first (the causal triangle's long rows).
  const int tile = a.max_tiles - 1 - (a.y_offset + static_cast<int>(blockIdx.y));
  if (tile >= s.tiles) return;
  const int heads = a.heads;
  const int64_t rows_total = static_cast<int64_t>(s.num_tokens) * heads;
  const int64_t row0 = static_cast<int64_t>(tile) * kRows;
  const int past = s.context_len - s.num_tokens;  // position of the first new token
  const int64_t last_row = min(row0 + kRows, rows_total) - 1;
  const int kv_end = past + static_cast<int>(last_row / heads) + 1;  // keys the block's rows see
  const int num_kt = (kv_end + kKeys - 1) / kKeys;

  unsigned char* q_smem = smem;
  const uint32_t q_tile = SharedAddr(q_smem);
  const uint32_t k_tile[2] = {q_tile + kTileBytes, q_tile + 2 * kTileBytes};
  const uint32_t p_tile = q_tile + 3 * kTileBytes;
  float* red_max = reinterpret_cast<float*>(smem + 3 * kTileBytes + kPBytes);  // [4][kRows]
  float* red_sum = red_max + 4 * kRows;                                        // [4][kRows]

  LoadKeyTile(a, s, 0, kv_end, k_tile[0]);
  CopyAsyncCommit();

  // Q tile: rows past the sequence's last are zero (they score 0 and are never written).
  for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const int64_t row = row0 + r;
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (row < rows_total) {
      const int64_t t = s.first_token + row / heads;
      const int64_t h = row % heads;
      if (c < kLatent / 8) {
        const float4* src =
            reinterpret_cast<const float4*>(a.q_latent + (t * heads + h) * kLatent + c * 8);
        const float4 x = src[0], y = src[1];
        v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w, v[4] = y.x, v[5] = y.y, v[6] = y.z,
        v[7] = y.w;
      } else {
        const float* src =
            a.q_rope + t * a.q_rope_token_stride + h * a.q_rope_head_stride + (c - kLatent / 8) * 8;
        const float4 x = reinterpret_cast<const float4*>(src)[0];
        const float4 y = reinterpret_cast<const float4*>(src)[1];
        v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w, v[4] = y.x, v[5] = y.y, v[6] = y.z,
        v[7] = y.w;
      }
    }
    uint4 packed;
    packed.x = PackBf16(v[0], v[1]);
    packed.y = PackBf16(v[2], v[3]);
    packed.z = PackBf16(v[4], v[5]);
    packed.w = PackBf16(v[6], v[7]);
    *reinterpret_cast<uint4*>(q_smem + Swizzled<kRowBytes>(r, c)) = packed;
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wr = warp / 4, wc = warp % 4;  // row group (32 rows), key slice / latent quarter
  const int g = lane / 4, t4 = lane % 4;
  // This thread's 4 accumulator rows: rr = 2 * mi + half -> row wr*32 + mi*16 + half*8 + g.
  int row_of[4], pos_of[4];
#pragma unroll
  for (int rr = 0; rr < 4; ++rr) {
    row_of[rr] = wr * 32 + (rr / 2) * 16 + (rr % 2) * 8 + g;
    const int64_t row = min(row0 + row_of[rr], last_row);  // padding rows: see all keys
    pos_of[rr] = past + static_cast<int>(row / heads);
  }
  float m[4], l[4];
#pragma unroll
  for (int rr = 0; rr < 4; ++rr) m[rr] = -INFINITY, l[rr] = 0.0f;
  float o[2][16][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int nj = 0; nj < 16; ++nj)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mi][nj][e] = 0.0f;

  // ldmatrix lane addresses (before the tile base and k offset).
  const int a_row = lane % 16, a_chunk = lane / 16;                                  // A: Q and P
  const int b_key = wc * 16 + lane % 8 + (lane / 16) * 8, b_chunk = (lane / 8) % 2;  // B: K
  const int v_key = lane % 8 + ((lane / 8) % 2) * 8, v_chunk = lane / 16;            // B: V (trans)

  for (int kt = 0; kt < num_kt; ++kt) {
    CopyAsyncWait<0>();
    __syncthreads();  // tile kt (and Q) visible; every warp is done with tile kt - 1
    if (kt + 1 < num_kt) {
      LoadKeyTile(a, s, kt + 1, kv_end, k_tile[(kt + 1) & 1]);
      CopyAsyncCommit();
    }
    const uint32_t kb = k_tile[kt & 1];

    float sc[2][2][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int ni = 0; ni < 2; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[mi][ni][e] = 0.0f;
#pragma unroll 4
    for (int kk = 0; kk < kChunks / 2; ++kk) {
      uint32_t qa[2][4], kf[4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const int r = wr * 32 + mi * 16 + a_row;
        LdMatrixX4<false>(qa[mi], q_tile + Swizzled<kRowBytes>(r, kk * 2 + a_chunk));
      }
      LdMatrixX4<false>(kf, kb + Swizzled<kRowBytes>(b_key, kk * 2 + b_chunk));
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        MmaBf16(sc[mi][0], qa[mi], kf[0], kf[1]);
        MmaBf16(sc[mi][1], qa[mi], kf[2], kf[3]);
      }
    }

    // Scale, mask, this warp's row maxima over its 16 keys.
    float part[4];
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) part[rr] = -INFINITY;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int ni = 0; ni < 2; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int rr = mi * 2 + e / 2;
          const int key = kt * kKeys + wc * 16 + ni * 8 + 2 * t4 + (e & 1);
          const float v = key <= pos_of[rr] ? sc[mi][ni][e] * a.scale_log2 : -INFINITY;
          sc[mi][ni][e] = v;
          part[rr] = fmaxf(part[rr], v);
        }
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      part[rr] = fmaxf(part[rr], __shfl_xor_sync(0xffffffffu, part[rr], 1));
      part[rr] = fmaxf(part[rr], __shfl_xor_sync(0xffffffffu, part[rr], 2));
      if (t4 == 0) red_max[wc * kRows + row_of[rr]] = part[rr];
    }
    __syncthreads();
    float alpha[4];
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const int r = row_of[rr];
      const float mx = fmaxf(fmaxf(fmaxf(m[rr], red_max[r]), red_max[kRows + r]),
                             fmaxf(red_max[2 * kRows + r], red_max[3 * kRows + r]));
      // Every row sees key 0 in tile 0, so mx is finite from then on.
      alpha[rr] = exp2f(m[rr] - mx);
      m[rr] = mx;
      part[rr] = 0.0f;
    }
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int ni = 0; ni < 2; ++ni)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int rr = mi * 2 + half;
          const float p0 = exp2f(sc[mi][ni][2 * half] - m[rr]);
          const float p1 = exp2f(sc[mi][ni][2 * half + 1] - m[rr]);
          part[rr] += p0 + p1;
          const int r = row_of[rr];
          *reinterpret_cast<uint32_t*>(smem + 3 * kTileBytes + r * (kKeys * 2) +
                                       (((wc * 2 + ni) ^ (r & 7)) << 4) + 4 * t4) =
              PackBf16(p0, p1);
        }
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      part[rr] += __shfl_xor_sync(0xffffffffu, part[rr], 1);
      part[rr] += __shfl_xor_sync(0xffffffffu, part[rr], 2);
      if (t4 == 0) red_sum[wc * kRows + row_of[rr]] = part[rr];
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const int r = row_of[rr];
      l[rr] = l[rr] * alpha[rr] + (red_sum[r] + red_sum[kRows + r]) +
              (red_sum[2 * kRows + r] + red_sum[3 * kRows + r]);
    }
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
      for (int nj = 0; nj < 16; ++nj) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mi][nj][e] *= alpha[mi * 2 + e / 2];
      }
    }

    // O += P V over the tile's 64 keys (4 k-steps), latent columns wc * 128 .. + 128.
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      uint32_t pa[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const int r = wr * 32 + mi * 16 + a_row;
        LdMatrixX4<false>(pa[mi], p_tile + r * (kKeys * 2) + (((ks * 2 + a_chunk) ^ (r & 7)) << 4));
      }
      const int vr = ks * 16 + v_key;
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
        uint32_t vf[4];
        LdMatrixX4<true>(vf, kb + Swizzled<kRowBytes>(vr, wc * 16 + nb * 2 + v_chunk));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          MmaBf16(o[mi][2 * nb], pa[mi], vf[0], vf[1]);
          MmaBf16(o[mi][2 * nb + 1], pa[mi], vf[2], vf[3]);
        }
      }
    }
  }

  // O / l into out_latent (fp32), rows of this sequence only.
#pragma unroll
  for (int rr = 0; rr < 4; ++rr) {
    const int64_t row = row0 + row_of[rr];
    if (row >= rows_total) continue;
    const float inv = 1.0f / l[rr];
    float* dst =
        a.out + (static_cast<int64_t>(s.first_token) * heads + row) * kLatent + wc * 128 + 2 * t4;
    const int mi = rr / 2, e0 = (rr % 2) * 2;
#pragma unroll
    for (int nj = 0; nj < 16; ++nj) {
      *reinterpret_cast<float2*>(dst + nj * 8) =
          make_float2(o[mi][nj][e0] * inv, o[mi][nj][e0 + 1] * inv);
    }
  }
}

}  // namespace flash

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The shapes the fused kernel is written for (the device is checked separately).
bool FusedShape(const MlaPrefillParams& p) {
  return p.cache_dtype == MlaCacheDType::kBFloat16 && p.latent_dim == flash::kLatent &&
         p.rope_dim == flash::kRope && Aligned16(p.cache) && Aligned16(p.q_latent) &&
         Aligned16(p.q_rope) && p.q_rope_token_stride % 4 == 0 && p.q_rope_head_stride % 4 == 0;
}

bool FusedRuns(const MlaPrefillParams& p) {
  if (!FusedShape(p)) return false;
  // The first call also raises the fused kernel's dynamic shared-memory limit to kSmemBytes.
  const KernelFacts f = KernelFactsForCurrentDevice(
      reinterpret_cast<const void*>(flash::FusedKernel), flash::kSmemBytes);
  return f.error == cudaSuccess && f.ptx_version >= 80 && f.max_smem >= flash::kSmemBytes;
}

// kAuto's choice for one sequence, from mla_prefill_bench on the H200 (docs/cuda/prefill.md): the
// fused kernel won every measured case with context <= 1024 (1.02x - 1.6x) and lost every one with
// more (1 x 4096: 0.91x; 16 .. 512 new tokens after 2048 cached: 0.2x - 0.8x), where its
// per-tile rate (~160 TFLOP/s) is below cuBLAS's large GEMMs and few query tiles each stream
// many keys serially. Hence: context <= 1024 and at least as many query tiles as key tiles.
constexpr int32_t kFusedMaxContext = 1024;

bool FusedWins(const MlaPrefillSequence& s, int32_t heads) {
  const int64_t query_tiles =
      (static_cast<int64_t>(s.num_tokens) * heads + flash::kRows - 1) / flash::kRows;
  const int64_t key_tiles = (s.context_len + flash::kKeys - 1) / flash::kKeys;
  return s.context_len <= kFusedMaxContext && query_tiles >= key_tiles;
}

// Whether MlaPrefillBf16 runs the fused kernel for valid params p (one choice per call).
bool UseFused(const MlaPrefillParams& p) {
  if (p.kernel == MlaPrefillKernel::kCublas || !FusedRuns(p)) return false;
  if (p.kernel == MlaPrefillKernel::kFused) return true;
  for (int32_t i = 0; i < p.num_sequences; ++i) {
    if (!FusedWins(p.sequences[i], p.num_heads)) return false;
  }
  return true;
}

// One launch per 64 sequences (and per 65535 tiles of the longest one).
cudaError_t RunFused(const MlaPrefillParams& p, cudaStream_t stream) {
  flash::Args a{};
  a.q_latent = p.q_latent;
  a.q_rope = p.q_rope;
  a.q_rope_token_stride = p.q_rope_token_stride;
  a.q_rope_head_stride = p.q_rope_head_stride;
  a.cache = static_cast<const __nv_bfloat16*>(p.cache);
  a.block_size = p.block_size;
  a.max_blocks = p.max_blocks_per_seq;
  a.heads = p.num_heads;
  a.tables = p.block_tables;
  a.scale_log2 = p.softmax_scale * 1.4426950408889634f;
  a.out = p.out_latent;
  constexpr int32_t kMaxGridY = 65535;
  for (int32_t first = 0; first < p.num_sequences; first += flash::kMaxSeqs) {
    const int32_t n = std::min(flash::kMaxSeqs, p.num_sequences - first);
    int64_t max_tiles = 0;
    for (int32_t i = 0; i < n; ++i) {
      const MlaPrefillSequence& s = p.sequences[first + i];
      const int64_t tiles =
          (static_cast<int64_t>(s.num_tokens) * p.num_heads + flash::kRows - 1) / flash::kRows;
      if (tiles > INT32_MAX) return cudaErrorInvalidValue;
      a.seqs[i] = {s.seq, s.first_token, s.num_tokens, s.context_len, static_cast<int32_t>(tiles)};
      max_tiles = std::max(max_tiles, tiles);
    }
    a.max_tiles = static_cast<int32_t>(max_tiles);
    for (int64_t y0 = 0; y0 < max_tiles; y0 += kMaxGridY) {
      a.y_offset = static_cast<int32_t>(y0);
      const dim3 grid(static_cast<unsigned>(n),
                      static_cast<unsigned>(std::min<int64_t>(kMaxGridY, max_tiles - y0)));
      flash::FusedKernel<<<grid, flash::kThreads, flash::kSmemBytes, stream>>>(a);
      const cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) return e;
    }
  }
  return cudaSuccess;
}

}  // namespace

bool MlaPrefillFusedSupported(const MlaPrefillParams& params) {
  return Valid(params) && FusedRuns(params);
}

bool MlaPrefillUsesFused(const MlaPrefillParams& params) {
  return Valid(params) && UseFused(params);
}

size_t MlaPrefillWorkspaceBytes(const MlaPrefillParams& params) {
  if (!Valid(params) || UseFused(params)) return 0;
  size_t bytes = 0;
  for (const Batch& b : PlanBatches(params)) bytes = std::max(bytes, LayoutFor(params, b).total);
  return bytes;
}

cudaError_t MlaPrefillBf16(const MlaPrefillParams& p, cublasHandle_t blas, cudaStream_t stream,
                           cublasStatus_t* blas_status) {
  if (blas_status != nullptr) *blas_status = CUBLAS_STATUS_SUCCESS;
  if (p.num_sequences == 0) return cudaSuccess;
  if (!Valid(p)) return cudaErrorInvalidValue;
  if (p.kernel == MlaPrefillKernel::kFused && !FusedRuns(p)) return cudaErrorInvalidValue;
  if (UseFused(p)) return RunFused(p, stream);
  const std::vector<Batch> batches = PlanBatches(p);
  size_t need = 0;
  for (const Batch& b : batches) need = std::max(need, LayoutFor(p, b).total);
  void* workspace = p.workspace;
  const bool own = workspace == nullptr;
  if (!own && p.workspace_bytes < need) return cudaErrorInvalidValue;
  if (own) {
    const cudaError_t e = cudaMallocAsync(&workspace, need, stream);
    if (e != cudaSuccess) return e;
  }
  cudaError_t err = cudaSuccess;
  cublasStatus_t bst = cublasSetStream(blas, stream);
  const int64_t dim = p.latent_dim + p.rope_dim;
  const float zero = 0.0f, one = 1.0f;
  for (const Batch& b : batches) {
    if (err != cudaSuccess || bst != CUBLAS_STATUS_SUCCESS) break;
    const Layout l = LayoutFor(p, b);
    char* base = static_cast<char*>(workspace);
    auto* keys = reinterpret_cast<__nv_bfloat16*>(base + l.keys);
    auto* queries = reinterpret_cast<__nv_bfloat16*>(base + l.queries);
    auto* scores = reinterpret_cast<float*>(base + l.scores);
    auto* probs = reinterpret_cast<__nv_bfloat16*>(base + l.probs);
    const MlaPrefillSequence& s0 = p.sequences[b.first];
    const int64_t past = b.context - b.tokens;  // cached positions before the new tokens
    const int64_t key_work = b.count * b.context * (dim / kVec);
    if (p.cache_dtype == MlaCacheDType::kFloat32) {
      GatherKeysKernel<float><<<GridFor(key_work), kThreads, 0, stream>>>(
          static_cast<const float*>(p.cache), p.block_size, static_cast<int>(dim), p.block_tables,
          p.max_blocks_per_seq, s0.seq, b.context, b.count, keys);
    } else {
      GatherKeysKernel<uint16_t><<<GridFor(key_work), kThreads, 0, stream>>>(
          static_cast<const uint16_t*>(p.cache), p.block_size, static_cast<int>(dim),
          p.block_tables, p.max_blocks_per_seq, s0.seq, b.context, b.count, keys);
    }
    err = cudaGetLastError();
    for (int64_t i0 = 0; i0 < b.tokens && err == cudaSuccess && bst == CUBLAS_STATUS_SUCCESS;
         i0 += b.chunk_tokens) {
      const int64_t i1 = std::min(b.tokens, i0 + b.chunk_tokens);
      const int64_t rows = (i1 - i0) * p.num_heads;
      const int64_t keys_seen = past + i1;  // the chunk's last query sees this many keys
      const int64_t ld = RoundUp8(keys_seen);
      PackQueriesKernel<<<GridFor(b.count * rows * (dim / kVec)), kThreads, 0, stream>>>(
          p, s0.first_token + i0, b.tokens, rows, b.count, queries);
      err = cudaGetLastError();
      if (err != cudaSuccess) break;
      // Row-major S[rows, keys] = Q·Kᵀ is column-major Sᵀ = K·Qᵀ: cuBLAS sees K as a
      // [dim x keys] column-major matrix, transposed.
      bst = cublasGemmStridedBatchedEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(keys_seen),
                                       static_cast<int>(rows), static_cast<int>(dim),
                                       &p.softmax_scale, keys, CUDA_R_16BF, static_cast<int>(dim),
                                       b.context * dim, queries, CUDA_R_16BF, static_cast<int>(dim),
                                       rows * dim, &zero, scores, CUDA_R_32F, static_cast<int>(ld),
                                       rows * ld, b.count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (bst != CUBLAS_STATUS_SUCCESS) break;
      CausalSoftmaxKernel<<<static_cast<unsigned>(b.count * rows), kThreads, 0, stream>>>(
          scores, ld, rows, p.num_heads, past + i0 + 1, probs);
      err = cudaGetLastError();
      if (err != cudaSuccess) break;
      // O[rows, latent] = P·C, C = the latent columns of the gathered keys (row stride dim).
      bst = cublasGemmStridedBatchedEx(
          blas, CUBLAS_OP_N, CUBLAS_OP_N, p.latent_dim, static_cast<int>(rows),
          static_cast<int>(keys_seen), &one, keys, CUDA_R_16BF, static_cast<int>(dim),
          b.context * dim, probs, CUDA_R_16BF, static_cast<int>(ld), rows * ld, &zero,
          p.out_latent + (s0.first_token + i0) * p.num_heads * p.latent_dim, CUDA_R_32F,
          p.latent_dim, b.tokens * p.num_heads * p.latent_dim, b.count, CUBLAS_COMPUTE_32F,
          CUBLAS_GEMM_DEFAULT);
    }
  }
  if (own) {
    const cudaError_t f = cudaFreeAsync(workspace, stream);
    if (err == cudaSuccess) err = f;
  }
  if (err == cudaSuccess && bst != CUBLAS_STATUS_SUCCESS) {
    if (blas_status != nullptr) *blas_status = bst;
    err = cudaErrorUnknown;
  }
  return err;
}

}  // namespace kernels
}  // namespace deepinfer
