// The flash kernels of MhaPrefillBf16 (mha_prefill.h): mha::FlashKernel (64 query rows a block)
// and mha::FlashWideKernel (128), with the launch arguments (mha::Args) they share. Included
// only by mha_prefill.cu, which plans the groups, gathers and expands the keys and launches them.
#ifndef DEEPINFER_KERNELS_ATTENTION_MHA_PREFILL_FLASH_CUH_
#define DEEPINFER_KERNELS_ATTENTION_MHA_PREFILL_FLASH_CUH_

#include <cuda_bf16.h>
#include <math.h>

#include <cstdint>

#include "kernels/attention/mma_sm80.cuh"

namespace deepinfer {
namespace kernels {
namespace mha {

using sm80::CopyAsync16;
using sm80::CopyAsyncCommit;
using sm80::CopyAsyncWait;
using sm80::LdMatrixX4;
using sm80::MmaBf16;
using sm80::PackBf16;
using sm80::SharedAddr;
using sm80::Swizzled;

// -------------------------------------------------------------------------------------------
// The flash kernel. A block (4 warps) takes 64 query tokens of one (sequence, head); warp w owns
// rows 16w .. 16w + 15 for the whole key range (no cross-warp reductions): S = Q K^T over 192
// columns (12 k-steps of m16n8k16, 64 keys = 8 n-tiles), scaled, masked where key > position,
// online softmax in the exp2 domain in registers, then P (the S accumulators repacked as bf16
// A fragments, never in shared memory) times V (ldmatrix.trans) into 16 x 128 fp32
// accumulators. Shared memory: Q 24 KiB + two (K 24 KiB + V 16 KiB) tiles (cp.async double
// buffering) = 104 KiB, two blocks per SM. Rows of shared tiles are 16-byte chunks; chunk c of
// row r sits at c ^ (r % 8), so the 8 rows an ldmatrix reads fall in 8 different bank groups.
constexpr int kRows = 64, kKeys = 64, kNope = 128, kRope = 64, kQk = kNope + kRope, kV = 128;
constexpr int kWarps = 4, kThreads = kWarps * 32;
constexpr int kQkChunks = kQk / 8;  // 24
constexpr int kQkRowBytes = kQk * 2;
constexpr int kVRowBytes = kV * 2;
constexpr int kQBytes = kRows * kQkRowBytes;
constexpr int kKBytes = kKeys * kQkRowBytes;
constexpr int kVBytes = kKeys * kVRowBytes;
constexpr int kSmemBytes = kQBytes + 2 * (kKBytes + kVBytes);
constexpr int kMaxSeqs = 64;  // sequences per launch (kernel parameter space)

struct Seq {
  int32_t first_token, num_tokens, context_len, key_base, tiles;
};

struct Args {
  const float* q;
  int64_t q_token_stride, q_head_stride;
  const __nv_bfloat16* entries;  // the group's gathered cache entries [keys, entry_dim]
  int32_t entry_dim, latent_dim;
  const __nv_bfloat16* kv;  // [keys, heads * (kNope + kV)]
  int32_t heads;
  int32_t max_tiles;  // query tiles of the launch's longest sequence; block z covers tile
  int32_t z_offset;   // max_tiles - 1 - (z_offset + blockIdx.z)
  // The 128-row kernel's block order (1-D grid of num_seqs * heads * max_tiles blocks): tile by
  // tile from the longest, the (sequence, head) pairs fastest, heads fastest within a sequence.
  int32_t num_seqs;
  float scale_log2;  // softmax_scale * log2(e)
  float* out;
  __nv_bfloat16* out_bf16;
  int64_t out_token_stride;
  Seq seqs[kMaxSeqs];
};

// Starts the copy of key tile kt of sequence s, head h: K rows (nope | shared rope key) and V
// rows; keys at or past kv_end are zero-filled. Two threads per key, 20 chunks each (16 K_nope,
// 8 rope, 16 V chunks per key, alternating).
__device__ __forceinline__ void LoadKeyTile(const Args& a, const Seq& s, int h, int kt, int kv_end,
                                            uint32_t k_tile, uint32_t v_tile) {
  const int key = threadIdx.x / 2, first = threadIdx.x % 2;
  const int pos = kt * kKeys + key;
  const bool valid = pos < kv_end;
  const int64_t row = s.key_base + (valid ? pos : 0);
  const __nv_bfloat16* kv = a.kv + row * a.heads * (kNope + kV) + h * (kNope + kV);
  const __nv_bfloat16* rope = a.entries + row * a.entry_dim + a.latent_dim;
#pragma unroll
  for (int i = 0; i < 20; ++i) {
    const int c = 2 * i + first;
    if (i < 8) {
      CopyAsync16(k_tile + Swizzled<kQkRowBytes>(key, c), kv + c * 8, valid);
    } else if (i < 12) {
      CopyAsync16(k_tile + Swizzled<kQkRowBytes>(key, c), rope + (c - 16) * 8, valid);
    } else {
      CopyAsync16(v_tile + Swizzled<kVRowBytes>(key, c - 24), kv + kNope + (c - 24) * 8, valid);
    }
  }
}

// (Compiled for older virtual architectures too, where the mma / ldmatrix / cp.async helpers are
// empty: Supported checks the kernel's PTX version before launching it.)
__global__ void __launch_bounds__(kThreads, 2) FlashKernel(const __grid_constant__ Args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int h = blockIdx.x;
  const Seq& s = a.seqs[blockIdx.y];
  // The tiles with the most keys first (the causal triangle's long rows).
  const int tile = a.max_tiles - 1 - (a.z_offset + static_cast<int>(blockIdx.z));
  if (tile >= s.tiles) return;
  const int row0 = tile * kRows;  // first query token of the block, within the sequence's new ones
  const int past = s.context_len - s.num_tokens;
  const int last_row = min(row0 + kRows, s.num_tokens) - 1;
  const int kv_end = past + last_row + 1;  // keys the block's rows see
  const int num_kt = (kv_end + kKeys - 1) / kKeys;

  const uint32_t q_tile = SharedAddr(smem);
  const uint32_t k_tile[2] = {q_tile + kQBytes, q_tile + kQBytes + kKBytes};
  const uint32_t v_tile[2] = {q_tile + kQBytes + 2 * kKBytes,
                              q_tile + kQBytes + 2 * kKBytes + kVBytes};

  LoadKeyTile(a, s, h, 0, kv_end, k_tile[0], v_tile[0]);
  CopyAsyncCommit();

  // Q tile in bf16: rows past the sequence's last are zero (never written out).
  for (int i = threadIdx.x; i < kRows * kQkChunks; i += kThreads) {
    const int r = i / kQkChunks, c = i % kQkChunks;
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (row0 + r < s.num_tokens) {
      const int64_t t = s.first_token + row0 + r;
      const float4* src =
          reinterpret_cast<const float4*>(a.q + t * a.q_token_stride + h * a.q_head_stride + c * 8);
      const float4 x = src[0], y = src[1];
      v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w, v[4] = y.x, v[5] = y.y, v[6] = y.z,
      v[7] = y.w;
    }
    uint4 packed;
    packed.x = PackBf16(v[0], v[1]);
    packed.y = PackBf16(v[2], v[3]);
    packed.z = PackBf16(v[4], v[5]);
    packed.w = PackBf16(v[6], v[7]);
    *reinterpret_cast<uint4*>(smem + Swizzled<kQkRowBytes>(r, c)) = packed;
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;
  // This thread's two accumulator rows: warp * 16 + g + 8 * half. Padding rows see every key of
  // the block (as its last row does).
  int pos_of[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    pos_of[half] = past + min(row0 + warp * 16 + g + 8 * half, last_row);
  }
  const int warp_first_pos = past + min(row0 + warp * 16, last_row);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[kV / 8][4];
#pragma unroll
  for (int nj = 0; nj < kV / 8; ++nj)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nj][e] = 0.0f;

  // ldmatrix lane addresses (before the tile base and k offset).
  const int a_row = warp * 16 + lane % 16, a_chunk = lane / 16;            // A: Q
  const int b_key = lane % 8 + (lane / 16) * 8, b_chunk = (lane / 8) % 2;  // B: K
  const int v_key = lane % 8 + ((lane / 8) % 2) * 8, v_chunk = lane / 16;  // B: V (trans)

  for (int kt = 0; kt < num_kt; ++kt) {
    CopyAsyncWait<0>();
    __syncthreads();  // tile kt (and Q) visible; every warp is done with tile kt - 1
    if (kt + 1 < num_kt) {
      LoadKeyTile(a, s, h, kt + 1, kv_end, k_tile[(kt + 1) & 1], v_tile[(kt + 1) & 1]);
      CopyAsyncCommit();
    }
    const uint32_t kb = k_tile[kt & 1], vb = v_tile[kt & 1];

    float sc[kKeys / 8][4];
#pragma unroll
    for (int ni = 0; ni < kKeys / 8; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[ni][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kQk / 16; ++kk) {
      uint32_t qa[4];
      LdMatrixX4<false>(qa, q_tile + Swizzled<kQkRowBytes>(a_row, kk * 2 + a_chunk));
#pragma unroll
      for (int nb = 0; nb < kKeys / 16; ++nb) {
        uint32_t kf[4];
        LdMatrixX4<false>(kf, kb + Swizzled<kQkRowBytes>(nb * 16 + b_key, kk * 2 + b_chunk));
        MmaBf16(sc[2 * nb], qa, kf[0], kf[1]);
        MmaBf16(sc[2 * nb + 1], qa, kf[2], kf[3]);
      }
    }

    // Scale, mask (only tiles that reach past the warp's first position), row maxima.
    const bool mask = kt * kKeys + kKeys - 1 > warp_first_pos;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int ni = 0; ni < kKeys / 8; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kt * kKeys + ni * 8 + 2 * t4 + (e & 1);
        float v = sc[ni][e] * a.scale_log2;
        if (mask && key > pos_of[e / 2]) v = -INFINITY;
        sc[ni][e] = v;
        mx[e / 2] = fmaxf(mx[e / 2], v);
      }
    float alpha[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], 1));
      mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], 2));
      // Every row sees key 0 in tile 0, so the running max is finite from then on.
      const float m_new = fmaxf(m[half], mx[half]);
      alpha[half] = exp2f(m[half] - m_new);
      m[half] = m_new;
      l[half] *= alpha[half];
    }
