// MlaDecodeSmall's tensor-core form (mla_decode_small.h, MlaDecodeSmallForm::kTensorCore).
//
// Grid (cluster size S, heads / 16, tokens), cluster (S, 1, 1): as the CUDA-core form, the S
// blocks of a cluster share one (token, group of 16 heads) and block r takes the r-th of S
// contiguous shares of the token's context; the 16 heads are the M of mma.m16n8k16. A block of 4
// warps walks its share in tiles of 32 keys:
//   keys    each tile's 32 cache rows (576 bf16: latent, then rope) are gathered through the
//           block table into shared memory with 16-byte cp.async, kStages tiles in a ring
//           (kStages - 1 in flight while one is computed); rows past the share are zero-filled;
//   scores  warp w multiplies its 9 of the 36 k-steps (Q as bf16 A fragments in registers) by
//           all 32 keys (B by ldmatrix from the key rows), writes the 16 x 32 partial scores to
//           shared memory, and after a barrier every warp adds the 4 partials in warp order:
//           all warps hold the same bits of the full scores;
//   softmax each warp runs the same online softmax (fp32, base 2) on them; the tile's
//           probabilities, rounded to bf16, become the A fragments of P . V in registers (the
//           accumulator layout of two n-tiles is the A layout of one k-step); the denominator
//           sums the unrounded fp32 probabilities;
//   value   warp w owns output columns 128 w .. 128 w + 127: O = alpha O + P V, V being the
//           latent columns of the same staged rows (ldmatrix.trans).
// Then each block's (m, l, O) goes to shared memory and, after a cluster barrier, block r
// merges columns r * 512 / S .. of every block's partial through distributed shared memory in
// rank order (as the CUDA-core form): no workspace, no atomics, the same bits on every run.
// Numerics: Q and P enter the products rounded to bf16 (nearest even), as MlaAttentionF32's
// key-split and wgmma kernels (MlaAttentionBf16Operands); keys are exact bf16, sums fp32.
// Launched with programmatic dependent launch: every thread waits for the preceding grids
// (which write the query and the cache) before it reads anything.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <math.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/attention/mla_decode_small.h"
#include "kernels/attention/mla_decode_small_mma.h"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/common/capture_deps.h"
#include "kernels/common/kernel_facts.h"
#include "kernels/common/pdl.h"

