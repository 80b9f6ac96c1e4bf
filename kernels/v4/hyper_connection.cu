// Hyper-connection kernels. HcMixF32, HcHeadF32 and HcExpandF32: grids are (blocks along hidden
// [+ 1], rows); a block handles kThreads * kVec columns of one row (kVec = 4: 16-byte loads where
// hidden and the pointers allow). HcMixFromStreamsF32: the partials (hc_mix_partials.cuh), then
// the row kernel (HcMixRowsBody). The stream count is a template parameter for
// V4's 4 (the loops unrolled over registers) and a runtime value up to kMaxHcStreams otherwise.
// Arithmetic uses the _rn intrinsics so nvcc does not contract a product and a sum into one FMA:
// the sums then round as the CPU reference's do.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/common/kernel_facts.h"
#include "kernels/common/launch.cuh"
#include "kernels/norm/block_inv_rms.cuh"
#include "kernels/v4/hc_mix_partials.cuh"
#include "kernels/v4/hc_mix_tensor_cores.cuh"
#include "kernels/v4/hyper_connection.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxHc = static_cast<int>(kMaxHcStreams);
constexpr int64_t kMaxGridY = 65535;

__device__ __forceinline__ float Sigmoid(float x) {
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
}

// x * scale + base, rounded after each operation.
__device__ __forceinline__ float Affine(float x, float scale, float base) {
  return __fadd_rn(__fmul_rn(x, scale), base);
}

struct CollapseParams {
  int64_t rows = 0, hidden = 0;
  int hc = 0;
  int chunks = 0;                // blocks per row along hidden
  const float* mixes = nullptr;  // row r's pre logits at mixes + r * mix_stride
  int64_t mix_stride = 0;
  const float* base = nullptr;
  const float* scale = nullptr;
  float eps = 0.0f;
  const float* streams = nullptr;
  float* out = nullptr;
  // HcMix only: the post and comb outputs, made by block `chunks` of each row.
  float* post = nullptr;
  float* comb = nullptr;
  int sinkhorn_iters = 1;
};

template <int kHc>
__device__ __forceinline__ int StreamsOf(int hc) {
  return kHc > 0 ? kHc : hc;
}

// out[r, d] = sum_j pre[j] * streams[r, j, d] over this block's columns, pre[j] =
// sigmoid(mixes[r, j] * scale[0] + base[j]) + eps.
template <int kHc, int kVec>
__device__ void CollapseChunk(const CollapseParams& p, int64_t r, int chunk) {
  __shared__ float pre[kMaxHc];
  const int hc = StreamsOf<kHc>(p.hc);
  __syncthreads();  // the previous row's readers of pre are done
  if (threadIdx.x < hc) {
    const int j = threadIdx.x;
    pre[j] =
        __fadd_rn(Sigmoid(Affine(p.mixes[r * p.mix_stride + j], p.scale[0], p.base[j])), p.eps);
  }
  __syncthreads();
  const int64_t H = p.hidden;
  const int64_t d = (int64_t{chunk} * kThreads + threadIdx.x) * kVec;
  if (d >= H) return;
  const float* s = p.streams + r * hc * H + d;
  float* out = p.out + r * H + d;
  constexpr int kLoop = kHc > 0 ? kHc : kMaxHc;
  if constexpr (kVec == 4) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int j = 0; j < kLoop; ++j) {
      if (kHc == 0 && j >= hc) break;
      const float4 v = *reinterpret_cast<const float4*>(s + j * H);
      const float w = pre[j];
      acc.x = __fadd_rn(acc.x, __fmul_rn(w, v.x));
      acc.y = __fadd_rn(acc.y, __fmul_rn(w, v.y));
      acc.z = __fadd_rn(acc.z, __fmul_rn(w, v.z));
      acc.w = __fadd_rn(acc.w, __fmul_rn(w, v.w));
    }
    *reinterpret_cast<float4*>(out) = acc;
  } else {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kLoop; ++j) {
      if (kHc == 0 && j >= hc) break;
      acc = __fadd_rn(acc, __fmul_rn(pre[j], s[j * H]));
    }
    *out = acc;
  }
}