#pragma unroll
    for (int ni = 0; ni < kKeys / 8; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(sc[ni][e] - m[e / 2]);
        sc[ni][e] = p;
        l[e / 2] += p;  // this thread's columns; the quad's parts are summed at the end
      }
#pragma unroll
    for (int nj = 0; nj < kV / 8; ++nj)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[nj][e] *= alpha[e / 2];

#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      // O += P V: the accumulators of n-tiles 2ks, 2ks + 1 are the A fragment of k-step ks.
      uint32_t pa[4];
      pa[0] = PackBf16(sc[2 * ks][0], sc[2 * ks][1]);
      pa[1] = PackBf16(sc[2 * ks][2], sc[2 * ks][3]);
      pa[2] = PackBf16(sc[2 * ks + 1][0], sc[2 * ks + 1][1]);
      pa[3] = PackBf16(sc[2 * ks + 1][2], sc[2 * ks + 1][3]);
#pragma unroll
      for (int nb = 0; nb < kV / 16; ++nb) {
        uint32_t vf[4];
        LdMatrixX4<true>(vf, vb + Swizzled<kVRowBytes>(ks * 16 + v_key, nb * 2 + v_chunk));
        MmaBf16(o[2 * nb], pa, vf[0], vf[1]);
        MmaBf16(o[2 * nb + 1], pa, vf[2], vf[3]);
      }
    }
  }

  // O / l, rows of this sequence only.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
    const int row = row0 + warp * 16 + g + 8 * half;
    if (row >= s.num_tokens) continue;
    const float inv = 1.0f / l[half];
    const int64_t at = (s.first_token + static_cast<int64_t>(row)) * a.out_token_stride +
                       static_cast<int64_t>(h) * kV + 2 * t4;
