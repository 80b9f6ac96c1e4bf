// Absorbed MLA decode attention for a few tokens (1-8 decode requests) at low latency: the same
// contract as MlaAttentionF32 (mla_attention.h), one launch and no workspace. MlaAttentionF32
// splits a lone token's context over 64 blocks of its tensor-core kernel and merges them in a
// second kernel (~19 us at 1 x 1024 on the H200 in a CUDA graph, for a 1.18 MB read: all
// latency). Here a thread-block cluster (sm_90) owns one (token, group of heads): each block of
// the cluster takes a contiguous share of the context, each of its warps a share of that, with
// the keys in registers and fp32 CUDA-core math; the warps' partial softmax results are merged
// in shared memory, then the blocks' through distributed shared memory, in a fixed order (the
// result does not depend on timing: graph replays equal eager runs bit for bit).
// Measured on the H200 (docs/cuda/bf16-and-kv-cache.md, "Few-token decode kernel", "Context-aware
// choice"; 16 heads, CUDA graph): 1 token x 512 / 1024 / 2048 / 4096 positions 7.8 / 10.2 / 14.9
// / 24.4 us against MlaAttentionF32's default key-split kernel + combine at 11.6 / 11.7 / 11.8
// / 13.6 us; 2-8 tokens lose at 4096. Its work per key is fp32 CUDA-core instructions, so its time
// grows with the context faster than the tensor-core kernel's: CudaBackend uses it for one decode
// token up to CudaTuning::mla_decode_small_max_context positions. MlaDecodeSmallOptions::form
// selects a tensor-core form of the same cluster design (16 heads a block, bf16 Q and P;
// MlaDecodeSmallForm::kTensorCore). The CUDA-core form also reads an FP8 cache (kFp8E4M3) itself:
// each latent value bf16(e4m3_to_float(q) * s), as GatherFp8LatentCacheBf16 writes it, then the
// bf16 cache's arithmetic, so its output over an FP8 cache is the bits of its output over the
// gathered bf16 copy (at the same cluster and heads per block), with half the bytes read.
#ifndef DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_SMALL_H_
#define DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_SMALL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention/mla_attention.h"

namespace deepinfer {
namespace kernels {

// The only cache shape the kernel takes (DeepSeek-V3 / Moonlight): latent 512 + rope 64, bf16 or
// FP8.
constexpr int32_t kMlaDecodeSmallLatent = 512;
constexpr int32_t kMlaDecodeSmallRope = 64;
// The largest cluster (context splits per token and head group): 16 is beyond the portable 8,
// and needs the device's consent (cudaOccupancyMaxActiveClusters).
constexpr int32_t kMlaDecodeSmallMaxCluster = 16;

// The arithmetic of the kernel.
enum class MlaDecodeSmallForm : int32_t {
  // fp32 CUDA-core math on the fp32 query and the exact bf16 keys (the header's top comment);
  // bf16 and FP8 caches.
  kCudaCore = 0,
  // Tensor cores (mma.sync m16n8k16, bf16 in, fp32 sums; mla_decode_small_mma.cu): a block
  // takes 16 heads (the MMA's M), stages 32-key tiles of cache rows in shared memory and runs
  // the online softmax over them in fp32. The scores use the query rounded to bf16 (nearest
  // even) and P . V the probabilities rounded to bf16, as MlaAttentionF32's key-split and wgmma
  // kernels (MlaAttentionBf16Operands): results match a reference on the bf16-rounded query to
  // within 2^-9 max |latent| per output element. Takes num_heads a multiple of 16 over a bf16
  // cache; other head counts and FP8 caches run kCudaCore. Launched with programmatic dependent
  // launch (kernels/common/pdl.h):
  // it may start before the preceding kernel ends and waits for it before any read.
  kTensorCore = 1,
};

struct MlaDecodeSmallOptions {
  // Blocks per cluster = context splits per (token, head group): 1, 2, 4, 8 or 16; 0 = auto.
  int32_t cluster_size = 0;
  // Heads per block of kCudaCore: 1, 2 or 4; 0 = auto (kTensorCore always takes 16).
  int32_t heads_per_block = 0;
  MlaDecodeSmallForm form = MlaDecodeSmallForm::kCudaCore;
};

// True when MlaDecodeSmall takes these params on the current device: a bf16 or FP8 cache of latent
// 512 + rope 64 at a 16-byte-aligned address (FP8: Fp8LatentCacheLayoutValid with the rope key
// 4-byte aligned in the entry), q_latent 16-byte aligned, 1 to 65535 tokens, and a device and
// binary with thread-block clusters (sm_90 code).
bool MlaDecodeSmallSupported(const MlaAttentionParams& params);

// The form MlaDecodeSmall runs for these params and options: options.form, except kCudaCore
// for a kTensorCore request over an FP8 cache, or whose num_heads is not a multiple of 16 (or on
// a device where the tensor-core kernel does not run).
MlaDecodeSmallForm MlaDecodeSmallFormFor(const MlaAttentionParams& params,
                                         const MlaDecodeSmallOptions& options);

// The (cluster size, heads per block) MlaDecodeSmall runs for these params and options: the
// given values, and for each 0 the first of cluster 8, 4, 2, 1 and heads 1, 2, 4 (in that
// order) whose tokens x head groups clusters all fit on the device at once
// (cudaOccupancyMaxActiveClusters), else the last that fits at all; auto never picks 16. The
// tensor-core form (MlaDecodeSmallFormFor) chooses the cluster the same way, heads per block 16.
// cudaErrorInvalidValue for unsupported params or options out of range, cudaErrorNotSupported
// when the device cannot schedule any candidate cluster (e.g. a given 16).
cudaError_t MlaDecodeSmallShape(const MlaAttentionParams& params,
                                const MlaDecodeSmallOptions& options, int* cluster,
                                int* heads_per_block);

// out[t, h] as MlaAttentionF32 (params.workspace, num_splits and mma_variant are ignored).
// Errors as MlaDecodeSmallShape.
cudaError_t MlaDecodeSmall(const MlaAttentionParams& params, const MlaDecodeSmallOptions& options,
                           cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_SMALL_H_
