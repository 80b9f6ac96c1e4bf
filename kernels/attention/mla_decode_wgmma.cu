// The 64-head wgmma MLA decode kernel (mma_variant 10; mla_decode_wgmma.h). Hopper only: this
// translation unit is compiled for sm_90a alone.
//
// One block of two warpgroups per (token, context split, group of 64 heads), so DeepSeek-V3's
// 128 heads read a token's context twice (two blocks) instead of eight times (eight 16-head
// blocks of the key-split kernel). FlashMLA's Hopper design, written for this cache:
//   shared   Q [64 heads x 576] as bf16 (rounded once from the fp32 inputs), two key tiles of
//            64 keys x 576 bf16 (a double-buffered cp.async ring; the cache is paged, so each
//            row is gathered through the block table), P [64 x 64] bf16, and the softmax
//            exchange. Every [64 rows x 576] operand is nine 64-column chunks of 64 rows x 128
//            bytes with the 128-byte swizzle (16-byte piece c of row r at piece c ^ (r % 8)),
//            so the same key tile is the K-major B operand of the scores and, read N-major, the
//            B operand (V = its first 512 columns) of P V.
//   score    warpgroup w computes S[64 x keys 32w .. 32w + 31] = Q K^T (36 wgmma m64n32k16, A = Q
//            and B = K from shared memory); no partial sums cross warpgroups;
//   softmax  online, base 2, in registers; the two warpgroups exchange their row maxima through
//            shared memory (one barrier) so both apply the same running maximum; each keeps its
//            own keys' part of the denominator (added at the end);
//   value    each warpgroup writes its half of P (bf16) to shared memory, and after a barrier
//            accumulates O[64 x its 256 output columns] += P[64 x 64] V[64 x 256] (4 wgmma
//            m64n256k16, A = P, B = the tile's latent columns N-major): 128 fp32 accumulators
//            per thread, the 512 columns split over the two warpgroups as FlashMLA does.
// Keys past the context are zeroed in shared memory (P V never meets garbage) and score -inf.
// Q and P enter the products as bf16 (as the key-split kernel: MlaAttentionBf16Operands);
// accumulation and softmax are fp32. Splits write the workspace for mla_attention.cu's combine.
//
// kFp8: an FP8 cache (PagedLatentCache kFp8E4M3, the rope key 16-byte aligned in the entry).
// The tile's copies put each key's 512 e4m3 codes into chunks 4-7 of its own row (where the
// latent's upper half goes in bf16), the bf16 rope key into chunk 8 as for a bf16 cache, and
// the entry's scale into a small array [2 tiles][64 keys]; after the copies land each warp
// converts its own rows in place into bf16(e4m3(q) * s) (one fp32 product, nearest even: the
// values mla_fp8_gather.h's copy holds) before the tile's proxy fence and barrier, so the
// output is bit for bit the kernel's over that bf16 copy.

#include <cuda_bf16.h>
#include <math.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/attention/mla_decode_common.cuh"
#include "kernels/attention/mla_decode_wgmma.h"
#include "kernels/common/kernel_facts.h"
#include "kernels/gemm/wgmma_tma.cuh"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kHeads = kMlaWgmmaHeads;
constexpr int kKeys = kMlaWgmmaKeys;
constexpr int kLatent = kMlaWgmmaLatent;
constexpr int kDim = kMlaWgmmaLatent + kMlaWgmmaRope;  // 576
constexpr int kChunks = kDim / 64;                      // 64-column (128-byte) chunks: 9
constexpr int kThreads = 256;                           // two warpgroups
constexpr int kWgKeys = kKeys / 2;                      // keys scored per warpgroup: 32
constexpr int kWgCols = kLatent / 2;                    // output columns per warpgroup: 256
constexpr int kScoreSteps = kDim / 16;                  // 36
constexpr int kValueSteps = kKeys / 16;                 // 4
constexpr uint32_t kQChunkBytes = kHeads * 128;
constexpr uint32_t kKChunkBytes = kKeys * 128;
constexpr uint32_t kQBytes = kChunks * kQChunkBytes;
constexpr uint32_t kTileBytes = kChunks * kKChunkBytes;
constexpr uint32_t kPBytes = kHeads * kKeys * 2;
// 1024 bytes of slack to align the swizzle atoms, Q, two key tiles, P, row maxima and sums
// [2 warpgroups][64].
constexpr size_t kSmemBytes =
    1024 + kQBytes + 2 * size_t{kTileBytes} + kPBytes + 4 * kHeads * sizeof(float);