#pragma unroll
    for (int nj = 0; nj < kV / 8; ++nj) {
      const float x = o[nj][2 * half] * inv, y = o[nj][2 * half + 1] * inv;
      if (a.out_bf16 != nullptr) {
        *reinterpret_cast<uint32_t*>(a.out_bf16 + at + nj * 8) = PackBf16(x, y);
      } else {
        *reinterpret_cast<float2*>(a.out + at + nj * 8) = make_float2(x, y);
      }
    }
  }
}

// -------------------------------------------------------------------------------------------
// The wide flash kernel (MhaFlashKernel::kRows128). A block (4 warps) takes 128 query rows of
// one (sequence, head); warp w owns rows 32w .. 32w + 31 as two 16-row m-tiles, so each K or V
// fragment read from shared memory (ldmatrix) feeds 4 MMAs instead of 2: per 64 keys a warp
// issues 104 ldmatrix.x4 for 320 MMAs where the 64-row kernel issues 92 for 160 (shared-memory
// reads, not the tensor cores, bound the 64-row kernel). Registers: 128 fp32 output accumulators
// and 2 x kWideKeys / 2 score accumulators per thread. Shared memory: Q (48 KiB), one K tile of
// kWideKeys x 384 B and one V tile of kWideKeys x 256 B: 88 KiB, two blocks per SM. The pipeline
// is FlashAttention-2's: wait K_j, barrier, start V_j (V_0 comes with K_0); S = Q K_j^T and the
// softmax; wait V_j, barrier, start K_{j+1}; O += P V_j (measured faster than 32-key tiles,
// single or double-buffered, docs/cuda/prefill.md).
// A warp whose last row is before a tile's first key skips the tile's math (it still joins the
// barriers and the loads). The softmax keeps the raw score maxima and folds scale * log2(e) into
// one FMA before ex2.approx.
constexpr int kWideRows = 128;
constexpr int kWideKeys = 64;
constexpr int kWideQBytes = kWideRows * kQkRowBytes;
constexpr int kWideSmemBytes = kWideQBytes + kWideKeys * (kQkRowBytes + kVRowBytes);