// post and the Sinkhorn-projected comb of one row from its mixes m ([(2 + hc) * hc], global or
// shared memory), by one warp: lane e holds comb elements e and e + 32 (row-major [j][k], at
// most kMaxHc^2 = 64), the matrix in the warp's kMaxHc^2 floats of shared memory `comb` between
// phases. Each sum runs over its row or column in index order, as the CPU reference sums.
__device__ void WeightsOfRow(const float* m, int hc, const float* scale, const float* base,
                             float eps, int sinkhorn_iters, float* post, float* comb_out,
                             float* comb) {
  const int lane = static_cast<int>(threadIdx.x & 31), n = hc * hc;
  if (lane < hc)
    post[lane] = __fmul_rn(2.0f, Sigmoid(Affine(m[hc + lane], scale[1], base[hc + lane])));
  for (int e = lane; e < n; e += 32) comb[e] = Affine(m[2 * hc + e], scale[2], base[2 * hc + e]);
  __syncwarp();
  float v[2] = {0.0f, 0.0f};
  // Row softmax, + eps.
  for (int i = 0, e = lane; e < n; ++i, e += 32) {
    const float* row = comb + (e / hc) * hc;
    float mx = -INFINITY;
    for (int k = 0; k < hc; ++k) mx = fmaxf(mx, row[k]);
    float sum = 0.0f;
    for (int k = 0; k < hc; ++k) sum = __fadd_rn(sum, expf(__fsub_rn(row[k], mx)));
    v[i] = __fadd_rn(__fdiv_rn(expf(__fsub_rn(comb[e], mx)), sum), eps);
  }
  auto store = [&] {
    __syncwarp();
    for (int i = 0, e = lane; e < n; ++i, e += 32) comb[e] = v[i];
    __syncwarp();
  };
  store();
  auto normalize_columns = [&] {
    for (int i = 0, e = lane; e < n; ++i, e += 32) {
      const int k = e % hc;
      float s = 0.0f;
      for (int j = 0; j < hc; ++j) s = __fadd_rn(s, comb[j * hc + k]);
      v[i] = __fdiv_rn(comb[e], __fadd_rn(s, eps));
    }
    store();
  };
  auto normalize_rows = [&] {
    for (int i = 0, e = lane; e < n; ++i, e += 32) {
      const float* row = comb + (e / hc) * hc;
      float s = 0.0f;
      for (int k = 0; k < hc; ++k) s = __fadd_rn(s, row[k]);
      v[i] = __fdiv_rn(comb[e], __fadd_rn(s, eps));
    }
    store();
  };
  normalize_columns();
  for (int it = 1; it < sinkhorn_iters; ++it) {
    normalize_rows();
    normalize_columns();
  }
  for (int e = lane; e < n; e += 32) comb_out[e] = comb[e];
}

// Row r's post and comb from mixes, by warp 0 of the block.
__device__ void MixWeights(const CollapseParams& p, int64_t r) {
  __shared__ float comb[kMaxHc * kMaxHc];
  if (threadIdx.x >= 32) return;
  WeightsOfRow(p.mixes + r * p.mix_stride, p.hc, p.scale, p.base, p.eps, p.sinkhorn_iters,
               p.post + r * p.hc, p.comb + r * p.hc * p.hc, comb);
}

template <int kHc, int kVec>
__device__ void HcMixBody(CollapseParams p) {
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    if (static_cast<int>(blockIdx.x) == p.chunks) {
      MixWeights(p, r);
    } else {
      CollapseChunk<kHc, kVec>(p, r, blockIdx.x);
    }
  }
}

template <int kHc, int kVec>
__device__ void HcHeadBody(CollapseParams p) {
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    CollapseChunk<kHc, kVec>(p, r, blockIdx.x);
  }
}

struct ExpandParams {
  int64_t rows = 0, hidden = 0;
  int hc = 0;
  const float* block_out = nullptr;
  const float* post = nullptr;
  const float* comb = nullptr;
  const float* streams_in = nullptr;
  float* streams_out = nullptr;
};