static_assert(kSmemBytes <= 227 * 1024, "fits an sm_90 block's shared memory");
// kFp8: the entries' scales [2 tiles][kKeys] after the softmax exchange.
constexpr size_t kSmemBytesFp8 = kSmemBytes + 2 * kKeys * sizeof(float);
static_assert(kSmemBytesFp8 <= 227 * 1024, "fits an sm_90 block's shared memory");
constexpr size_t SmemBytes(bool fp8) { return fp8 ? kSmemBytesFp8 : kSmemBytes; }
static_assert(kKeys == 64 && kHeads == 64, "P is one 128-byte chunk; 4 warps x 16 rows");
static_assert(kThreads / 8 * 2 == kKeys, "8 threads per key row, two rows each");
// Q float4 loads per thread, in batches.
constexpr int kQF4PerHead = kDim / 4;                         // 144
constexpr int kQLoads = kHeads * kQF4PerHead / kThreads;      // 36
constexpr int kQBatch = 12;
static_assert(kQLoads % kQBatch == 0, "whole batches");

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

using wgmma::FenceReg;
using wgmma::SmemAddr;

// Shared-memory matrix descriptor, 128-byte swizzle; lbo / sbo in bytes. K-major operands (Q, K,
// P): sbo = 1024 (8-row atoms), lbo unused (16). The N-major V: lbo = the 64-column chunk
// stride, sbo = 1024 (the next 8 keys).
__device__ __forceinline__ uint64_t Desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>(lbo >> 4) << 16;
  d |= static_cast<uint64_t>(sbo >> 4) << 32;
  d |= static_cast<uint64_t>(1) << 62;
  return d;
}

// Generic-proxy writes of shared memory (stores, cp.async) made visible to wgmma's reads.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Byte offset of 16-byte piece `piece` of row r in a 128-byte-swizzled chunk.
__device__ __forceinline__ uint32_t Swz(int r, int piece) {
  return static_cast<uint32_t>(r * 128 + ((piece ^ (r & 7)) << 4));
}

// 4-byte global -> shared copy in the current copy group (cp.async.ca: the 4-byte form).
__device__ __forceinline__ void CopyAsync4(void* dst, const void* src) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(addr), "l"(src) : "memory");
}

template <int N>
__device__ __forceinline__ void FenceRegs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) FenceReg(d[i]);
}

__device__ __forceinline__ uint32_t PackBf16(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// S[64 x 32] += A B (K-major A and B).
__device__ __forceinline__ void WgmmaScores(float (&d)[16], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "r"(1));
}