__device__ __forceinline__ float Exp2Approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Starts the copies of key tile kt: K rows (nope | shared rope key; kK = true) or V rows. Thread
// t copies chunks t % 8 + 8j of keys t / 8 + 16i; keys at or past kv_end are zero-filled. The
// swizzled chunk is 8j + (t % 8 ^ (t / 8) % 8) for every (i, j), so the destination is one
// register plus immediates (kept in registers per (i, j), the 20 destinations would not fit).
template <int kKeyTile, bool kK>
__device__ __forceinline__ void LoadWideTile(const Args& a, const Seq& s, int h, int kt, int kv_end,
                                             uint32_t tile) {
  constexpr int kRowBytes = kK ? kQkRowBytes : kVRowBytes;
  constexpr int kGroups = kRowBytes / 128;  // 8-chunk groups per key: 3 (K) or 2 (V)
  const int lo = threadIdx.x % 8, key0 = threadIdx.x / 8;
  const uint32_t dst = tile + key0 * kRowBytes + ((lo ^ (key0 % 8)) << 4);
  const int64_t kv_stride = static_cast<int64_t>(a.heads) * (kNope + kV);
#pragma unroll
  for (int i = 0; i < kKeyTile / 16; ++i) {
    const int pos = kt * kKeyTile + key0 + 16 * i;
    const bool valid = pos < kv_end;
    const int64_t row = s.key_base + (valid ? pos : 0);
    const __nv_bfloat16* kv = a.kv + row * kv_stride + h * (kNope + kV) + (kK ? 0 : kNope) + lo * 8;
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      const __nv_bfloat16* src =
          kK && j == 2 ? a.entries + row * a.entry_dim + a.latent_dim + lo * 8 : kv + j * 64;
      CopyAsync16(dst + i * 16 * kRowBytes + j * 128, src, valid);
    }
  }
}