namespace deepinfer {
namespace kernels {
namespace mla_decode_small_internal {
namespace {

constexpr int kHeads = kMmaHeads;
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kLatent = kMlaDecodeSmallLatent;
constexpr int kDim = kMlaDecodeSmallLatent + kMlaDecodeSmallRope;  // 576
constexpr int kMaxCluster = kMlaDecodeSmallMaxCluster;
constexpr int kKeys = 32;   // keys a tile
constexpr int kStages = 4;  // tiles in the shared-memory ring
// Key row stride (bf16): 1168 bytes, the 8 rows an ldmatrix reads in distinct bank groups.
constexpr int kLd = kDim + 8;
constexpr int kKSteps = kDim / 16;                // 36 score k-steps
constexpr int kRowChunks = kDim / 8;              // 16-byte pieces of a key row: 72
constexpr int kThreadsPerRow = kThreads / kKeys;  // 4 threads copy one row
// Partial-score row (fp32): a half-warp's float2 stores in distinct banks.
constexpr int kRedLd = kKeys + 8;
constexpr int kWarpCols = kLatent / kWarps;  // 128 output columns a warp
static_assert(kKSteps % kWarps == 0 && kRowChunks % kThreadsPerRow == 0, "exact splits");
static_assert(kLatent % 16 == 0 && kWarpCols % 8 == 0, "a score k-step is all latent or all rope");

// Shared memory in bytes: the key ring [kStages][kKeys][kLd] bf16, partial scores
// [kWarps][kHeads][kRedLd], the block's O [kHeads][kLatent] and (m, l) [kHeads][2], then the
// cluster merge's (m, l) per block [kHeads][kMaxCluster][2], weights [kHeads][kMaxCluster] and
// denominators [kHeads] (fp32).
struct Smem {
  static constexpr int kKeyRing = 0;
  static constexpr int kRed = kKeyRing + kStages * kKeys * kLd * 2;
  static constexpr int kBlockO = kRed + kWarps * kHeads * kRedLd * 4;
  static constexpr int kBlockMl = kBlockO + kHeads * kLatent * 4;
  static constexpr int kMergeMl = kBlockMl + kHeads * 2 * 4;
  static constexpr int kMergeW = kMergeMl + kHeads * kMaxCluster * 2 * 4;
  static constexpr int kDenom = kMergeW + kHeads * kMaxCluster * 4;
  static constexpr int kBytes = kDenom + kHeads * 4;
  static_assert(kRed % 16 == 0 && kBlockO % 16 == 0, "16-byte aligned regions");
};

__global__ void __launch_bounds__(kThreads, 1) MlaDecodeSmallMmaKernel(MlaAttentionParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  using sm80::CopyAsync16;
  using sm80::CopyAsyncCommit;
  using sm80::CopyAsyncWait;
  using sm80::LdMatrixX4;
  using sm80::MmaBf16;
  using sm80::PackBf16;
  using sm80::SharedAddr;
  constexpr int kWarpKSteps = kKSteps / kWarps;                     // 9 score k-steps a warp
  constexpr int kRowChunksPerThread = kRowChunks / kThreadsPerRow;  // 18 pieces a thread
  constexpr int kNTiles = kWarpCols / 8;                            // 16 P . V n-tiles a warp
  constexpr int kCols4 = kLatent / 4;                               // float4s of an output row
  // The query and the cache are written by the kernels before this one.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  __nv_bfloat16* ring = reinterpret_cast<__nv_bfloat16*>(smem + Smem::kKeyRing);
  float* red = reinterpret_cast<float*>(smem + Smem::kRed);
  float* block_o = reinterpret_cast<float*>(smem + Smem::kBlockO);
  float* block_ml = reinterpret_cast<float*>(smem + Smem::kBlockMl);
  cg::cluster_group cluster = cg::this_cluster();
  const int splits = static_cast<int>(cluster.num_blocks());
  const int split = static_cast<int>(cluster.block_rank());
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, tq = lane % 4;  // fragment coordinates: row group, pair in row
  const int h0 = blockIdx.y * kHeads;
  const int64_t t = blockIdx.z;
  const int heads = p.num_heads;

  // This block's keys: [cb, cb + n) of the token's sequence, in `tiles` tiles.
  const int len = p.context_len[t];
  const int32_t* table =
      p.block_tables + static_cast<int64_t>(p.token_seq[t]) * p.max_blocks_per_seq;
  const int bs = p.cache.block_size;
  const int per_split = (len + splits - 1) / splits;
  const int cb = min(len, split * per_split);
  const int n = min(len, cb + per_split) - cb;
  const int tiles = (n + kKeys - 1) / kKeys;
  const __nv_bfloat16* cache = static_cast<const __nv_bfloat16*>(p.cache.cache);

  // Thread tid copies pieces cpiece + 4 c of row crow of every tile (64-byte strides from one
  // block-table lookup). row_of(i): the cache offset of that row in tile i (-1: past the keys);
  // the lookups run a tile ahead of the copies, so no copy waits for one.
  const int crow = tid / kThreadsPerRow, cpiece = tid % kThreadsPerRow;
  auto row_of = [&](int i) -> int64_t {
    const int k = i * kKeys + crow;
    if (k >= n) return -1;
    const int j = cb + k;
    return (static_cast<int64_t>(table[j / bs]) * bs + j % bs) * kDim;
  };
  // Tile i into ring slot i % kStages as one copy group (empty past the last tile); rows past
  // the keys are zero-filled.
  const uint32_t ring_addr = SharedAddr(ring) + (crow * kLd + cpiece * 8) * 2;
  auto issue = [&](int i, int64_t row) {
    if (i < tiles) {
      const bool valid = row >= 0;
      const __nv_bfloat16* src = cache + (valid ? row + cpiece * 8 : 0);
      const uint32_t dst = ring_addr + (i % kStages) * (kKeys * kLd * 2);
#pragma unroll
      for (int c = 0; c < kRowChunksPerThread; ++c) {
        CopyAsync16(dst + c * kThreadsPerRow * 16, src + (valid ? c * kThreadsPerRow * 8 : 0),
                    valid);
      }
    }
    CopyAsyncCommit();
  };
  // The first tiles' lookups and this warp's query values are loaded together (neither waits
  // for the other), then the first tiles' copies start and the query becomes bf16 A fragments of
  // the warp's k-steps 9 warp + i: register r holds head g + 8 (r & 1), columns
  // 16 ks + 2 tq + 8 (r >> 1) + {0, 1}.
  int64_t rows[kStages - 1];
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) rows[s] = row_of(s);
  float2 qv[kWarpKSteps][4];
#pragma unroll
  for (int i = 0; i < kWarpKSteps; ++i) {
    const int ks = warp * kWarpKSteps + i;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int h = h0 + g + (r & 1) * 8, c = ks * 16 + 2 * tq + (r >> 1) * 8;
      if (ks * 16 < kLatent) {
        qv[i][r] = *reinterpret_cast<const float2*>(p.q_latent + (t * heads + h) * kLatent + c);
      } else {
        const float* qr =
            p.q_rope + t * p.q_rope_token_stride + h * p.q_rope_head_stride + (c - kLatent);
        qv[i][r] = make_float2(qr[0], qr[1]);
      }
    }
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s, rows[s]);
  int64_t next_row = row_of(kStages - 1);  // of the tile the loop's first iteration issues
  uint32_t qa[kWarpKSteps][4];
#pragma unroll
  for (int i = 0; i < kWarpKSteps; ++i) {
#pragma unroll
    for (int r = 0; r < 4; ++r) qa[i][r] = PackBf16(qv[i][r].x, qv[i][r].y);
  }

