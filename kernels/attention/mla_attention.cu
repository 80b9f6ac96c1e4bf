// MlaAttentionF32's dispatch: the plan (kernel, grid, split count, workspace) for the params and
// the device, the launch, and the split combine. The kernels are in the headers included below,
// compiled here in one translation unit:
//   mla_decode_grouped.cuh   MlaGroupedKernel (CUDA cores)
//   mla_decode_mma.cuh       MlaBf16MmaKernel (tensor cores, mma_variant 4)
//   mla_decode_key_split.cuh MlaBf16KeySplitKernel (tensor cores, mma_variant 9; its ring form
//                            with one block per SM, mma_variant 11)
//   mla_split_combine.cuh    MlaCombineKernel / MlaCombineWideKernel
// and, in its own sm_90a translation unit, mla_decode_wgmma.cu: the 64-head wgmma kernel
// (mma_variant 10, the default where it applies: num_heads a multiple of 64, latent 512 +
// rope 64, bf16 cache, compute capability 9.0; one block per 64 heads reads a token's context
// once for those heads, see that file).
// (WriteLatentCacheF32 is mla_cache_write.cu.)
//
// MlaAttentionF32: one block per (token, context split, group of kGroupHeads = 16 heads), so a
// cached key is read from memory once for 16 heads instead of once per head. Per chunk of
// kKeyChunk = 16 keys:
//   load     the chunk's [latent | rope] rows into shared memory with 16-byte cp.async (plain
//            loads when rows are not float4-aligned), double-buffered: chunk c + 1 is in
//            flight while chunk c is computed;
//   score    S[16 heads x 16 keys] = Q K^T: each half-warp owns a 4x4 (head x key) tile and
//            splits the dot products over its 16 lanes in float4 steps; a reduce-scatter of
//            the 16 partial sums leaves one finished score per lane;
//   softmax  online, per head (a half-warp each): running max, running denominator and the
//            factor that rescales the accumulated output, as in FlashAttention;
//   value    O[16 x latent] = alpha O + P V, the value being the latent itself; a thread owns
//            the columns tid + k*256 of all 16 heads in registers and reads P as float4
//            broadcasts.
// Decode (few tokens, long contexts) would leave most SMs idle, so the context is split over
// num_splits blocks; each writes its unnormalised output, max and denominator to a workspace and
// MlaCombineKernel (fewer than 8 splits) or MlaCombineWideKernel merges them (FlashDecoding).
// All accumulation is fp32.
//
// With an FP8 cache, DeepSeek's latent 512 + rope 64 goes to the key-split kernel or the 64-head
// wgmma kernel, chosen as for a bf16 cache; both stage each tile's FP8 entries (656 bytes a key
// against 1152 in bf16) and convert them into the bf16 values of mla_fp8_gather.h's copy in
// shared memory: the output is bit for bit the kernel's over that copy. Other shapes and variants
// run this CUDA-core kernel, which dequantises each key to fp32 in shared memory (codes times the
// entry's scale, the bf16 rope key widened) with plain loads: the fp32 kernel's math. (The CUDA
// backend runs the other tensor-core kernels over an FP8 cache by dequantising the entries into a
// bf16 copy first, mla_fp8_gather.h.)
//
// With a bf16 cache the same kernel widens each key to fp32 in shared memory (any shape), but
// DeepSeek's latent 512 + rope 64 goes to MlaBf16KeySplitKernel (FlashMLA's work split: each
// warp scores its own keys over the whole dot product; described at the kernel; 1.2x faster
// than MlaBf16MmaKernel at 64-256 decode tokens on the H200) and the other usual shapes
// (latent <= 512, latent + rope <= 640) to MlaBf16MmaKernel, which is not limited by fp32 FMA
// throughput. On the H200 MlaBf16MmaKernel reaches ~30-37% of HBM bandwidth for
// 128 x 1024 decode, bound by instruction issue, not by memory: ncu counts ~1,900 instructions
// per warp per 32-key chunk at 6.1 cycles each (2 warps per scheduler), and a block alone on
// the GPU still takes 5 us per chunk (docs/cuda/bf16-and-kv-cache.md). Per chunk of keys (bf16 rows
// in shared memory, double-buffered cp.async ring of 32-key chunks) the scores S[16 heads x 32
// keys] = Q K^T and the update O[16 x latent] += P V run as bf16 mma.sync.m16n8k16 with fp32
// accumulation. Both fp32 operands (Q and P) are split into bf16 hi + lo parts (x - hi is exactly
// representable to 8 more bits), so each product is x_hi*k + x_lo*k with a relative error of about
// 2^-17 instead of bf16's 2^-9, the keys being exact bf16 already: fp32-grade math at tensor-core
// speed. Warps split the 576-long score dot products (k-steps), sum them through shared memory in a
// fixed order, and then each runs the online softmax for all 16 heads itself and owns a quarter of
// the latent columns of O. The key-split kernel (variant 9, the default) drops the lo parts: bf16 Q
// and P, one MMA per product, as FlashMLA, and merges 2-3 context splits inside a thread-block
// cluster instead of through the workspace and MlaCombineKernel (described at
// MlaBf16KeySplitKernel).