// ldmatrix addresses of a 16-byte chunk column: rows r with r % 8 == lane % 8 (true of every A,
// B and V fragment row of a lane here), logical chunk 8q + 2j + sub sits at byte 128q + ((2j +
// sub) ^ lane % 8) * 16 of its row: base[j] (4 registers) + 128q + the row's offset.
struct ChunkAddrs {
  uint32_t base[4];
  __device__ __forceinline__ ChunkAddrs(uint32_t row_addr, int sub, int lane) {
#pragma unroll
    for (int j = 0; j < 4; ++j) base[j] = row_addr + (((2 * j + sub) ^ (lane % 8)) << 4);
  }
  // Logical chunk pair k (chunks 2k, 2k + 1: the k-th 16-column step).
  __device__ __forceinline__ uint32_t At(int k, int row_offset_bytes) const {
    return base[k % 4] + (k / 4) * 128 + row_offset_bytes;
  }
};

// A warp's running softmax state and output: m-tile mt, row half `half` (g or g + 8).
struct WideRows {
  float m[2][2], l[2][2];
  float o[2][kV / 8][4];
};

// S = Q K^T for the warp's 32 rows over the key tile at k_off bytes from k_at (kKeyTile keys),
// masked past each row's position where the tile reaches past the warp's first position, then
// the online-softmax update: sc becomes P (fp32), m / l / o rescaled.
template <int kKeyTile>
__device__ __forceinline__ void WideScores(const ChunkAddrs& q_at, const ChunkAddrs& k_at,
                                           int k_off, int kt, int my_row, int past, int last_row,
                                           int warp_first_pos, float scale_log2, int t4,
                                           float (&sc)[2][kKeyTile / 8][4], WideRows& r) {
  constexpr int kN = kKeyTile / 8;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int ni = 0; ni < kN; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[mt][ni][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kQk / 16; ++kk) {
    uint32_t qa[2][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) LdMatrixX4<false>(qa[mt], q_at.At(kk, mt * 16 * kQkRowBytes));
#pragma unroll
    for (int nb = 0; nb < kKeyTile / 16; ++nb) {
      uint32_t kf[4];
      LdMatrixX4<false>(kf, k_at.At(kk, k_off + nb * 16 * kQkRowBytes));
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        MmaBf16(sc[mt][2 * nb], qa[mt], kf[0], kf[1]);
        MmaBf16(sc[mt][2 * nb + 1], qa[mt], kf[2], kf[3]);
      }
    }
  }
  const bool mask = kt * kKeyTile + kKeyTile - 1 > warp_first_pos;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int ni = 0; ni < kN; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kt * kKeyTile + ni * 8 + 2 * t4 + (e & 1);
        // Padding rows see every key of the block, as its last row does.
        if (mask && key > past + min(my_row + mt * 16 + 8 * (e / 2), last_row)) {
          sc[mt][ni][e] = -INFINITY;
        }
        mx[e / 2] = fmaxf(mx[e / 2], sc[mt][ni][e]);
      }
    float alpha[2], ms[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], 1));
      mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], 2));
      // Every row sees key 0 in tile 0, so the running max is finite from then on.
      const float m_new = fmaxf(r.m[mt][half], mx[half]);
      alpha[half] = Exp2Approx((r.m[mt][half] - m_new) * scale_log2);
      r.m[mt][half] = m_new;
      ms[half] = m_new * scale_log2;
      r.l[mt][half] *= alpha[half];
    }
#pragma unroll
    for (int ni = 0; ni < kN; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = Exp2Approx(fmaf(sc[mt][ni][e], scale_log2, -ms[e / 2]));
        sc[mt][ni][e] = p;
        r.l[mt][e / 2] += p;  // this thread's columns; the quad's parts are summed at the end
      }
#pragma unroll
    for (int nj = 0; nj < kV / 8; ++nj)
#pragma unroll
      for (int e = 0; e < 4; ++e) r.o[mt][nj][e] *= alpha[e / 2];
  }
}