  const float scale2 = p.softmax_scale * 1.4426950408889634f;  // base 2 softmax
  float o[kNTiles][4];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[j][e] = 0.0f;
  }
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // heads g and g + 8

  for (int i = 0; i < tiles; ++i) {
    CopyAsyncWait<kStages - 2>();
    __syncthreads();  // tile i is visible; every warp is done with tile i - 1 (its slot, red)
    issue(i + kStages - 1, next_row);
    next_row = row_of(i + kStages);
    const __nv_bfloat16* kt = ring + (i % kStages) * kKeys * kLd;

    // Partial scores over this warp's k-steps: n-tile j = keys 8 j .. 8 j + 7.
    float s[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = 0.0f;
    }
#pragma unroll
    for (int ii = 0; ii < kWarpKSteps; ++ii) {
      const int ks = warp * kWarpKSteps + ii;
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        // Matrices: (keys lo, cols lo), (keys lo, cols hi), (keys hi, cols lo), (keys hi, cols hi).
        uint32_t b[4];
        const int key = np * 16 + (lane / 16) * 8 + lane % 8;
        LdMatrixX4<false>(b, kt + key * kLd + ks * 16 + ((lane / 8) & 1) * 8);
        MmaBf16(s[2 * np], qa[ii], b[0], b[1]);
        MmaBf16(s[2 * np + 1], qa[ii], b[2], b[3]);
      }
    }
    float* rw = red + warp * kHeads * kRedLd;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      *reinterpret_cast<float2*>(rw + g * kRedLd + 8 * j + 2 * tq) = make_float2(s[j][0], s[j][1]);
      *reinterpret_cast<float2*>(rw + (g + 8) * kRedLd + 8 * j + 2 * tq) =
          make_float2(s[j][2], s[j][3]);
    }
    __syncthreads();