// O[64 x 256] += A B (K-major A, N-major B).
__device__ __forceinline__ void WgmmaValues(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(1));
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1)
    MlaWgmmaKernel(MlaAttentionParams p, int num_groups, int num_splits, float* ws_out,
                   float* ws_ml) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sm = smem_raw + ((1024u - (SmemAddr(smem_raw) & 1023u)) & 1023u);
  uint8_t* qs = sm;
  uint8_t* kbuf = qs + kQBytes;
  uint8_t* ps = kbuf + 2 * kTileBytes;
  float* red_max = reinterpret_cast<float*>(ps + kPBytes);  // [2][64]
  float* red_sum = red_max + 2 * kHeads;                    // [2][64]
  float* fp8_scale = red_sum + 2 * kHeads;                  // kFp8: [2 tiles][64 keys]
  const uint32_t qs_a = SmemAddr(qs), kbuf_a = SmemAddr(kbuf), ps_a = SmemAddr(ps);

  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int row0 = warp * 16 + g;  // this thread's accumulator rows: row0, row0 + 8
  const int group = blockIdx.x % num_groups;
  const int split = (blockIdx.x / num_groups) % num_splits;
  const int64_t t = blockIdx.x / num_groups / num_splits;
  const int h0 = group * kHeads;
  int64_t begin = 0, end = 0;
  if (mla::SplitIsEmpty<kKeys, kHeads>(p, t, split, num_splits, h0, ws_ml, &begin, &end)) return;

  const int32_t* table =
      p.block_tables + static_cast<int64_t>(p.token_seq[t]) * p.max_blocks_per_seq;
  const __nv_bfloat16* cache = static_cast<const __nv_bfloat16*>(p.cache.cache);
  const uint8_t* cache_fp8 = static_cast<const uint8_t*>(p.cache.cache);
  const int64_t bs = p.cache.block_size;
  // Entry stride: bf16 values, or an FP8 entry's bytes.
  const int64_t row_stride = kFp8 ? p.cache.fp8_entry_bytes : kDim;
  // Key rows: 8 threads per row (16-byte piece p8 of each of the 9 chunks), rows r0 and r0 + 32.
  const int r0 = tid >> 3, p8 = tid & 7;
  auto row_of = [&](int64_t j) -> int64_t {
    if (j >= end) return -1;
    return (static_cast<int64_t>(table[j / bs]) * bs + j % bs) * row_stride;
  };
  // kFp8: code piece c = p8 + 8 i (codes 16 c ..) of row r goes to piece p8 of chunk 4 + i, the
  // rope key's piece p8 to chunk 8, the scale to fp8_scale[buf][r]; a row past the end gets
  // zero codes, rope key and scale.
  auto load_tile_fp8 = [&](const int64_t(&rows)[2], uint8_t* dst, float* scales) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int r = r0 + 32 * k;
      uint8_t* d = dst + Swz(r, p8);
      if (rows[k] < 0) {
#pragma unroll
        for (int i = 4; i < kChunks; ++i) {
          *reinterpret_cast<uint4*>(d + i * kKChunkBytes) = make_uint4(0u, 0u, 0u, 0u);
        }
        if (p8 == 0) scales[r] = 0.0f;
      } else {
        const uint8_t* e = cache_fp8 + rows[k];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          mla::CopyAsync16(d + (4 + i) * kKChunkBytes, e + (p8 + 8 * i) * 16);
        }
        mla::CopyAsync16(d + 8 * kKChunkBytes, e + p.cache.fp8_rope_offset + p8 * 16);
        if (p8 == 0) CopyAsync4(scales + r, e + p.cache.fp8_scale_offset);
      }
    }
    mla::CopyAsyncCommit();
  };
  // kFp8: this thread's code pieces of its two rows into registers, the warp synchronised
  // (a row's bf16 values overwrite codes its other threads read; the rows' 8 threads are one
  // warp's), then piece c's 16 bf16 values into logical pieces 2 (c % 4), + 1 of chunk c / 4.
  auto convert_tile_fp8 = [&](uint8_t* tile_base, const float* scales) {
    __syncwarp();  // the scales (copied by one thread of each row) are visible
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int r = r0 + 32 * k;
      const float scale = scales[r];
      uint4 codes[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        codes[i] = *reinterpret_cast<const uint4*>(tile_base + (4 + i) * kKChunkBytes + Swz(r, p8));
      }
      __syncwarp();
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = p8 + 8 * i;
        uint8_t* chunk = tile_base + (c / 4) * kKChunkBytes;
        const uint2 v0 = mla::DequantFp8x4Bf16(codes[i].x, scale);
        const uint2 v1 = mla::DequantFp8x4Bf16(codes[i].y, scale);
        const uint2 v2 = mla::DequantFp8x4Bf16(codes[i].z, scale);
        const uint2 v3 = mla::DequantFp8x4Bf16(codes[i].w, scale);
        *reinterpret_cast<uint4*>(chunk + Swz(r, 2 * (c % 4))) = make_uint4(v0.x, v0.y, v1.x, v1.y);
        *reinterpret_cast<uint4*>(chunk + Swz(r, 2 * (c % 4) + 1)) =
            make_uint4(v2.x, v2.y, v3.x, v3.y);
      }
    }
  };
  auto load_tile = [&](const int64_t (&rows)[2], uint8_t* dst) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      uint8_t* d = dst + Swz(r0 + 32 * k, p8);
      if (rows[k] < 0) {
#pragma unroll
        for (int i = 0; i < kChunks; ++i) {
          *reinterpret_cast<uint4*>(d + i * kKChunkBytes) = make_uint4(0u, 0u, 0u, 0u);
        }
      } else {
        const __nv_bfloat16* s = cache + rows[k] + p8 * 8;
#pragma unroll
        for (int i = 0; i < kChunks; ++i) mla::CopyAsync16(d + i * kKChunkBytes, s + i * 64);
      }
    }
    mla::CopyAsyncCommit();
  };
  int64_t rows[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) rows[k] = row_of(begin + r0 + 32 * k);
  if constexpr (kFp8) {
    load_tile_fp8(rows, kbuf, fp8_scale);
  } else {
    load_tile(rows, kbuf);
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) rows[k] = row_of(begin + kKeys + r0 + 32 * k);

  // Q [64 heads x 576] -> bf16, swizzled chunks (while tile 0 is in flight).
  {
    const uintptr_t q_bases =
        reinterpret_cast<uintptr_t>(p.q_latent) | reinterpret_cast<uintptr_t>(p.q_rope);
    const bool q_vec =
        q_bases % 16 == 0 && p.q_rope_token_stride % 4 == 0 && p.q_rope_head_stride % 4 == 0;
#pragma unroll
    for (int b = 0; b < kQLoads / kQBatch; ++b) {
      float4 q[kQBatch];
#pragma unroll
      for (int i = 0; i < kQBatch; ++i) {
        const int e = tid + (b * kQBatch + i) * kThreads;
        const int hl = e / kQF4PerHead, f = e - hl * kQF4PerHead, h = h0 + hl;
        const float* src =
            4 * f < kLatent
                ? p.q_latent + (t * p.num_heads + h) * kLatent + 4 * f
                : p.q_rope + t * p.q_rope_token_stride + h * p.q_rope_head_stride + (4 * f - kLatent);
        q[i] = q_vec ? *reinterpret_cast<const float4*>(src)
                     : make_float4(src[0], src[1], src[2], src[3]);
      }
#pragma unroll
      for (int i = 0; i < kQBatch; ++i) {
        const int e = tid + (b * kQBatch + i) * kThreads;
        const int hl = e / kQF4PerHead, f = e - hl * kQF4PerHead;
        const int c = f / 16, piece = (f % 16) / 2, sub = (f & 1) * 8;
        *reinterpret_cast<uint2*>(qs + c * kQChunkBytes + Swz(hl, piece) + sub) =
            make_uint2(PackBf16(q[i].x, q[i].y), PackBf16(q[i].z, q[i].w));
      }
    }
  }

  float o[kWgCols / 2];  // O[64 x this warpgroup's 256 columns], the wgmma accumulator layout
