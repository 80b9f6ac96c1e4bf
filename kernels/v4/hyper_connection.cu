// Hyper-connection kernels. Grids are (blocks along hidden [+ 1], rows); a block handles
// kThreads * kVec columns of one row (kVec = 4: 16-byte loads where hidden and the pointers
// allow). The stream count is a template parameter for V4's 4 (the loops unrolled over
// registers) and a runtime value up to kMaxHcStreams otherwise. Arithmetic uses the _rn
// intrinsics so nvcc does not contract a product and a sum into one FMA: the sums then round as
// the CPU reference's do.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/common/launch.cuh"
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
  // HcMixFromStreamsF32 only (mixes null): per slice s of the flattened rows of `width` floats,
  // row r's dot products with fn then its sum of squares at partials + (s * rows + r) *
  // (mix_stride + 1).
  const float* partials = nullptr;
  int splits = 0;
  int64_t width = 0;
  float norm_eps = 0.0f;
};

// Row r's mix m: from mixes, or from the partials: the slices' dot products and sums of squares
// added in slice order, the dot product times 1 / rms (RmsNormF32's expression).
__device__ __forceinline__ float MixOf(const CollapseParams& p, int64_t r, int m) {
  if (p.partials == nullptr) return p.mixes[r * p.mix_stride + m];
  const int64_t stride = p.mix_stride + 1;
  float dot = 0.0f, ss = 0.0f;
  for (int s = 0; s < p.splits; ++s) {
    const float* q = p.partials + (int64_t{s} * p.rows + r) * stride;
    dot = __fadd_rn(dot, q[m]);
    ss = __fadd_rn(ss, q[p.mix_stride]);
  }
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(p.width) + p.norm_eps);
  return __fmul_rn(dot, inv);
}

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
    pre[j] = __fadd_rn(Sigmoid(Affine(MixOf(p, r, j), p.scale[0], p.base[j])), p.eps);
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

// post and the Sinkhorn-projected comb of row r, by warp 0: lane e holds comb elements e and
// e + 32 (row-major [j][k], at most kMaxHc^2 = 64), the matrix in shared memory between phases.
// Each sum runs over its row or column in index order, as the CPU reference sums.
__device__ void MixWeights(const CollapseParams& p, int64_t r) {
  __shared__ float comb[kMaxHc * kMaxHc];
  __shared__ float row_mixes[(2 + kMaxHc) * kMaxHc];
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x, hc = p.hc, n = hc * hc;
  if (p.partials != nullptr) {
    __syncwarp();  // the previous row's readers of row_mixes are done
    for (int e = lane; e < p.mix_stride; e += 32) row_mixes[e] = MixOf(p, r, e);
    __syncwarp();
  }
  const float* m = p.partials != nullptr ? row_mixes : p.mixes + r * p.mix_stride;
  if (lane < hc) {
    p.post[r * hc + lane] =
        __fmul_rn(2.0f, Sigmoid(Affine(m[hc + lane], p.scale[1], p.base[hc + lane])));
  }
  for (int e = lane; e < n; e += 32)
    comb[e] = Affine(m[2 * hc + e], p.scale[2], p.base[2 * hc + e]);
  __syncwarp();
  float v[2] = {0.0f, 0.0f};
  // Row softmax, + eps.
  for (int i = 0, e = lane; e < n; ++i, e += 32) {
    const float* row = comb + (e / hc) * hc;
    float mx = -INFINITY;
    for (int k = 0; k < hc; ++k) mx = fmaxf(mx, row[k]);
    float sum = 0.0f;
    for (int k = 0; k < hc; ++k) sum = __fadd_rn(sum, expf(__fsub_rn(row[k], mx)));
    v[i] = __fadd_rn(__fdiv_rn(expf(__fsub_rn(comb[e], mx)), sum), p.eps);
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
      v[i] = __fdiv_rn(comb[e], __fadd_rn(s, p.eps));
    }
    store();
  };
  auto normalize_rows = [&] {
    for (int i = 0, e = lane; e < n; ++i, e += 32) {
      const float* row = comb + (e / hc) * hc;
      float s = 0.0f;
      for (int k = 0; k < hc; ++k) s = __fadd_rn(s, row[k]);
      v[i] = __fdiv_rn(comb[e], __fadd_rn(s, p.eps));
    }
    store();
  };
  normalize_columns();
  for (int it = 1; it < p.sinkhorn_iters; ++it) {
    normalize_rows();
    normalize_columns();
  }
  for (int e = lane; e < n; e += 32) p.comb[r * n + e] = comb[e];
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

// HcMixFromStreamsF32's first launch for 4 streams (24 mixes): block (b, s) takes rows
// kPartialRowsPerBlock * b onwards, two per warp, over slice s of the flattened rows (`slice`
// floats from s * slice):
// lane l reads floats 4 l, 4 l + 128, ... of it for both rows and fn's 24 rows, and keeps 24 dot
// products and the sum of squares per row; the warp then adds its lanes' (xor butterfly) and
// lane 0 writes them to partials [splits, rows, 25].
constexpr int kPartialMixes = 24, kPartialStride = kPartialMixes + 1;
constexpr int kPartialRowsPerBlock = 2 * (kThreads / 32);