    // Full scores (the warps' partials in warp order), base 2; -inf past the block's keys.
    const int valid = n - i * kKeys;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int at = (g + 8 * half) * kRedLd + 8 * j + 2 * tq;
        float2 acc = *reinterpret_cast<const float2*>(red + at);
#pragma unroll
        for (int w = 1; w < kWarps; ++w) {
          const float2 x = *reinterpret_cast<const float2*>(red + w * kHeads * kRedLd + at);
          acc.x += x.x;
          acc.y += x.y;
        }
        const int key = 8 * j + 2 * tq;
        s[j][2 * half] = key < valid ? acc.x * scale2 : -INFINITY;
        s[j][2 * half + 1] = key + 1 < valid ? acc.y * scale2 : -INFINITY;
      }
    }
    // Online softmax (key 0 of a tile is always valid: the maxima are finite).
    float alpha[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = m[half];
#pragma unroll
      for (int j = 0; j < 4; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * half], s[j][2 * half + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      alpha[half] = exp2f(m[half] - mx);  // 0 on the first tile (m = -inf)
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[j][2 * half] = exp2f(s[j][2 * half] - mx);
        s[j][2 * half + 1] = exp2f(s[j][2 * half + 1] - mx);
        sum += s[j][2 * half] + s[j][2 * half + 1];
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      l[half] = fmaf(l[half], alpha[half], sum);
      m[half] = mx;
    }
    // P as bf16 A fragments: k-step kk = keys 16 kk .. 16 kk + 15 = n-tiles 2 kk, 2 kk + 1.
    uint32_t pa[2][4];
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      pa[kk][0] = PackBf16(s[2 * kk][0], s[2 * kk][1]);
      pa[kk][1] = PackBf16(s[2 * kk][2], s[2 * kk][3]);
      pa[kk][2] = PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[kk][3] = PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
    // O = alpha O + P V over this warp's columns; lane l addresses key row l (ldmatrix.trans:
    // matrices keys 0-7, 8-15 -> k-step 0, keys 16-23, 24-31 -> k-step 1).
    const __nv_bfloat16* vrow = kt + lane * kLd + warp * kWarpCols;
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
      uint32_t b[4];
      LdMatrixX4<true>(b, vrow + j * 8);
      MmaBf16(o[j], pa[0], b[0], b[1]);
      MmaBf16(o[j], pa[1], b[2], b[3]);
    }
  }
  CopyAsyncWait<0>();  // the trailing groups are empty; nothing is left in flight

  // The block's partial (a block without keys: m = -inf, l = 0, O = 0).
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
    const int c = warp * kWarpCols + 8 * j + 2 * tq;
    *reinterpret_cast<float2*>(block_o + g * kLatent + c) = make_float2(o[j][0], o[j][1]);
    *reinterpret_cast<float2*>(block_o + (g + 8) * kLatent + c) = make_float2(o[j][2], o[j][3]);
  }
  if (warp == 0 && tq == 0) {
    block_ml[2 * g] = m[0];
    block_ml[2 * g + 1] = l[0];
    block_ml[2 * (g + 8)] = m[1];
    block_ml[2 * (g + 8) + 1] = l[1];
  }
  cluster.sync();  // every block's partial is complete and visible to the cluster

  // This block's columns of the output: every block's partial, in rank order.
  float* merge_ml = reinterpret_cast<float*>(smem + Smem::kMergeMl);
  float* merge_w = reinterpret_cast<float*>(smem + Smem::kMergeW);
  float* denom = reinterpret_cast<float*>(smem + Smem::kDenom);
  for (int i = tid; i < kHeads * splits; i += kThreads) {
    const int h = i / splits, r = i % splits;
    const float* remote = cluster.map_shared_rank(block_ml, r);
    merge_ml[(h * kMaxCluster + r) * 2] = remote[2 * h];
    merge_ml[(h * kMaxCluster + r) * 2 + 1] = remote[2 * h + 1];
  }
  __syncthreads();
  if (tid < kHeads) {
    const float* ml = merge_ml + tid * kMaxCluster * 2;
    float mx = -INFINITY;
    for (int r = 0; r < splits; ++r) mx = fmaxf(mx, ml[2 * r]);
    float sum = 0.0f;
    for (int r = 0; r < splits; ++r) {
      const float wt = ml[2 * r + 1] > 0.0f ? exp2f(ml[2 * r] - mx) : 0.0f;
      merge_w[tid * kMaxCluster + r] = wt;
      sum = fmaf(wt, ml[2 * r + 1], sum);
    }
    denom[tid] = sum;
  }
  __syncthreads();
  const int slice4 = kCols4 / splits;
  for (int i = tid; i < kHeads * slice4; i += kThreads) {
    const int h = i / slice4, c4 = split * slice4 + i % slice4;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int r = 0; r < splits; ++r) {
      const float wt = merge_w[h * kMaxCluster + r];
      const float4 x =
          reinterpret_cast<const float4*>(cluster.map_shared_rank(block_o, r))[h * kCols4 + c4];
      acc.x = fmaf(wt, x.x, acc.x);
      acc.y = fmaf(wt, x.y, acc.y);
      acc.z = fmaf(wt, x.z, acc.z);
      acc.w = fmaf(wt, x.w, acc.w);
    }
    const float d = denom[h];
    reinterpret_cast<float4*>(p.out_latent + (t * heads + h0 + h) * kLatent)[c4] =
        make_float4(acc.x / d, acc.y / d, acc.z / d, acc.w / d);
  }
  // No block leaves while others read its shared memory.
  cluster.sync();
#endif  // __CUDA_ARCH__ >= 900
}

cudaLaunchConfig_t LaunchConfig(const MlaAttentionParams& p, int cluster, cudaStream_t stream,
                                cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(static_cast<unsigned>(cluster), static_cast<unsigned>(p.num_heads / kHeads),
                   static_cast<unsigned>(p.num_tokens));
  c.blockDim = dim3(kThreads, 1, 1);
  c.dynamicSmemBytes = Smem::kBytes;
  c.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = static_cast<unsigned>(cluster);
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  c.attrs = attr;
  c.numAttrs = 1;
  return c;
}