#include <cuda_bf16.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "kernels/attention/mla_attention.h"
#include "kernels/attention/mla_decode_grouped.cuh"
#include "kernels/attention/mla_decode_key_split.cuh"
#include "kernels/attention/mla_decode_mma.cuh"
#include "kernels/attention/mla_decode_wgmma.h"
#include "kernels/attention/mla_split_combine.cuh"
#include "kernels/common/kernel_facts.h"

namespace deepinfer {
namespace kernels {
namespace {

using mla::Fp8Entry;
using mla::GroupedSmemBytes;
using mla::kGroupHeads;
using mla::kGroupThreads;
using mla::kMaxColIters;
using mla::kMmaMaxDim;
using mla::kMmaMaxLatent;
using mla::kMmaThreads;
using mla::kMmaWarps;
using mla::kSplitLatent;
using mla::kSplitRingSmemBytes;
using mla::kSplitRingStages;
using mla::kSplitRope;
using mla::kSplitSmemBytes;
using mla::kWideCombineCols;
using mla::kWideCombineMinSplits;
using mla::kWideCombineRows;
using mla::MlaBf16KeySplitKernel;
using mla::MlaBf16MmaKernel;
using mla::MlaCombineKernel;
using mla::MlaCombineWideKernel;
using mla::MlaGroupedKernel;
using mla::MmaSmemBytes;

using GroupedKernelFn = void (*)(MlaAttentionParams, int, int, bool, float*, float*);

template <typename T>
GroupedKernelFn GroupedKernelFor(int latent_dim) {
  switch ((latent_dim + kGroupThreads - 1) / kGroupThreads) {
    case 1:
      return MlaGroupedKernel<1, T>;
    case 2:
      return MlaGroupedKernel<2, T>;
    case 3:
      return MlaGroupedKernel<3, T>;
    default:
      static_assert(kMaxColIters == 4, "one instantiation per column count");
      return MlaGroupedKernel<4, T>;
  }
}

GroupedKernelFn MmaKernelFor(int latent_dim) {
  const int cols = (latent_dim + kMmaWarps - 1) / kMmaWarps;  // per warp
  if (cols <= 16) return MlaBf16MmaKernel<2>;
  if (cols <= 32) return MlaBf16MmaKernel<4>;
  if (cols <= 64) return MlaBf16MmaKernel<8>;
  return MlaBf16MmaKernel<16>;
}

bool IsBf16(const MlaAttentionParams& p) { return p.cache.type == LatentCacheType::kBFloat16; }
bool IsFp8(const MlaAttentionParams& p) { return p.cache.type == LatentCacheType::kFp8E4M3; }

// KernelFacts of a decode kernel (cached per kernel and device; the first query raises its
// dynamic shared-memory limit to all the device allows).
cudaError_t FactsFor(GroupedKernelFn kernel, int device, KernelFacts* out) {
  *out = KernelFactsFor(reinterpret_cast<const void*>(kernel), device, kAllSharedMemory);
  return out->error;
}

cudaError_t BlocksPerSm(GroupedKernelFn kernel, int device, int threads, size_t smem, int* out) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, size_t>, int>* cache =
      new std::map<std::tuple<const void*, int, size_t>, int>();
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), device, smem);
  auto it = cache->find(key);
  if (it != cache->end()) {
    *out = it->second;
    return cudaSuccess;
  }
  const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, kernel, threads, smem);
  if (e == cudaSuccess) cache->emplace(key, *out);
  return e;
}