template <int kVec>
struct VecOf;
template <>
struct VecOf<4> {
  using T = float4;
};
template <>
struct VecOf<1> {
  using T = float;
};

__device__ __forceinline__ float MulRn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float4 MulRn(float a, float4 b) {
  return make_float4(__fmul_rn(a, b.x), __fmul_rn(a, b.y), __fmul_rn(a, b.z), __fmul_rn(a, b.w));
}
__device__ __forceinline__ float AddRn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float4 AddRn(float4 a, float4 b) {
  return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z),
                     __fadd_rn(a.w, b.w));
}
template <typename V>
__device__ __forceinline__ V Zero();
template <>
__device__ __forceinline__ float Zero<float>() {
  return 0.0f;
}
template <>
__device__ __forceinline__ float4 Zero<float4>() {
  return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

// streams_out[r, k, d] = post[r, k] * block_out[r, d] + sum_j comb[r, j, k] * streams_in[r, j, d].
template <int kHc, int kVec>
__device__ void HcExpandBody(ExpandParams p) {
  using V = typename VecOf<kVec>::T;
  __shared__ float post[kMaxHc], comb[kMaxHc * kMaxHc];
  const int hc = StreamsOf<kHc>(p.hc);
  const int64_t H = p.hidden;
  constexpr int kLoop = kHc > 0 ? kHc : kMaxHc;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    __syncthreads();
    if (threadIdx.x < hc * hc) comb[threadIdx.x] = p.comb[r * hc * hc + threadIdx.x];
    if (threadIdx.x < hc) post[threadIdx.x] = p.post[r * hc + threadIdx.x];
    __syncthreads();
    const int64_t d = (int64_t{blockIdx.x} * kThreads + threadIdx.x) * kVec;
    if (d >= H) continue;
    const V f = *reinterpret_cast<const V*>(p.block_out + r * H + d);
    V in[kLoop];
#pragma unroll
    for (int j = 0; j < kLoop; ++j) {
      if (kHc == 0 && j >= hc) break;
      in[j] = *reinterpret_cast<const V*>(p.streams_in + (r * hc + j) * H + d);
    }
#pragma unroll
    for (int k = 0; k < kLoop; ++k) {
      if (kHc == 0 && k >= hc) break;
      V mixed = Zero<V>();
#pragma unroll
      for (int j = 0; j < kLoop; ++j) {
        if (kHc == 0 && j >= hc) break;
        mixed = AddRn(mixed, MulRn(comb[j * hc + k], in[j]));
      }
      *reinterpret_cast<V*>(p.streams_out + (r * hc + k) * H + d) = AddRn(MulRn(post[k], f), mixed);
    }
  }
}

// HcMixFromStreamsF32's row kernel for 4 streams: WeightBlocks(rows) blocks compute the rows'
// post and comb, a warp per row (RowMixes, WeightsOfRow4: the Sinkhorn iterations' latency then
// stalls no block that holds a row's streams), each other block collapses one row with
// kRowThreads. Block b is weight block b / kBlockPeriod where kBlockPeriod divides b, else the
// collapse of row b - b / kBlockPeriod - 1 (a weight block before each kWeightsWarps rows, so the
// latency-bound weight blocks run among the bandwidth-bound row blocks rather than all first).
// Every thread of a row block first loads its float4 columns of the row's 4 streams (all its
// loads in flight together, the streams read once) while warp 0 computes the row's pre from its
// partials (RowMixes); the collapse then runs on the registers, in HcMixF32's order. With
// `normed`, the collapsed row goes through shared memory so each thread sums the squares of
// RmsNormF32's elements (t, t + 256, ...) in its order, and BlockInvRms reduces them as
// RmsNormF32 does: bit for bit its output (normed_bf16: AddRmsNormF32's out_bf16).
constexpr int kRowThreads = 256;
constexpr int kMaxRowVec = 8;  // float4 columns per thread and stream: hidden <= 8192
constexpr int kWeightsWarps = kRowThreads / 32;
constexpr int kBlockPeriod = kWeightsWarps + 1;
using hc_mix::kStride;

