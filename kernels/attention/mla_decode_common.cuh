// What the MLA decode kernels (mla_decode_grouped.cuh, mla_decode_mma.cuh,
// mla_decode_key_split.cuh, mla_decode_wgmma.cu) share: the cache element widening, FP8 codes to
// bf16, the asynchronous 16-byte copy, a key's row in the paged cache and the context split of a
// (token, split) block. Included by mla_attention.cu, which compiles the other decode kernels in
// one translation unit, and by mla_decode_wgmma.cu.
#ifndef DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_COMMON_CUH_
#define DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>

#include <cstdint>

#include "kernels/attention/mla_attention.h"
#include "kernels/attention/mma_sm80.cuh"

namespace deepinfer {
namespace kernels {
namespace mla {

using sm80::CopyAsyncCommit;
using sm80::CopyAsyncWait;
using sm80::LdMatrixX4;
using sm80::MmaBf16;
using sm80::SharedAddr;

// Cache element -> fp32.
__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
// 16-byte global -> shared copy that completes asynchronously (sm_80+; a plain copy on older
// targets, where the waits below are no-ops).
__device__ __forceinline__ void CopyAsync16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(src) : "memory");
#else
  *static_cast<float4*>(dst) = *static_cast<const float4*>(src);
#endif
}

// Four e4m3 codes of an FP8 cache entry (one word, lowest byte first) times the entry's scale,
// each fp32 product rounded to bf16 (nearest even), as two bf16x2 words (lower value in the low
// half): the values GatherFp8LatentCacheBf16 writes (mla_fp8_gather.h), which the tensor-core
// kernels' FP8 forms convert their tiles into.
__device__ __forceinline__ uint2 DequantFp8x4Bf16(uint32_t codes, float scale) {
  const __half2 lo(
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes & 0xffffu), __NV_E4M3));
  const __half2 hi(
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes >> 16), __NV_E4M3));
  const float2 a = __half22float2(lo), b = __half22float2(hi);
  const __nv_bfloat162 x = __floats2bfloat162_rn(__fmul_rn(a.x, scale), __fmul_rn(a.y, scale));
  const __nv_bfloat162 y = __floats2bfloat162_rn(__fmul_rn(b.x, scale), __fmul_rn(b.y, scale));
  return make_uint2(*reinterpret_cast<const uint32_t*>(&x), *reinterpret_cast<const uint32_t*>(&y));
}

// Where key j's entry starts: in elements of the cache's type (fp32, bf16), in bytes for an FP8
// cache (Fp8Entry below).
__device__ __forceinline__ int64_t KeyRowOffset(const MlaAttentionParams& p, const int32_t* table,
                                                int64_t j) {
  const int64_t bs = p.cache.block_size;
  const int64_t stride = p.cache.type == LatentCacheType::kFp8E4M3
                             ? p.cache.fp8_entry_bytes
                             : p.cache.latent_dim + p.cache.rope_dim;
  return (static_cast<int64_t>(table[j / bs]) * bs + j % bs) * stride;
}

// The element type tag of an FP8 cache's entries (bytes: e4m3 latent codes, bf16 rope key, fp32
// scale at the offsets of PagedLatentCache).
struct Fp8Entry {
  uint8_t byte;
};

// Sets [begin, end) to split `split`'s keys of token t's context: splits cover whole chunks of
// kChunkKeys keys, so trailing splits of a short context are empty. An empty split (only
// possible with num_splits > 1) writes the combine's "nothing here" marker (max -inf, sum 0)
// for its kHeads heads from h0 and returns true: the block has nothing else to do.
template <int kChunkKeys>
__device__ __forceinline__ void SplitRange(const MlaAttentionParams& p, int64_t t, int split,
                                           int num_splits, int64_t* begin, int64_t* end) {
  const int64_t len = p.context_len[t];
  const int64_t per_split = (len + num_splits - 1) / num_splits;
  const int64_t span = (per_split + kChunkKeys - 1) / kChunkKeys * kChunkKeys;
  *begin = split * span;
  *end = len < *begin + span ? len : *begin + span;
}

template <int kChunkKeys, int kHeads>
__device__ __forceinline__ bool SplitIsEmpty(const MlaAttentionParams& p, int64_t t, int split,
                                             int num_splits, int h0, float* ws_ml, int64_t* begin,
                                             int64_t* end) {
  SplitRange<kChunkKeys>(p, t, split, num_splits, begin, end);
  if (num_splits == 1 || *begin < *end) return false;
  if (threadIdx.x < kHeads && h0 + static_cast<int>(threadIdx.x) < p.num_heads) {
    float* ml = ws_ml + ((t * p.num_heads + h0 + threadIdx.x) * num_splits + split) * 2;
    ml[0] = -INFINITY;
    ml[1] = 0.0f;
  }
  return true;
}

}  // namespace mla
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_COMMON_CUH_