// True when the tensor-core kernel takes these params: bf16 cache (or an FP8 one, for a kernel
// that reads FP8 entries: reads_fp8), shape within its register budget, and the kernel compiled
// for sm_80+ (its mma / ldmatrix code is absent from PTX JIT-compiled for an older virtual
// architecture).
bool UseMma(const MlaAttentionParams& p, GroupedKernelFn kernel, int device, bool reads_fp8) {
  if (!(IsBf16(p) || (reads_fp8 && IsFp8(p))) || p.cache.latent_dim > kMmaMaxLatent ||
      (p.cache.latent_dim + p.cache.rope_dim + 15) / 16 * 16 > kMmaMaxDim) {
    return false;
  }
  KernelFacts f;
  return FactsFor(kernel, device, &f) == cudaSuccess && f.ptx_version >= 80;
}

struct GroupedPlan {
  GroupedKernelFn kernel = nullptr;
  int threads = kGroupThreads;
  size_t smem = 0;
  bool mma = false;
  bool key_split = false;  // MlaBf16KeySplitKernel (Q and P rounded to bf16)
  bool ring = false;       // its ring form (kSplitRingStages key tiles, variant 11)
  bool reads_fp8 = false;  // the key-split or wgmma kernel over the FP8 entries (kFp8)
  bool wgmma = false;      // the 64-head wgmma kernel (LaunchMlaWgmma; Q and P rounded to bf16)
  int cluster = 0;         // the cluster merge: blocks per cluster (= splits), else 0
  int num_groups = 0;
  int num_splits = 0;
  size_t workspace_bytes = 0;
};

// MlaAttentionParams::mma_variant of the kernels (numbers kept from when more variants existed:
// users pass them): MlaBf16MmaKernel (4), the key-split kernel (9: with the cluster merge
// where the split count allows it), the 64-head wgmma kernel (10) and the key-split kernel's
// ring form (11).
constexpr int kMmaVariant = 4;
constexpr int kKeySplitVariant = 9;
constexpr int kWgmmaVariant = 10;
constexpr int kKeySplitRingVariant = 11;
static_assert(kKeySplitRingVariant == kMaxMlaMmaVariant, "mla_attention.h documents the variants");
static_assert(MlaMmaVariantIsValid(kMmaVariant) && MlaMmaVariantIsValid(kKeySplitVariant) &&
                  MlaMmaVariantIsValid(kWgmmaVariant) && MlaMmaVariantIsValid(kKeySplitRingVariant),
              "mla_attention.h lists the variants");

// The key-split kernel (ring: its ring form) and its cluster-merge form, over a bf16 cache or
// the FP8 entries.
GroupedKernelFn KeySplitKernel(bool fp8, bool ring) {
  if (ring) {
    return fp8 ? MlaBf16KeySplitKernel<false, true, kSplitRingStages>
               : MlaBf16KeySplitKernel<false, false, kSplitRingStages>;
  }
  return fp8 ? MlaBf16KeySplitKernel<false, true> : MlaBf16KeySplitKernel<false, false>;
}
GroupedKernelFn ClusterMergeKernel(bool fp8, bool ring) {
  if (ring) {
    return fp8 ? MlaBf16KeySplitKernel<true, true, kSplitRingStages>
               : MlaBf16KeySplitKernel<true, false, kSplitRingStages>;
  }
  return fp8 ? MlaBf16KeySplitKernel<true, true> : MlaBf16KeySplitKernel<true, false>;
}
size_t KeySplitSmem(bool ring) { return ring ? kSplitRingSmemBytes : kSplitSmemBytes; }