struct RowsParams {
  int64_t rows = 0, hidden = 0, width = 0;
  const float* partials = nullptr;  // [entries, rows, kStride]
  int entries = 0;                  // partials per row and mix
  int group = 1;                    // entries added into each group (hc_mix_partials.cuh)
  float norm_eps = 0.0f;
  const float* base = nullptr;
  const float* scale = nullptr;
  float eps = 0.0f;
  int sinkhorn_iters = 1;
  const float* streams = nullptr;
  float* collapsed = nullptr;  // may be null
  float* post = nullptr;
  float* comb = nullptr;
  const float* norm_weight = nullptr;  // with normed
  float out_norm_eps = 0.0f;
  float* normed = nullptr;          // may be null
  uint16_t* normed_bf16 = nullptr;  // may be null
};

// Blocks of the row kernel that compute post and comb: rows <= kWeightsWarps * WeightBlocks, so
// that block b < rows + WeightBlocks with kBlockPeriod | b has b / kBlockPeriod < WeightBlocks.
__host__ __device__ inline int64_t WeightBlocks(int64_t rows) {
  return (rows + kWeightsWarps - 1) / kWeightsWarps;
}

// Row r's mixes (24 dot products scaled by 1 / rms, RmsNormF32's expression) from its partials,
// by one warp: lane m (where lane_reads; lane 24 the sum of squares) adds its mix's entries,
// `group` at a time from 0, then the groups in order from 0. Lane m < 24 returns mix m.
__device__ float RowMixes(const RowsParams& p, int64_t r, bool lane_reads) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  float sum = 0.0f;
  if (lane_reads) {
    const float* q = p.partials + r * kStride + lane;
    const int64_t step = p.rows * kStride;
    // group is 1 or 4: the loads of 4 groups issue together.
#pragma unroll 4
    for (int g = 0; g < p.entries; g += p.group) {
      float s = __fadd_rn(0.0f, q[g * step]);
      if (p.group == 4) {
        const float b = q[(g + 1) * step], c = q[(g + 2) * step], d = q[(g + 3) * step];
        s = __fadd_rn(__fadd_rn(__fadd_rn(s, b), c), d);
      }
      sum = __fadd_rn(sum, s);
    }
  }
  const float ss = __shfl_sync(0xffffffffu, sum, hc_mix::kMixes);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(p.width) + p.norm_eps);
  return __fmul_rn(sum, inv);
}

// WeightsOfRow for 4 streams on registers (lane e < 16 holds comb element e, the rows' and
// columns' elements exchanged by shuffles): the same operations in the same order, so the same
// bits. m holds mix m at lane m.
__device__ void WeightsOfRow4(float m, const float* scale, const float* base, float eps,
                              int sinkhorn_iters, float* post, float* comb_out) {
  constexpr int kHc = 4;
  const int lane = static_cast<int>(threadIdx.x & 31), e = lane & 15, j = e / kHc, k = e % kHc;
  const float post_logit = __shfl_sync(0xffffffffu, m, kHc + (lane & 3));
  if (lane < kHc)
    post[lane] = __fmul_rn(2.0f, Sigmoid(Affine(post_logit, scale[1], base[kHc + lane])));
  float v = Affine(__shfl_sync(0xffffffffu, m, 2 * kHc + e), scale[2], base[2 * kHc + e]);
  // Row softmax, + eps.
  float mx = -INFINITY;
#pragma unroll
  for (int c = 0; c < kHc; ++c) mx = fmaxf(mx, __shfl_sync(0xffffffffu, v, j * kHc + c));
  const float ex = expf(__fsub_rn(v, mx));
  float sum = 0.0f;
#pragma unroll
  for (int c = 0; c < kHc; ++c) sum = __fadd_rn(sum, __shfl_sync(0xffffffffu, ex, j * kHc + c));
  v = __fadd_rn(__fdiv_rn(ex, sum), eps);
  auto normalize_columns = [&] {
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < kHc; ++c) s = __fadd_rn(s, __shfl_sync(0xffffffffu, v, c * kHc + k));
    v = __fdiv_rn(v, __fadd_rn(s, eps));
  };
  auto normalize_rows = [&] {
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < kHc; ++c) s = __fadd_rn(s, __shfl_sync(0xffffffffu, v, j * kHc + c));
    v = __fdiv_rn(v, __fadd_rn(s, eps));
  };
  normalize_columns();
  for (int it = 1; it < sinkhorn_iters; ++it) {
    normalize_rows();
    normalize_columns();
  }
  if (lane < kHc * kHc) comb_out[lane] = v;
}