#pragma unroll
  for (int i = 0; i < kWgCols / 2; ++i) o[i] = 0.0f;
  float run_max[2] = {-INFINITY, -INFINITY}, part_sum[2] = {0.0f, 0.0f};
  const float score_scale = p.softmax_scale * 1.4426950408889634f;  // base-2 softmax

  int tile = 0;
  for (int64_t j0 = begin; j0 < end; j0 += kKeys, ++tile) {
    mla::CopyAsyncWait<0>();  // this tile's copies (the only group in flight) landed ...
    if constexpr (kFp8) {
      // Each warp's own rows of this tile into bf16 (the other buffer is not touched).
      convert_tile_fp8(kbuf + (tile & 1) * kTileBytes, fp8_scale + (tile & 1) * kKeys);
    }
    FenceProxyAsync();        // ... (and Q's and the zero fills' stores) for wgmma ...
    __syncthreads();          // ... in every thread; the previous tile is done everywhere
    if (j0 + kKeys < end) {
      if constexpr (kFp8) {
        load_tile_fp8(rows, kbuf + ((tile + 1) & 1) * kTileBytes,
                      fp8_scale + ((tile + 1) & 1) * kKeys);
      } else {
        load_tile(rows, kbuf + ((tile + 1) & 1) * kTileBytes);
      }
#pragma unroll
      for (int k = 0; k < 2; ++k) rows[k] = row_of(j0 + 2 * kKeys + r0 + 32 * k);
    }
    const uint32_t kc = kbuf_a + (tile & 1) * kTileBytes;

    // S[64 x keys 32 wg ...] = Q K^T.
    float s[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i] = 0.0f;
    FenceRegs(s);
    wgmma::WgmmaFence();
#pragma unroll
    for (int ks = 0; ks < kScoreSteps; ++ks) {
      const uint32_t c = ks >> 2, kb = (ks & 3) * 32;
      WgmmaScores(s, Desc(qs_a + c * kQChunkBytes + kb, 16, 1024),
                  Desc(kc + c * kKChunkBytes + wg * kWgKeys * 128 + kb, 16, 1024));
    }
    wgmma::WgmmaCommit();
    wgmma::WgmmaWaitAll();
    FenceRegs(s);

    // s[4 n + 2 half + e]: row row0 + 8 half, key 32 wg + 8 n + 2 tq + e.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int64_t key = j0 + wg * kWgKeys + 8 * (i >> 2) + 2 * tq + (i & 1);
      s[i] = key < end ? s[i] * score_scale : -INFINITY;
      mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
    if (tq == 0) {
      red_max[wg * kHeads + row0] = mx[0];  // -inf where all this warpgroup's keys are past end
      red_max[wg * kHeads + row0 + 8] = mx[1];
    }
    __syncthreads();
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + 8 * r;
      // Finite: key j0 (warpgroup 0's) is in the context.
      const float m = fmaxf(run_max[r], fmaxf(red_max[row], red_max[kHeads + row]));
      alpha[r] = exp2f(run_max[r] - m);  // 0 on the first tile
      run_max[r] = m;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      s[i] = exp2f(s[i] - run_max[(i >> 1) & 1]);  // 0 past the end
      sum[(i >> 1) & 1] += s[i];
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) part_sum[r] = part_sum[r] * alpha[r] + sum[r];
    // P [64 x 64] bf16, K-major swizzled: row row0 + 8 half, keys 32 wg + 8 n + 2 tq + {0, 1}
    // are bytes 4 tq of piece 4 wg + n.
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        *reinterpret_cast<uint32_t*>(ps + Swz(row0 + 8 * half, wg * 4 + n) + 4 * tq) =
            PackBf16(s[4 * n + 2 * half], s[4 * n + 2 * half + 1]);
      }
    }
    FenceProxyAsync();
    __syncthreads();  // both halves of P are written
    if (alpha[0] != 1.0f || alpha[1] != 1.0f) {
#pragma unroll
      for (int i = 0; i < kWgCols / 2; ++i) o[i] *= alpha[(i >> 1) & 1];
    }
    // O[64 x columns 256 wg ...] += P V: k-step kk = keys 16 kk ..; V's columns 256 wg + 64 c
    // are chunk 4 wg + c (lbo), keys 8 apart are 1024 bytes apart (sbo).
    FenceRegs(o);
    wgmma::WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kValueSteps; ++kk) {
      WgmmaValues(o, Desc(ps_a + kk * 32, 16, 1024),
                  Desc(kc + 4 * wg * kKChunkBytes + kk * 16 * 128, kKChunkBytes, 1024));
    }
    wgmma::WgmmaCommit();
    wgmma::WgmmaWaitAll();
    FenceRegs(o);
  }

  // The denominators: the quad, then the two warpgroups.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    part_sum[r] += __shfl_xor_sync(0xffffffffu, part_sum[r], 1);
    part_sum[r] += __shfl_xor_sync(0xffffffffu, part_sum[r], 2);
  }
  if (tq == 0) {
    red_sum[wg * kHeads + row0] = part_sum[0];
    red_sum[wg * kHeads + row0 + 8] = part_sum[1];
  }
  __syncthreads();
  float total[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    total[r] = red_sum[row0 + 8 * r] + red_sum[kHeads + row0 + 8 * r];
  }
  // o[4 n + 2 half + e]: row row0 + 8 half, column 256 wg + 8 n + 2 tq + e.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t th = t * p.num_heads + h0 + row0 + 8 * half;
    float* dst = num_splits == 1 ? p.out_latent + th * kLatent
                                 : ws_out + (th * num_splits + split) * kLatent;
    const float scale = num_splits == 1 ? 1.0f / total[half] : 1.0f;