// Whether the cluster kernel (over FP8 entries: fp8; the ring form: ring) runs clusters of
// `splits` blocks on this device (sm_90 code, cluster launch, at least one such cluster
// schedulable); once per (splits, device, fp8, ring).
cudaError_t ClusterMergeRuns(int splits, int device, bool fp8, bool ring, bool* out) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, bool, bool>, bool>* cache =
      new std::map<std::tuple<int, int, bool, bool>, bool>();
  std::lock_guard<std::mutex> lock(mu);
  const GroupedKernelFn kernel = ClusterMergeKernel(fp8, ring);
  const auto key = std::make_tuple(splits, device, fp8, ring);
  auto it = cache->find(key);
  if (it != cache->end()) {
    *out = it->second;
    return cudaSuccess;
  }
  const size_t smem = KeySplitSmem(ring);
  const KernelFacts k =
      KernelFactsFor(reinterpret_cast<const void*>(kernel), device, kAllSharedMemory);
  if (k.error != cudaSuccess) return k.error;
  int cluster_launch = 0;
  cudaError_t e = cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device);
  if (e != cudaSuccess) return e;
  bool runs = cluster_launch != 0 && k.ptx_version >= 90 && static_cast<size_t>(k.max_smem) >= smem;
  if (runs) {
    cudaLaunchConfig_t c = {};
    cudaLaunchAttribute attr;
    c.gridDim = dim3(static_cast<unsigned>(splits), 1, 1);
    c.blockDim = dim3(kMmaThreads, 1, 1);
    c.dynamicSmemBytes = smem;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(splits);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    c.attrs = &attr;
    c.numAttrs = 1;
    int n = 0;
    e = cudaOccupancyMaxActiveClusters(&n, kernel, &c);
    if (e != cudaSuccess) {
      cudaGetLastError();
      n = 0;  // cannot schedule it: the workspace and the combine instead
    }
    runs = n > 0;
  }
  cache->emplace(key, runs);
  *out = runs;
  return cudaSuccess;
}

// The variant used when MlaAttentionParams::mma_variant is 0: variant 9
// (docs/cuda/bf16-and-kv-cache.md); shapes it does not take run variant 4.
constexpr int kDefaultMmaVariant = kKeySplitVariant;

// True when the key-split kernel (ring: its ring form) takes these params (given the device's
// shared-memory limit): latent 512 + rope 64, a bf16 cache or an FP8 one whose rope key is
// 16-byte aligned in the entry (PlanGrouped has checked Fp8LatentCacheLayoutValid: entries of
// whole 16-byte pieces), 16-byte aligned (whole-piece cp.async copies).
bool KeySplitFits(const MlaAttentionParams& p, int max_smem, bool ring) {
  return (IsBf16(p) || (IsFp8(p) && p.cache.fp8_rope_offset % 16 == 0)) &&
         p.cache.latent_dim == kSplitLatent && p.cache.rope_dim == kSplitRope &&
         reinterpret_cast<uintptr_t>(p.cache.cache) % 16 == 0 &&
         KeySplitSmem(ring) <= static_cast<size_t>(max_smem);
}

// True when the 64-head wgmma kernel takes these params on `device`: a bf16 cache, or an FP8 one
// whose rope key is 16-byte aligned in the entry.
bool WgmmaFits(const MlaAttentionParams& p, int device) {
  return (IsBf16(p) || (IsFp8(p) && p.cache.fp8_rope_offset % 16 == 0)) &&
         p.cache.latent_dim == kMlaWgmmaLatent && p.cache.rope_dim == kMlaWgmmaRope &&
         p.num_heads % kMlaWgmmaHeads == 0 &&
         reinterpret_cast<uintptr_t>(p.cache.cache) % 16 == 0 && MlaWgmmaRuns(device, IsFp8(p));
}

// The workspace of num_splits partials (none for one split).
size_t SplitWorkspaceBytes(const MlaAttentionParams& p, int num_splits) {
  return num_splits == 1 ? 0
                         : static_cast<size_t>(p.num_tokens) * p.num_heads * num_splits *
                               (static_cast<size_t>(p.cache.latent_dim) + 2) * sizeof(float);
}