template <int kVec>
__device__ void HcMixRowsBody(RowsParams p) {
  constexpr int kHc = 4;
  const int64_t b = blockIdx.x;
  if (b % kBlockPeriod == 0) {
    const int64_t r = b / kBlockPeriod * kWeightsWarps + threadIdx.x / 32;
    if (r >= p.rows) return;  // no block-wide barrier in these blocks
    const float m = RowMixes(p, r, (threadIdx.x & 31) < kStride);
    WeightsOfRow4(m, p.scale, p.base, p.eps, p.sinkhorn_iters, p.post + r * kHc,
                  p.comb + r * kHc * kHc);
    return;
  }
  __shared__ float pre[kHc];
  const int64_t r = b - b / kBlockPeriod - 1;
  const int64_t H = p.hidden;
  const int chunks = static_cast<int>(H / 4);
  const float4* s = reinterpret_cast<const float4*>(p.streams + r * kHc * H);
  float4 v[kHc][kVec];
#pragma unroll
  for (int j = 0; j < kHc; ++j) {
#pragma unroll
    for (int q = 0; q < kVec; ++q) {
      const int c = static_cast<int>(threadIdx.x) + q * kRowThreads;
      v[j][q] = c < chunks ? s[j * chunks + c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    const float m = RowMixes(p, r, lane < kHc || lane == hc_mix::kMixes);
    if (lane < kHc) pre[lane] = __fadd_rn(Sigmoid(Affine(m, p.scale[0], p.base[lane])), p.eps);
  }
  __syncthreads();
  float w[kHc];
#pragma unroll
  for (int j = 0; j < kHc; ++j) w[j] = pre[j];
  float4 acc[kVec];
#pragma unroll
  for (int q = 0; q < kVec; ++q) {
    acc[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int j = 0; j < kHc; ++j) {
      acc[q].x = __fadd_rn(acc[q].x, __fmul_rn(w[j], v[j][q].x));
      acc[q].y = __fadd_rn(acc[q].y, __fmul_rn(w[j], v[j][q].y));
      acc[q].z = __fadd_rn(acc[q].z, __fmul_rn(w[j], v[j][q].z));
      acc[q].w = __fadd_rn(acc[q].w, __fmul_rn(w[j], v[j][q].w));
    }
  }
  if (p.collapsed != nullptr) {
    float4* out = reinterpret_cast<float4*>(p.collapsed + r * H);
#pragma unroll
    for (int q = 0; q < kVec; ++q) {
      const int c = static_cast<int>(threadIdx.x) + q * kRowThreads;
      if (c < chunks) out[c] = acc[q];
    }
  }
  if (p.normed == nullptr && p.normed_bf16 == nullptr) return;
  __shared__ float4 staged[kRowThreads * kVec];
#pragma unroll
  for (int q = 0; q < kVec; ++q) {
    const int c = static_cast<int>(threadIdx.x) + q * kRowThreads;
    if (c < chunks) staged[c] = acc[q];
  }
  __syncthreads();
  const float* x = reinterpret_cast<const float*>(staged);
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < 4 * kVec; ++j) {
    const int i = static_cast<int>(threadIdx.x) + j * kRowThreads;
    if (i < H) ss += x[i] * x[i];
  }
  const float inv = BlockInvRms<kRowThreads / 32>(ss, H, p.out_norm_eps);
  const float4* weight = reinterpret_cast<const float4*>(p.norm_weight);
#pragma unroll
  for (int q = 0; q < kVec; ++q) {
    const int c = static_cast<int>(threadIdx.x) + q * kRowThreads;
    if (c < chunks) {
      const float4 g = weight[c];
      float4 o;
      o.x = g.x * (acc[q].x * inv);
      o.y = g.y * (acc[q].y * inv);
      o.z = g.z * (acc[q].z * inv);
      o.w = g.w * (acc[q].w * inv);
      if (p.normed != nullptr) reinterpret_cast<float4*>(p.normed + r * H)[c] = o;
      if (p.normed_bf16 != nullptr) {
        uint2 packed;
        packed.x = static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(o.x))) |
                   (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(o.y))) << 16);
        packed.y = static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(o.z))) |
                   (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(o.w))) << 16);
        reinterpret_cast<uint2*>(p.normed_bf16 + r * H)[c] = packed;
      }
    }
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool BadShape(int64_t rows, int64_t hc, int64_t hidden) {
  return rows < 0 || hidden < 0 || hc < 1 || hc > kMaxHcStreams;
}