// Per device, queried once: the kernel has its sm_90 code, the device launches clusters and
// gives the block its shared memory (KernelFactsFor raises the dynamic limit), and non-portable
// cluster sizes (16) are allowed.
struct Facts {
  cudaError_t error = cudaSuccess;
  bool runs = false;
};

Facts FactsFor(int device) {
  static std::mutex mu;
  static std::map<int, Facts>* facts = new std::map<int, Facts>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = facts->find(device);
  if (it != facts->end()) return it->second;
  Facts f;
  const void* kernel = reinterpret_cast<const void*>(MlaDecodeSmallMmaKernel);
  const KernelFacts k = KernelFactsFor(kernel, device, Smem::kBytes);
  int cluster_launch = 0;
  f.error = k.error;
  if (f.error == cudaSuccess) {
    f.error = cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device);
  }
  f.runs = f.error == cudaSuccess && cluster_launch != 0 && k.ptx_version >= 90 &&
           k.max_smem >= Smem::kBytes;
  if (f.runs) {
    f.error = cudaFuncSetAttribute(MlaDecodeSmallMmaKernel,
                                   cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    f.runs = f.error == cudaSuccess;
  }
  if (f.error != cudaSuccess) cudaGetLastError();  // reported through the return value
  facts->emplace(device, f);
  return f;
}

// Clusters of `cluster` blocks the device runs at once (0: none); once per (cluster, device).
cudaError_t MaxActiveClusters(const MlaAttentionParams& p, int cluster, int device, int* out) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, int>* cache = new std::map<std::pair<int, int>, int>();
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(cluster, device);
  auto it = cache->find(key);
  if (it == cache->end()) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t c = LaunchConfig(p, cluster, nullptr, &attr);
    int active = 0;
    const cudaError_t e = cudaOccupancyMaxActiveClusters(&active, MlaDecodeSmallMmaKernel, &c);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return e;
    }
    it = cache->emplace(key, active).first;
  }
  *out = it->second;
  return cudaSuccess;
}

}  // namespace

bool MmaKernelRuns() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const Facts f = FactsFor(device);
  return f.error == cudaSuccess && f.runs;
}

cudaError_t MmaCluster(const MlaAttentionParams& params, int cluster_size, int* cluster) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  const Facts f = FactsFor(device);
  if (f.error != cudaSuccess) return f.error;
  if (!f.runs) return cudaErrorInvalidValue;
  const int64_t clusters = static_cast<int64_t>(params.num_tokens) * (params.num_heads / kHeads);
  int found = 0;
  for (const int c : {8, 4, 2, 1, 16}) {
    if (cluster_size != 0 ? c != cluster_size : c == 16) continue;
    int active = 0;
    e = MaxActiveClusters(params, c, device, &active);
    if (e != cudaSuccess) return e;
    if (active == 0) continue;
    found = c;
    if (clusters <= active) break;
  }
  if (found == 0) return cudaErrorNotSupported;
  *cluster = found;
  return cudaSuccess;
}

cudaError_t MmaLaunch(const MlaAttentionParams& params, int cluster, cudaStream_t stream) {
  // The kernel stages bf16 cache rows (MlaDecodeSmallFormFor sends other caches to kCudaCore).
  if (params.cache.type != LatentCacheType::kBFloat16) return cudaErrorInvalidValue;
  cudaLaunchAttribute attrs[2];
  cudaLaunchConfig_t c = LaunchConfig(params, cluster, stream, &attrs[0]);
  if (ProgrammaticDependentLaunchEnabled()) {
    // As launch.cuh: captured, the edges from the kernels before it are made programmatic (plain
    // edges should that fail); eager, the attribute.
    bool capturing = false;
    if (MakeCapturedKernelDependenciesProgrammatic(stream, &capturing) != cudaSuccess) {
      (void)cudaGetLastError();
    } else if (!capturing) {
      attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attrs[1].val.programmaticStreamSerializationAllowed = 1;
      c.numAttrs = 2;
    }
  }
  cudaError_t e = cudaLaunchKernelEx(&c, MlaDecodeSmallMmaKernel, params);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

}  // namespace mla_decode_small_internal
}  // namespace kernels
}  // namespace deepinfer