cudaError_t PlanGrouped(const MlaAttentionParams& p, GroupedPlan* plan) {
  if (p.cache.latent_dim <= 0 || p.cache.latent_dim > kMaxMlaLatentDim || p.cache.rope_dim < 0 ||
      p.num_splits < 0 || p.num_splits > kMaxMlaSplits || !MlaMmaVariantIsValid(p.mma_variant) ||
      (p.cache.type != LatentCacheType::kFloat32 && !IsBf16(p) && !IsFp8(p)) ||
      (IsFp8(p) && !Fp8LatentCacheLayoutValid(p.cache))) {
    return cudaErrorInvalidValue;
  }
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  const int dim = p.cache.latent_dim + p.cache.rope_dim;
  const bool wgmma_wanted =
      p.mma_variant == kWgmmaVariant ||
      (p.mma_variant == 0 && p.num_tokens >= kMlaWgmmaDefaultMinTokens);
  if (wgmma_wanted && WgmmaFits(p, device)) {
    // One block per (token, split, 64 heads), one block per SM: split until the blocks
    // cover the SMs (rounding down, as below).
    plan->wgmma = true;
    plan->mma = true;
    plan->reads_fp8 = IsFp8(p);
    plan->threads = 0;  // LaunchMlaWgmma's own
    plan->num_groups = p.num_heads / kMlaWgmmaHeads;
    plan->num_splits = p.num_splits;
    if (plan->num_splits == 0) {
      int sms = 0;
      e = CurrentDeviceSms(&sms);
      if (e != cudaSuccess) return e;
      const int64_t blocks = static_cast<int64_t>(p.num_tokens) * plan->num_groups;
      const int64_t want = blocks >= sms ? 1 : sms / blocks;
      plan->num_splits = static_cast<int>(want < kMaxMlaSplits ? want : kMaxMlaSplits);
    }
    plan->workspace_bytes = SplitWorkspaceBytes(p, plan->num_splits);
    return cudaSuccess;
  }
  plan->num_groups = (p.num_heads + kGroupHeads - 1) / kGroupHeads;
  // Variant 10 where its kernel does not take the params: the default's choice.
  int variant = p.mma_variant == 0 || p.mma_variant == kWgmmaVariant ? kDefaultMmaVariant
                                                                      : p.mma_variant;
  const bool ring = variant == kKeySplitRingVariant;
  const bool key_split = variant == kKeySplitVariant || ring;
  GroupedKernelFn mma_kernel =
      key_split ? KeySplitKernel(IsFp8(p), ring) : MmaKernelFor(p.cache.latent_dim);
  if (key_split) {
    // Shapes (or devices) the key-split kernel does not take run variant 4.
    KernelFacts facts;
    e = FactsFor(mma_kernel, device, &facts);
    if (e != cudaSuccess) return e;
    if (!KeySplitFits(p, facts.max_smem, ring)) {
      variant = kMmaVariant;
      mma_kernel = MmaKernelFor(p.cache.latent_dim);
    }
  }
  const bool key_split_runs = variant == kKeySplitVariant || variant == kKeySplitRingVariant;
  plan->mma = UseMma(p, mma_kernel, device, /*reads_fp8=*/key_split_runs);
  plan->key_split = plan->mma && key_split_runs;
  plan->ring = plan->key_split && ring;
  plan->reads_fp8 = plan->key_split && IsFp8(p);
  if (plan->mma) {
    plan->kernel = mma_kernel;
    plan->threads = kMmaThreads;
    plan->smem = plan->key_split ? KeySplitSmem(plan->ring) : MmaSmemBytes(dim);
  } else {
    plan->kernel = IsBf16(p)  ? GroupedKernelFor<__nv_bfloat16>(p.cache.latent_dim)
                   : IsFp8(p) ? GroupedKernelFor<Fp8Entry>(p.cache.latent_dim)
                              : GroupedKernelFor<float>(p.cache.latent_dim);
    plan->threads = kGroupThreads;
    plan->smem = GroupedSmemBytes(dim);
  }
  KernelFacts facts;
  e = FactsFor(plan->kernel, device, &facts);
  if (e != cudaSuccess) return e;
  if (plan->smem > static_cast<size_t>(facts.max_smem)) return cudaErrorInvalidValue;
  plan->num_splits = p.num_splits;
  if (plan->num_splits == 0) {
    int per_sm = 0;
    e = BlocksPerSm(plan->kernel, device, plan->threads, plan->smem, &per_sm);
    if (e != cudaSuccess) return e;
    // Split until one wave of blocks covers every SM slot (rounding down: a partial second
    // wave would cost more than it fills).
    const int64_t blocks = static_cast<int64_t>(p.num_tokens) * plan->num_groups;
    const int64_t slots = static_cast<int64_t>(facts.sms) * (per_sm > 0 ? per_sm : 1);
    const int64_t want = blocks >= slots ? 1 : slots / blocks;
    plan->num_splits = static_cast<int>(want < kMaxMlaSplits ? want : kMaxMlaSplits);
  }
  // The key-split kernel: the splits of a (token, group) merge in a cluster, without the
  // workspace (the merge stores float4s of the output).
  if (plan->key_split && plan->num_splits >= 2 && plan->num_splits <= kMlaClusterMergeMaxSplits &&
      reinterpret_cast<uintptr_t>(p.out_latent) % 16 == 0) {
    bool runs = false;
    e = ClusterMergeRuns(plan->num_splits, device, plan->reads_fp8, plan->ring, &runs);
    if (e != cudaSuccess) return e;
    if (runs) {
      plan->kernel = ClusterMergeKernel(plan->reads_fp8, plan->ring);
      plan->cluster = plan->num_splits;
      plan->workspace_bytes = 0;
      return cudaSuccess;
    }
  }
  plan->workspace_bytes = SplitWorkspaceBytes(p, plan->num_splits);
  return cudaSuccess;
}

}  // namespace