dim3 GridOf(int chunks, int64_t rows) {
  return dim3(static_cast<unsigned>(chunks),
              static_cast<unsigned>(std::min<int64_t>(rows, kMaxGridY)));
}

int ChunksOf(int64_t hidden, int vec) {
  const int64_t cols = int64_t{kThreads} * vec;
  return static_cast<int>((hidden + cols - 1) / cols);
}

// Runs Launch<kHc, kVec>() for the stream count and vector width.
template <typename L>
cudaError_t Dispatch(int hc, bool vec4, L&& launch) {
  if (hc == 4)
    return vec4 ? launch.template operator()<4, 4>() : launch.template operator()<4, 1>();
  return vec4 ? launch.template operator()<0, 4>() : launch.template operator()<0, 1>();
}

struct MixLaunch {
  CollapseParams p;
  dim3 grid;
  cudaStream_t stream;
  template <int kHc, int kVec>
  cudaError_t operator()() const {
    return LaunchAfterPrecedingGrids<HcMixBody<kHc, kVec>, kThreads>(grid, 0, stream, p);
  }
};

struct HeadLaunch {
  CollapseParams p;
  dim3 grid;
  cudaStream_t stream;
  template <int kHc, int kVec>
  cudaError_t operator()() const {
    return LaunchAfterPrecedingGrids<HcHeadBody<kHc, kVec>, kThreads>(grid, 0, stream, p);
  }
};

struct ExpandLaunch {
  ExpandParams p;
  dim3 grid;
  cudaStream_t stream;
  template <int kHc, int kVec>
  cudaError_t operator()() const {
    return LaunchAfterPrecedingGrids<HcExpandBody<kHc, kVec>, kThreads>(grid, 0, stream, p);
  }
};

// HcMixF32's launch.
cudaError_t LaunchMix(const HcMixArgs& a, cudaStream_t stream) {
  const bool vec4 = a.hidden % 4 == 0 && Aligned16(a.streams) && Aligned16(a.collapsed);
  CollapseParams p;
  p.rows = a.rows;
  p.hidden = a.hidden;
  p.hc = static_cast<int>(a.hc);
  p.chunks = ChunksOf(a.hidden, vec4 ? 4 : 1);
  p.mixes = a.mixes;
  p.mix_stride = (2 + a.hc) * a.hc;
  p.base = a.base;
  p.scale = a.scale;
  p.eps = a.eps;
  p.streams = a.streams;
  p.out = a.collapsed;
  p.post = a.post;
  p.comb = a.comb;
  p.sinkhorn_iters = a.sinkhorn_iters;
  return Dispatch(p.hc, vec4, MixLaunch{p, GridOf(p.chunks + 1, a.rows), stream});
}

}  // namespace

cudaError_t HcMixF32(const HcMixArgs& a, cudaStream_t stream) {
  if (BadShape(a.rows, a.hc, a.hidden) || a.sinkhorn_iters < 1) return cudaErrorInvalidValue;
  if (a.rows == 0) return cudaSuccess;
  return LaunchMix(a, stream);
}