#pragma unroll
    for (int n = 0; n < kWgCols / 8; ++n) {
      const int c = wg * kWgCols + 8 * n + 2 * tq;
      dst[c] = o[4 * n + 2 * half] * scale;
      dst[c + 1] = o[4 * n + 2 * half + 1] * scale;
    }
    if (num_splits > 1 && wg == 0 && tq == 0) {
      float* ml = ws_ml + (th * num_splits + split) * 2;
      ml[0] = run_max[half] * 0.6931471805599453f;  // natural-log units
      ml[1] = total[half];
    }
  }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

}  // namespace

bool MlaWgmmaRuns(int device, bool fp8) {
  static std::mutex mu;
  static std::map<std::pair<int, bool>, bool>* cache = new std::map<std::pair<int, bool>, bool>();
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(device, fp8);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  // The sm_90a image runs on compute capability 9.0 only; elsewhere the function has no image.
  int major = 0, minor = 0;
  bool runs = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
                  cudaSuccess &&
              cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) ==
                  cudaSuccess &&
              major == 9 && minor == 0;
  if (runs) {
    const void* kernel = fp8 ? reinterpret_cast<const void*>(MlaWgmmaKernel<true>)
                             : reinterpret_cast<const void*>(MlaWgmmaKernel<false>);
    const KernelFacts f = KernelFactsFor(kernel, device, static_cast<int>(SmemBytes(fp8)));
    runs = f.error == cudaSuccess && static_cast<size_t>(f.max_smem) >= SmemBytes(fp8);
  }
  cache->emplace(key, runs);
  return runs;
}

cudaError_t LaunchMlaWgmma(const MlaAttentionParams& p, int num_groups, int num_splits,
                           float* ws_out, float* ws_ml, cudaStream_t stream) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  const bool fp8 = p.cache.type == LatentCacheType::kFp8E4M3;
  if (!MlaWgmmaRuns(device, fp8)) return cudaErrorInvalidDeviceFunction;  // raises the smem limit
  const int64_t blocks = static_cast<int64_t>(p.num_tokens) * num_splits * num_groups;
  if (fp8) {
    MlaWgmmaKernel<true><<<static_cast<unsigned>(blocks), kThreads, kSmemBytesFp8, stream>>>(
        p, num_groups, num_splits, ws_out, ws_ml);
  } else {
    MlaWgmmaKernel<false><<<static_cast<unsigned>(blocks), kThreads, kSmemBytes, stream>>>(
        p, num_groups, num_splits, ws_out, ws_ml);
  }
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace deepinfer