const char* MlaAttentionKernelName(const MlaAttentionParams& params) {
  GroupedPlan plan;
  if (PlanGrouped(params, &plan) != cudaSuccess) return "invalid";
  if (plan.wgmma) return plan.reads_fp8 ? "wgmma_fp8_64_heads" : "wgmma_bf16_64_heads";
  if (plan.ring && plan.reads_fp8) {
    return plan.cluster > 0 ? "mma_fp8_key_split_ring_cluster" : "mma_fp8_key_split_ring";
  }
  if (plan.ring) {
    return plan.cluster > 0 ? "mma_bf16_key_split_ring_cluster" : "mma_bf16_key_split_ring";
  }
  if (plan.reads_fp8) return plan.cluster > 0 ? "mma_fp8_key_split_cluster" : "mma_fp8_key_split";
  if (plan.cluster > 0) return "mma_bf16_key_split_cluster";
  if (plan.key_split) return "mma_bf16_key_split";
  if (plan.mma) return "mma_bf16";
  return IsBf16(params) ? "grouped_bf16" : IsFp8(params) ? "grouped_fp8" : "grouped_f32";
}

bool MlaAttentionBf16Operands(const MlaAttentionParams& params) {
  GroupedPlan plan;
  return PlanGrouped(params, &plan) == cudaSuccess && (plan.key_split || plan.wgmma);
}

bool MlaAttentionReadsFp8Directly(const MlaAttentionParams& params) {
  if (!IsFp8(params)) return false;
  GroupedPlan fp8;
  if (PlanGrouped(params, &fp8) != cudaSuccess || !fp8.reads_fp8) return false;
  MlaAttentionParams bf16 = params;
  bf16.cache.type = LatentCacheType::kBFloat16;
  GroupedPlan plan;
  return PlanGrouped(bf16, &plan) == cudaSuccess && plan.key_split == fp8.key_split &&
         plan.ring == fp8.ring && plan.wgmma == fp8.wgmma && plan.num_splits == fp8.num_splits &&
         plan.cluster == fp8.cluster;
}

cudaError_t MlaAttentionWorkspaceBytes(const MlaAttentionParams& params, size_t* bytes) {
  *bytes = 0;
  if (params.num_tokens <= 0 || params.num_heads <= 0) return cudaSuccess;
  GroupedPlan plan;
  const cudaError_t e = PlanGrouped(params, &plan);
  if (e == cudaSuccess) *bytes = plan.workspace_bytes;
  return e;
}