bool HcMixFromStreamsSupported(const HcMixArgs& a) {
  return a.hc == 4 && a.hidden > 0 && a.hidden % 32 == 0 &&
         a.hidden <= int64_t{kRowThreads} * 4 * kMaxRowVec && a.rows >= 0 && a.rows <= 0x7fffffff &&
         a.sinkhorn_iters >= 1 && a.fn != nullptr && Aligned16(a.streams) && Aligned16(a.fn) &&
         Aligned16(a.collapsed) && Aligned16(a.normed) &&
         reinterpret_cast<uintptr_t>(a.normed_bf16) % 8 == 0 &&
         ((a.normed == nullptr && a.normed_bf16 == nullptr) ||
          (a.out_norm_weight != nullptr && Aligned16(a.out_norm_weight)));
}

// The partials' entries per row and mix: every chain below hc_mix::kTileMinRows rows, every group
// from there.
int64_t HcMixFromStreamsWorkspaceFloats(int64_t rows, int64_t hc, int64_t hidden) {
  const int64_t width = hc * hidden;
  const int64_t chains = width / hc_mix::ChainLength(width);
  const int64_t entries =
      rows >= hc_mix::kTileMinRows ? chains / hc_mix::ChainGroup(chains) : chains;
  return entries * rows * ((2 + hc) * hc + 1);
}

namespace {

// Whether the device runs HcMixTcKernel's sm_80 code.
bool TensorCoresRun() {
  const KernelFacts f = KernelFactsForCurrentDevice(
      reinterpret_cast<const void*>(hc_mix::HcMixTcKernel), /*dynamic_smem=*/0);
  return f.error == cudaSuccess && f.ptx_version >= 80;
}

}  // namespace

cudaError_t HcMixFromStreamsF32(const HcMixArgs& a, float* workspace, cudaStream_t stream,
                                HcMixGemm gemm) {
  if (!HcMixFromStreamsSupported(a) || workspace == nullptr) return cudaErrorInvalidValue;
  if (a.rows == 0) return cudaSuccess;
  if (a.rows + WeightBlocks(a.rows) > 0x7fffffff) return cudaErrorInvalidValue;  // the row grid
  hc_mix::PartialsParams q;
  q.rows = a.rows;
  q.width = a.hc * a.hidden;
  q.chain = static_cast<int>(hc_mix::ChainLength(q.width));
  const int64_t chains = q.width / q.chain;
  q.group = static_cast<int>(hc_mix::ChainGroup(chains));
  q.streams = a.streams;
  q.fn = a.fn;
  q.partials = workspace;
  const bool tiled = a.rows >= hc_mix::kTileMinRows;
  cudaError_t err;
  const bool tensor_cores = tiled && gemm != HcMixGemm::kFp32 && TensorCoresRun();
  if (tiled && gemm == HcMixGemm::kTensorCores && !tensor_cores) return cudaErrorNotSupported;
  if (tensor_cores) {
    q.slice = q.group * q.chain;
    const dim3 grid(static_cast<unsigned>((a.rows + hc_mix::kTcRows - 1) / hc_mix::kTcRows),
                    static_cast<unsigned>(chains / q.group));
    hc_mix::HcMixTcKernel<<<grid, hc_mix::kTcThreads, 0, stream>>>(q);
    err = cudaGetLastError();
  } else if (tiled) {
    const dim3 grid(static_cast<unsigned>((a.rows + hc_mix::kTileRows - 1) / hc_mix::kTileRows),
                    static_cast<unsigned>(chains / q.group));
    hc_mix::HcMixTileKernel<<<grid, hc_mix::kTileThreads, 0, stream>>>(q);
    err = cudaGetLastError();
  } else if (a.rows > hc_mix::kChainRows) {
    const dim3 grid(static_cast<unsigned>((a.rows + hc_mix::kPairRows - 1) / hc_mix::kPairRows),
                    static_cast<unsigned>(chains));
    err = LaunchPrefetchThenAfterPrecedingGrids<hc_mix::HcMixPairsPrefetch, hc_mix::HcMixPairsBody,
                                                hc_mix::kChainThreads>(grid, 0, stream, q);
  } else {
    q.tile_rows = a.rows <= 1 ? 1 : a.rows <= 2 ? 2 : a.rows <= 4 ? 4 : hc_mix::kChainRows;
    const dim3 grid(static_cast<unsigned>((a.rows + q.tile_rows - 1) / q.tile_rows),
                    static_cast<unsigned>(chains), hc_mix::kFifths);
    err =
        LaunchPrefetchThenAfterPrecedingGrids<hc_mix::HcMixChainsPrefetch, hc_mix::HcMixChainsBody,
                                              hc_mix::kChainThreads>(grid, 0, stream, q);
  }
  if (err != cudaSuccess) return err;
  RowsParams p;
  p.rows = a.rows;
  p.hidden = a.hidden;
  p.width = q.width;
  p.partials = workspace;
  p.entries = static_cast<int>(tiled ? chains / q.group : chains);
  p.group = tiled ? 1 : q.group;
  p.norm_eps = a.norm_eps;
  p.base = a.base;
  p.scale = a.scale;
  p.eps = a.eps;
  p.sinkhorn_iters = a.sinkhorn_iters;
  p.streams = a.streams;
  p.collapsed = a.collapsed;
  p.post = a.post;
  p.comb = a.comb;
  p.norm_weight = a.out_norm_weight;
  p.out_norm_eps = a.out_norm_eps;
  p.normed = a.normed;
  p.normed_bf16 = a.normed_bf16;
  const unsigned blocks = static_cast<unsigned>(a.rows + WeightBlocks(a.rows));
  const int64_t per_thread = (a.hidden / 4 + kRowThreads - 1) / kRowThreads;
  if (per_thread <= 1)
    return LaunchAfterPrecedingGrids<HcMixRowsBody<1>, kRowThreads>(blocks, 0, stream, p);
  if (per_thread <= 2)
    return LaunchAfterPrecedingGrids<HcMixRowsBody<2>, kRowThreads>(blocks, 0, stream, p);
  if (per_thread <= 4)
    return LaunchAfterPrecedingGrids<HcMixRowsBody<4>, kRowThreads>(blocks, 0, stream, p);
  return LaunchAfterPrecedingGrids<HcMixRowsBody<8>, kRowThreads>(blocks, 0, stream, p);
}