struct PartialsParams {
  int64_t rows = 0, width = 0, slice = 0;
  const float* streams = nullptr;
  const float* fn = nullptr;
  float* partials = nullptr;
};

__device__ __forceinline__ float Dot4(float acc, float4 a, float4 b) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

__device__ void HcMixPartialsBody(PartialsParams p) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t r0 = int64_t{blockIdx.x} * kPartialRowsPerBlock + 2 * (threadIdx.x / 32);
  if (r0 >= p.rows) return;  // no block-wide barrier below
  const bool two = r0 + 1 < p.rows;
  const int64_t k0 = int64_t{blockIdx.y} * p.slice;
  const float* x0 = p.streams + r0 * p.width;
  const float* x1 = two ? x0 + p.width : x0;
  float a0[kPartialStride], a1[kPartialStride];
#pragma unroll
  for (int i = 0; i < kPartialStride; ++i) a0[i] = a1[i] = 0.0f;
  for (int64_t k = k0 + 4 * lane; k < k0 + p.slice; k += 128) {
    const float4 v0 = *reinterpret_cast<const float4*>(x0 + k);
    const float4 v1 = *reinterpret_cast<const float4*>(x1 + k);
#pragma unroll
    for (int m = 0; m < kPartialMixes; ++m) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(p.fn + m * p.width + k));
      a0[m] = Dot4(a0[m], v0, f);
      a1[m] = Dot4(a1[m], v1, f);
    }
    a0[kPartialMixes] = Dot4(a0[kPartialMixes], v0, v0);
    a1[kPartialMixes] = Dot4(a1[kPartialMixes], v1, v1);
  }
#pragma unroll
  for (int i = 0; i < kPartialStride; ++i) {
    for (int o = 16; o > 0; o >>= 1) {
      a0[i] += __shfl_xor_sync(0xffffffffu, a0[i], o);
      a1[i] += __shfl_xor_sync(0xffffffffu, a1[i], o);
    }
  }
  if (lane != 0) return;
  float* q = p.partials + (int64_t{blockIdx.y} * p.rows + r0) * kPartialStride;
#pragma unroll
  for (int i = 0; i < kPartialStride; ++i) q[i] = a0[i];
  if (two) {
#pragma unroll
    for (int i = 0; i < kPartialStride; ++i) q[kPartialStride + i] = a1[i];
  }
}

// Floats of the flattened row per slice: 512 (32 blocks along a 16384-wide row, enough for one
// decode row; fn's reads from L2 depend only on the rows per block), 128 where 512 does not
// divide the width.
int64_t PartialSlice(int64_t width) { return width % 512 == 0 ? 512 : 128; }

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

// HcMix's launch: mixes from a.mixes, or (partials not null) from `splits` slices' partials.
cudaError_t LaunchMix(const HcMixArgs& a, const float* partials, int splits, cudaStream_t stream) {
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
  p.partials = partials;
  p.splits = splits;
  p.width = a.hc * a.hidden;
  p.norm_eps = a.norm_eps;
  return Dispatch(p.hc, vec4, MixLaunch{p, GridOf(p.chunks + 1, a.rows), stream});
}

}  // namespace

cudaError_t HcMixF32(const HcMixArgs& a, cudaStream_t stream) {
  if (BadShape(a.rows, a.hc, a.hidden) || a.sinkhorn_iters < 1) return cudaErrorInvalidValue;
  if (a.rows == 0) return cudaSuccess;
  return LaunchMix(a, nullptr, 0, stream);
}

bool HcMixFromStreamsSupported(const HcMixArgs& a) {
  return a.hc == 4 && a.hidden > 0 && a.hidden % 32 == 0 && a.rows >= 0 && a.sinkhorn_iters >= 1 &&
         a.fn != nullptr && Aligned16(a.streams) && Aligned16(a.fn);
}

int64_t HcMixFromStreamsWorkspaceFloats(int64_t rows, int64_t hc, int64_t hidden) {
  const int64_t width = hc * hidden;
  return width / PartialSlice(width) * rows * ((2 + hc) * hc + 1);
}

cudaError_t HcMixFromStreamsF32(const HcMixArgs& a, float* workspace, cudaStream_t stream) {
  if (!HcMixFromStreamsSupported(a) || workspace == nullptr) return cudaErrorInvalidValue;
  if (a.rows == 0) return cudaSuccess;
  PartialsParams q;
  q.rows = a.rows;
  q.width = a.hc * a.hidden;
  q.slice = PartialSlice(q.width);
  q.streams = a.streams;
  q.fn = a.fn;
  q.partials = workspace;
  const int64_t splits = q.width / q.slice;
  if (splits > kMaxGridY) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((a.rows + kPartialRowsPerBlock - 1) / kPartialRowsPerBlock),
                  static_cast<unsigned>(splits));
  const cudaError_t err =
      LaunchAfterPrecedingGrids<HcMixPartialsBody, kThreads>(grid, 0, stream, q);
  if (err != cudaSuccess) return err;
  return LaunchMix(a, workspace, static_cast<int>(splits), stream);
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