cudaError_t MlaAttentionF32(const MlaAttentionParams& params, cudaStream_t stream) {
  if (params.num_tokens <= 0 || params.num_heads <= 0) return cudaSuccess;
  GroupedPlan plan;
  cudaError_t e = PlanGrouped(params, &plan);
  if (e != cudaSuccess) return e;
  const int64_t blocks =
      static_cast<int64_t>(params.num_tokens) * plan.num_splits * plan.num_groups;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  void* workspace = params.workspace;
  const bool own_workspace = plan.workspace_bytes > 0 && workspace == nullptr;
  if (plan.workspace_bytes > 0 && !own_workspace && params.workspace_bytes < plan.workspace_bytes) {
    return cudaErrorInvalidValue;
  }
  if (own_workspace) {
    e = cudaMallocAsync(&workspace, plan.workspace_bytes, stream);
    if (e != cudaSuccess) return e;
  }
  float* ws_out = static_cast<float*>(workspace);
  float* ws_ml = ws_out == nullptr
                     ? nullptr
                     : ws_out + static_cast<size_t>(params.num_tokens) * params.num_heads *
                                    plan.num_splits * params.cache.latent_dim;
  const int dim = params.cache.latent_dim + params.cache.rope_dim;
  const bool aligned16 = reinterpret_cast<uintptr_t>(params.cache.cache) % 16 == 0;
  // fp32 rows: whole float4s; bf16 rows (tensor-core kernel): whole 8-element pieces. The
  // CUDA-core kernel widens bf16 with plain loads.
  const bool vec_loads =
      aligned16 &&
      (plan.mma ? dim % 8 == 0 : params.cache.type == LatentCacheType::kFloat32 && dim % 4 == 0);
  if (plan.cluster > 0) {
    // Clusters of plan.cluster blocks merge their splits themselves (no combine).
    cudaLaunchConfig_t c = {};
    cudaLaunchAttribute attr;
    c.gridDim = dim3(static_cast<unsigned>(blocks), 1, 1);
    c.blockDim = dim3(static_cast<unsigned>(plan.threads), 1, 1);
    c.dynamicSmemBytes = plan.smem;
    c.stream = stream;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(plan.cluster);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    c.attrs = &attr;
    c.numAttrs = 1;
    return cudaLaunchKernelEx(&c, plan.kernel, params, plan.num_groups, plan.num_splits, vec_loads,
                              static_cast<float*>(nullptr), static_cast<float*>(nullptr));
  }
  if (plan.wgmma) {
    e = LaunchMlaWgmma(params, plan.num_groups, plan.num_splits, ws_out, ws_ml, stream);
  } else {
    plan.kernel<<<static_cast<unsigned>(blocks), plan.threads, plan.smem, stream>>>(
        params, plan.num_groups, plan.num_splits, vec_loads, ws_out, ws_ml);
    e = cudaGetLastError();
  }
  const int64_t token_heads = static_cast<int64_t>(params.num_tokens) * params.num_heads;
  if (e == cudaSuccess && plan.num_splits >= kWideCombineMinSplits) {
    const dim3 grid(
        static_cast<unsigned>(token_heads),
        static_cast<unsigned>((params.cache.latent_dim + kWideCombineCols - 1) / kWideCombineCols));
    MlaCombineWideKernel<<<grid, kWideCombineRows * kWideCombineCols, 0, stream>>>(
        ws_out, ws_ml, plan.num_splits, params.cache.latent_dim, params.out_latent);
    e = cudaGetLastError();
  } else if (e == cudaSuccess && plan.num_splits > 1) {
    MlaCombineKernel<<<static_cast<unsigned>(token_heads), 128, 0, stream>>>(
        ws_out, ws_ml, plan.num_splits, params.cache.latent_dim, params.out_latent);
    e = cudaGetLastError();
  }
  if (own_workspace) {
    const cudaError_t f = cudaFreeAsync(workspace, stream);
    if (e == cudaSuccess) e = f;
  }
  return e;
}

}  // namespace kernels
}  // namespace deepinfer