cudaError_t HcHeadF32(const HcHeadArgs& a, cudaStream_t stream) {
  if (BadShape(a.rows, a.hc, a.hidden)) return cudaErrorInvalidValue;
  if (a.rows == 0 || a.hidden == 0) return cudaSuccess;
  const bool vec4 = a.hidden % 4 == 0 && Aligned16(a.streams) && Aligned16(a.out);
  CollapseParams p;
  p.rows = a.rows;
  p.hidden = a.hidden;
  p.hc = static_cast<int>(a.hc);
  p.chunks = ChunksOf(a.hidden, vec4 ? 4 : 1);
  p.mixes = a.mixes;
  p.mix_stride = a.hc;
  p.base = a.base;
  p.scale = a.scale;
  p.eps = a.eps;
  p.streams = a.streams;
  p.out = a.out;
  return Dispatch(p.hc, vec4, HeadLaunch{p, GridOf(p.chunks, a.rows), stream});
}

cudaError_t HcExpandF32(const HcExpandArgs& a, cudaStream_t stream) {
  if (BadShape(a.rows, a.hc, a.hidden)) return cudaErrorInvalidValue;
  if (a.rows == 0 || a.hidden == 0) return cudaSuccess;
  const bool vec4 = a.hidden % 4 == 0 && Aligned16(a.block_out) && Aligned16(a.streams_in) &&
                    Aligned16(a.streams_out);
  ExpandParams p;
  p.rows = a.rows;
  p.hidden = a.hidden;
  p.hc = static_cast<int>(a.hc);
  p.block_out = a.block_out;
  p.post = a.post;
  p.comb = a.comb;
  p.streams_in = a.streams_in;
  p.streams_out = a.streams_out;
  return Dispatch(p.hc, vec4,
                  ExpandLaunch{p, GridOf(ChunksOf(a.hidden, vec4 ? 4 : 1), a.rows), stream});
}

}  // namespace kernels
}  // namespace deepinfer