// O += P V over the V tile at v_off bytes from v_at: the accumulators of score n-tiles 2ks,
// 2ks + 1 are the A fragment of k-step ks.
template <int kKeyTile>
__device__ __forceinline__ void WideAccumulate(const ChunkAddrs& v_at, int v_off,
                                               const float (&sc)[2][kKeyTile / 8][4], WideRows& r) {
#pragma unroll
  for (int ks = 0; ks < kKeyTile / 16; ++ks) {
    uint32_t pa[2][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      pa[mt][0] = PackBf16(sc[mt][2 * ks][0], sc[mt][2 * ks][1]);
      pa[mt][1] = PackBf16(sc[mt][2 * ks][2], sc[mt][2 * ks][3]);
      pa[mt][2] = PackBf16(sc[mt][2 * ks + 1][0], sc[mt][2 * ks + 1][1]);
      pa[mt][3] = PackBf16(sc[mt][2 * ks + 1][2], sc[mt][2 * ks + 1][3]);
    }
#pragma unroll
    for (int nb = 0; nb < kV / 16; ++nb) {
      uint32_t vf[4];
      LdMatrixX4<true>(vf, v_at.At(nb, v_off + ks * 16 * kVRowBytes));
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        MmaBf16(r.o[mt][2 * nb], pa[mt], vf[0], vf[1]);
        MmaBf16(r.o[mt][2 * nb + 1], pa[mt], vf[2], vf[3]);
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads, 2) FlashWideKernel(const __grid_constant__ Args a) {
  constexpr int kKeyTile = kWideKeys;
  constexpr int kKBytes = kKeyTile * kQkRowBytes;  // V after K
  extern __shared__ __align__(128) unsigned char smem[];
  // Block -> (tile rank, pair): the longest tiles of all pairs come first.
  const int pairs = a.num_seqs * a.heads;
  const int pair = static_cast<int>(blockIdx.x) % pairs;
  const int h = pair % a.heads;
  const Seq& s = a.seqs[pair / a.heads];
  const int tile = a.max_tiles - 1 - static_cast<int>(blockIdx.x) / pairs;
  if (tile >= s.tiles) return;
  const int row0 = tile * kWideRows;
  const int past = s.context_len - s.num_tokens;
  const int last_row = min(row0 + kWideRows, s.num_tokens) - 1;
  const int kv_end = past + last_row + 1;
  const int num_kt = (kv_end + kKeyTile - 1) / kKeyTile;

  const uint32_t q_tile = SharedAddr(smem);
  const uint32_t stage0 = q_tile + kWideQBytes;

  // Tile 0's K first (V_0 follows as its own group in the loop), then Q.
  LoadWideTile<kKeyTile, true>(a, s, h, 0, kv_end, stage0);
  CopyAsyncCommit();
  CopyAsyncCommit();

  // Q tile in bf16 (rows past the sequence's last are zero, never written out): 8 chunks of 8
  // values per thread in flight at a time (read-only loads, all issued before the stores).
  constexpr int kQSteps = kWideRows * kQkChunks / kThreads, kQBatch = 8;
  static_assert(kQSteps % kQBatch == 0, "whole batches");
#pragma unroll 1
  for (int b0 = 0; b0 < kQSteps; b0 += kQBatch) {
    float4 x[kQBatch][2];
#pragma unroll
    for (int j = 0; j < kQBatch; ++j) {
      const int i = (b0 + j) * kThreads + threadIdx.x;
      const int r = i / kQkChunks, c = i % kQkChunks;
      x[j][0] = x[j][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (row0 + r < s.num_tokens) {
        const int64_t t = s.first_token + row0 + r;
        const float4* src = reinterpret_cast<const float4*>(a.q + t * a.q_token_stride +
                                                            h * a.q_head_stride + c * 8);
        x[j][0] = __ldg(src);
        x[j][1] = __ldg(src + 1);
      }
    }
#pragma unroll
    for (int j = 0; j < kQBatch; ++j) {
      const int i = (b0 + j) * kThreads + threadIdx.x;
      const int r = i / kQkChunks, c = i % kQkChunks;
      uint4 packed;
      packed.x = PackBf16(x[j][0].x, x[j][0].y);
      packed.y = PackBf16(x[j][0].z, x[j][0].w);
      packed.z = PackBf16(x[j][1].x, x[j][1].y);
      packed.w = PackBf16(x[j][1].z, x[j][1].w);
      *reinterpret_cast<uint4*>(smem + Swizzled<kQkRowBytes>(r, c)) = packed;
    }
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t4 = lane % 4;
  // Row (mt, half) of this thread: my_row + mt * 16 + 8 * half, at position past + row
  // (computed where masked: registers are short).
  const int my_row = row0 + warp * 32 + lane / 4;
  const int warp_first_pos = past + min(row0 + warp * 32, last_row);
  const int warp_last_pos = past + min(row0 + warp * 32 + 31, last_row);
  WideRows r;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) r.m[mt][half] = -INFINITY, r.l[mt][half] = 0.0f;
#pragma unroll
    for (int nj = 0; nj < kV / 8; ++nj)
#pragma unroll
      for (int e = 0; e < 4; ++e) r.o[mt][nj][e] = 0.0f;
  }

  // A: Q rows warp * 32 + lane % 16 (+ 16 per m-tile); B: K keys lane % 8 + (lane / 16) * 8
  // (+ 16 per n-pair); B: V keys lane % 8 + ((lane / 8) % 2) * 8 (+ 16 per k-step), transposed.
  const ChunkAddrs q_at(q_tile + (warp * 32 + lane % 16) * kQkRowBytes, lane / 16, lane);
  const ChunkAddrs k_at(stage0 + (lane % 8 + (lane / 16) * 8) * kQkRowBytes, (lane / 8) % 2, lane);
  const ChunkAddrs v_at(stage0 + kKBytes + (lane % 8 + ((lane / 8) % 2) * 8) * kVRowBytes,
                        lane / 16, lane);

  float sc[2][kKeyTile / 8][4];
  for (int kt = 0; kt < num_kt; ++kt) {
    CopyAsyncWait<0>();
    __syncthreads();  // K_kt (and Q) visible; every warp is done with V_{kt-1}
    LoadWideTile<kKeyTile, false>(a, s, h, kt, kv_end, stage0 + kKBytes);
    CopyAsyncCommit();
    // Key tiles past the warp's last row contribute nothing to its rows (tile 0 never is).
    const bool active = kt * kKeyTile <= warp_last_pos;
    if (active) {
      WideScores<kKeyTile>(q_at, k_at, 0, kt, my_row, past, last_row, warp_first_pos, a.scale_log2,
                           t4, sc, r);
    }
    CopyAsyncWait<0>();
    __syncthreads();  // V_kt visible; every warp is done with K_kt
    if (kt + 1 < num_kt) {
      LoadWideTile<kKeyTile, true>(a, s, h, kt + 1, kv_end, stage0);
      CopyAsyncCommit();
    }
    if (active) WideAccumulate<kKeyTile>(v_at, 0, sc, r);
  }

  // O / l, rows of this sequence only.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = r.l[mt][half];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int row = my_row + mt * 16 + 8 * half;
      if (row >= s.num_tokens) continue;
      const float inv = 1.0f / sum;
      const int64_t at = (s.first_token + static_cast<int64_t>(row)) * a.out_token_stride +
                         static_cast<int64_t>(h) * kV + 2 * t4;
#pragma unroll
      for (int nj = 0; nj < kV / 8; ++nj) {
        const float x = r.o[mt][nj][2 * half] * inv, y = r.o[mt][nj][2 * half + 1] * inv;
        if (a.out_bf16 != nullptr) {
          *reinterpret_cast<uint32_t*>(a.out_bf16 + at + nj * 8) = PackBf16(x, y);
        } else {
          *reinterpret_cast<float2*>(a.out + at + nj * 8) = make_float2(x, y);
        }
      }
    }
}

}  // namespace mha
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_ATTENTION_MHA_PREFILL_FLASH_CUH_
