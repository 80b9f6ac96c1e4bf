// Small-m bf16 GEMM, two layouts (SmallMGemmAlgo). kRowPerGroup: a group of G lanes (G = 32 for
// long rows, fewer for short ones) owns one weight row at a time; each lane reads 16-byte chunks
// of it (8 bf16), several chunks in flight, multiplies them with the same k slice of each of the
// m activation rows (read through L1, where the rows stay: every group of the SM reads the same m
// rows), and the group sums its lanes' partials with shuffles. kSplitK: S warps of a block share
// one weight row (the row's 256-value groups dealt out round robin), every warp issues all its
// loads of a round (up to 4 x 16 bytes a lane) before using any, and the S partial sums meet in
// shared memory, added in warp order (deterministic); so mid-size matrices get many blocks and
// one round of loads instead of a few blocks that wait on several dependent rounds.
//
// Both are launched with programmatic dependent launch (kernels/common/launch.cuh): the first
// round of weight loads is issued before the wait for the preceding kernel (weights are never
// written during a step), so it overlaps that kernel's tail and this kernel's launch.
#include <cuda_bf16.h>

#include "kernels/common/launch.cuh"
#include "kernels/common/streaming_load.cuh"
#include "kernels/gemm/small_m_gemm.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // 16-byte weight chunks each lane has in flight

__device__ __forceinline__ float Bf16Lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float Bf16Hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }
__device__ __forceinline__ float RoundBf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

// The 8 values a[p .. p+8) as fp32 (bf16-rounded).
template <bool kBf16A>
__device__ __forceinline__ void LoadA8(const void* row, int64_t p, float (&v)[8]) {
  if constexpr (kBf16A) {
    const uint4 q = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(row) + p));
    v[0] = Bf16Lo(q.x), v[1] = Bf16Hi(q.x), v[2] = Bf16Lo(q.y), v[3] = Bf16Hi(q.y);
    v[4] = Bf16Lo(q.z), v[5] = Bf16Hi(q.z), v[6] = Bf16Lo(q.w), v[7] = Bf16Hi(q.w);
  } else {
    const float4* f = reinterpret_cast<const float4*>(static_cast<const float*>(row) + p);
    const float4 x = __ldg(f), y = __ldg(f + 1);
    v[0] = RoundBf16(x.x), v[1] = RoundBf16(x.y), v[2] = RoundBf16(x.z), v[3] = RoundBf16(x.w);
    v[4] = RoundBf16(y.x), v[5] = RoundBf16(y.y), v[6] = RoundBf16(y.z), v[7] = RoundBf16(y.w);
  }
}

// A lane's first round of 16-byte weight chunks, loaded before the wait.
template <int N>
struct WeightChunks {
  uint4 q[N];
};

// kRowPerGroup's first main-loop round (none if the row is too short for one).
template <int M, bool kBf16A, int G>
__device__ WeightChunks<kUnroll> RowPerGroupPrefetch(int64_t n, int64_t k, const void* a,
                                                     int64_t lda, const uint16_t* w, int64_t ldw,
                                                     float* c, int64_t ldc, bool accumulate,
                                                     int64_t stride_a, int64_t stride_w,
                                                     int64_t stride_c) {
  constexpr int kRowsPerBlock = kThreads / G;
  constexpr int64_t kStep = 8 * G;
  WeightChunks<kUnroll> first;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / G;
  const int64_t p = 8 * (threadIdx.x % G);
  if (j < n && p + (kUnroll - 1) * kStep < k) {
    const uint16_t* wr = w + blockIdx.y * stride_w + j * ldw;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      first.q[u] = __ldg(reinterpret_cast<const uint4*>(wr + p + u * kStep));
    }
  }
  return first;
}

template <int M, bool kBf16A, int G>
__device__ void RowPerGroupBody(const WeightChunks<kUnroll>& first, int64_t n, int64_t k,
                                const void* __restrict__ a, int64_t lda,
                                const uint16_t* __restrict__ w, int64_t ldw, float* __restrict__ c,
                                int64_t ldc, bool accumulate, int64_t stride_a, int64_t stride_w,
                                int64_t stride_c) {
  constexpr int kRowsPerBlock = kThreads / G;
  const int lane = threadIdx.x % G;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / G;
  const int64_t b = blockIdx.y;
  const size_t a_bytes = kBf16A ? 2 : 4;
  const char* ab = static_cast<const char*>(a) + b * stride_a * a_bytes;
  const uint16_t* wr = w + b * stride_w + j * ldw;
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.0f;
  if (j < n) {
    constexpr int64_t kStep = 8 * G;  // k values per group pass
    int64_t p = 8 * lane;
    // Main loop: kUnroll chunks loaded before any is used (the first round by the prefetch).
    for (; p + (kUnroll - 1) * kStep < k; p += kUnroll * kStep) {
      uint4 wq[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        wq[u] =
            p == 8 * lane ? first.q[u] : __ldg(reinterpret_cast<const uint4*>(wr + p + u * kStep));
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float wv[8] = {Bf16Lo(wq[u].x), Bf16Hi(wq[u].x), Bf16Lo(wq[u].y), Bf16Hi(wq[u].y),
                             Bf16Lo(wq[u].z), Bf16Hi(wq[u].z), Bf16Lo(wq[u].w), Bf16Hi(wq[u].w)};
#pragma unroll
        for (int r = 0; r < M; ++r) {
          float av[8];
          LoadA8<kBf16A>(ab + r * lda * a_bytes, p + u * kStep, av);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r] = fmaf(av[e], wv[e], acc[r]);
        }
      }
    }
    for (; p < k; p += kStep) {
      const uint4 q = __ldg(reinterpret_cast<const uint4*>(wr + p));
      const float wv[8] = {Bf16Lo(q.x), Bf16Hi(q.x), Bf16Lo(q.y), Bf16Hi(q.y),
                           Bf16Lo(q.z), Bf16Hi(q.z), Bf16Lo(q.w), Bf16Hi(q.w)};
#pragma unroll
      for (int r = 0; r < M; ++r) {
        float av[8];
        LoadA8<kBf16A>(ab + r * lda * a_bytes, p, av);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r] = fmaf(av[e], wv[e], acc[r]);
      }
    }
  }
  // Sum the group's lanes (groups are aligned within the warp; every lane takes part).
#pragma unroll
  for (int r = 0; r < M; ++r) {
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
  }
  if (j < n && lane == 0) {
    float* cb = c + b * stride_c + j;
#pragma unroll
    for (int r = 0; r < M; ++r) {
      float* cr = cb + r * ldc;
      *cr = accumulate ? *cr + acc[r] : acc[r];
    }
  }
}

constexpr int kSplitKWarps = kThreads / 32;
constexpr int kSplitKChunks = 4;  // 16-byte weight chunks per lane and round

// kSplitK: S warps per weight row, kSplitKWarps / S rows per block.
// The weight chunks of this lane's round: groups g0, g0 + S, ... (zeros past the row's end).
template <int S>
__device__ __forceinline__ void LoadSplitKRound(const uint16_t* wr, int64_t chunks, int64_t g0,
                                                int lane, WeightChunks<kSplitKChunks>& wq) {
#pragma unroll
  for (int u = 0; u < kSplitKChunks; ++u) {
    const int64_t q = (g0 + u * S) * 32 + lane;
    wq.q[u] = q < chunks ? LoadStreaming16(wr + 8 * q) : make_uint4(0, 0, 0, 0);
  }
}

// kSplitK's first round of weight loads.
template <int M, bool kBf16A, int S>
__device__ WeightChunks<kSplitKChunks> SplitKPrefetch(int64_t n, int64_t k, const void* a,
                                                      int64_t lda, const uint16_t* w, int64_t ldw,
                                                      float* c, int64_t ldc, bool accumulate,
                                                      int64_t stride_a, int64_t stride_w,
                                                      int64_t stride_c) {
  constexpr int kRowsPerBlock = kSplitKWarps / S;
  WeightChunks<kSplitKChunks> first;
  const int warp = threadIdx.x / 32;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp / S;
  if (j < n) {
    LoadSplitKRound<S>(w + blockIdx.y * stride_w + j * ldw, k / 8, warp % S, threadIdx.x % 32,
                       first);
  }
  return first;
}

template <int M, bool kBf16A, int S>
__device__ void SplitKBody(const WeightChunks<kSplitKChunks>& first, int64_t n, int64_t k,
                           const void* __restrict__ a, int64_t lda, const uint16_t* __restrict__ w,
                           int64_t ldw, float* __restrict__ c, int64_t ldc, bool accumulate,
                           int64_t stride_a, int64_t stride_w, int64_t stride_c) {
  constexpr int kRowsPerBlock = kSplitKWarps / S;
  __shared__ float partial[kSplitKWarps][M];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slice = warp % S;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp / S;
  const int64_t b = blockIdx.y;
  const size_t a_bytes = kBf16A ? 2 : 4;
  const char* ab = static_cast<const char*>(a) + b * stride_a * a_bytes;
  if (j < n) {
    const uint16_t* wr = w + b * stride_w + j * ldw;
    const int64_t chunks = k / 8;               // 16-byte chunks of the row
    const int64_t groups = (chunks + 31) / 32;  // 32 chunks: one warp-wide load
    float acc[M];
#pragma unroll
    for (int r = 0; r < M; ++r) acc[r] = 0.0f;
    // This warp's groups: slice, slice + S, ...; kSplitKChunks of them per round (the first
    // round loaded by the prefetch).
    for (int64_t g0 = slice; g0 < groups; g0 += S * kSplitKChunks) {
      WeightChunks<kSplitKChunks> round = first;
      if (g0 != slice) LoadSplitKRound<S>(wr, chunks, g0, lane, round);
      const uint4* wq = round.q;
#pragma unroll
      for (int u = 0; u < kSplitKChunks; ++u) {
        const int64_t q = (g0 + u * S) * 32 + lane;
        if (q >= chunks) continue;
        const float wv[8] = {Bf16Lo(wq[u].x), Bf16Hi(wq[u].x), Bf16Lo(wq[u].y), Bf16Hi(wq[u].y),
                             Bf16Lo(wq[u].z), Bf16Hi(wq[u].z), Bf16Lo(wq[u].w), Bf16Hi(wq[u].w)};
#pragma unroll
        for (int r = 0; r < M; ++r) {
          float av[8];
          LoadA8<kBf16A>(ab + r * lda * a_bytes, 8 * q, av);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r] = fmaf(av[e], wv[e], acc[r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < M; ++r) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
      if (lane == 0) partial[warp][r] = acc[r];
    }
  }
  __syncthreads();
  // One thread per (row, activation row) adds the row's S partials in warp order.
  if (threadIdx.x < kRowsPerBlock * M) {
    const int row = threadIdx.x / M, r = threadIdx.x % M;
    const int64_t jj = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + row;
    if (jj < n) {
      float sum = 0.0f;
#pragma unroll
      for (int s = 0; s < S; ++s) sum += partial[row * S + s][r];
      float* cr = c + b * stride_c + r * ldc + jj;
      *cr = accumulate ? *cr + sum : sum;
    }
  }
}

template <int M, bool kBf16A, int S>
cudaError_t LaunchSplitK(const SmallMGemmParams& p, cudaStream_t stream) {
  constexpr int64_t kRowsPerBlock = kSplitKWarps / S;
  const dim3 grid(static_cast<unsigned>((p.n + kRowsPerBlock - 1) / kRowsPerBlock),
                  static_cast<unsigned>(p.batch));
  return LaunchPrefetchThenAfterPrecedingGrids<SplitKPrefetch<M, kBf16A, S>,
                                               SplitKBody<M, kBf16A, S>, kThreads>(
      grid, 0, stream, p.n, p.k, p.a, p.lda, p.w, p.ldw, p.c, p.ldc, p.accumulate, p.stride_a,
      p.stride_w, p.stride_c);
}

// The fewest warps per row that leave each at most kSplitKChunks groups (one round), up to 8.
template <int M, bool kBf16A>
cudaError_t LaunchSplitKForK(const SmallMGemmParams& p, cudaStream_t stream) {
  const int64_t groups = (p.k / 8 + 31) / 32;
  if (groups <= kSplitKChunks) {
    return LaunchSplitK<M, kBf16A, 1>(p, stream);
  } else if (groups <= 2 * kSplitKChunks) {
    return LaunchSplitK<M, kBf16A, 2>(p, stream);
  } else if (groups <= 4 * kSplitKChunks) {
    return LaunchSplitK<M, kBf16A, 4>(p, stream);
  } else {
    return LaunchSplitK<M, kBf16A, 8>(p, stream);
  }
}

template <int M, bool kBf16A, int G>
cudaError_t Launch(const SmallMGemmParams& p, cudaStream_t stream) {
  constexpr int64_t kRowsPerBlock = kThreads / G;
  const dim3 grid(static_cast<unsigned>((p.n + kRowsPerBlock - 1) / kRowsPerBlock),
                  static_cast<unsigned>(p.batch));
  return LaunchPrefetchThenAfterPrecedingGrids<RowPerGroupPrefetch<M, kBf16A, G>,
                                               RowPerGroupBody<M, kBf16A, G>, kThreads>(
      grid, 0, stream, p.n, p.k, p.a, p.lda, p.w, p.ldw, p.c, p.ldc, p.accumulate, p.stride_a,
      p.stride_w, p.stride_c);
}

template <int M, bool kBf16A>
cudaError_t LaunchForK(const SmallMGemmParams& p, cudaStream_t stream) {
  const bool split_k = p.algo == SmallMGemmAlgo::kSplitK ||
                       (p.algo == SmallMGemmAlgo::kAuto && SmallMGemmAutoIsSplitK(p));
  if (split_k) {
    return LaunchSplitKForK<M, kBf16A>(p, stream);
  }
  // The group: as many lanes as the row has 16-byte chunks, up to a warp.
  if (p.k >= 256) {
    return Launch<M, kBf16A, 32>(p, stream);
  } else if (p.k >= 128) {
    return Launch<M, kBf16A, 16>(p, stream);
  } else if (p.k >= 64) {
    return Launch<M, kBf16A, 8>(p, stream);
  } else {
    return Launch<M, kBf16A, 4>(p, stream);
  }
}

template <int M>
cudaError_t LaunchForA(const SmallMGemmParams& p, cudaStream_t stream) {
  if (p.a_bf16) {
    return LaunchForK<M, true>(p, stream);
  } else {
    return LaunchForK<M, false>(p, stream);
  }
}

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

bool SmallMGemmAutoIsSplitK(const SmallMGemmParams& p) {
  const int64_t rows = p.n * p.batch;
  if (p.k < 512) return false;
  if (p.k < 1024) return rows <= 2048;  // W_uv (16 x 128 rows, k = 512)
  if (rows <= 1024) return true;
  return p.m == 1 && (rows <= 2048 || p.k > 2048 || rows >= 65536);
}

bool SmallMGemmSupports(const SmallMGemmParams& p) {
  const int64_t a_bytes = p.a_bf16 ? 2 : 4;
  const int64_t a_align = 16 / a_bytes;  // elements per 16 bytes
  return p.m >= 1 && p.m <= kSmallMGemmMaxRows && p.n >= 1 && p.k >= 8 && p.k % 8 == 0 &&
         p.batch >= 1 && p.batch <= 65535 && p.n <= (int64_t{1} << 30) && p.a != nullptr &&
         p.w != nullptr && p.c != nullptr && Aligned16(p.a) && Aligned16(p.w) && p.ldw % 8 == 0 &&
         p.ldw >= p.k && p.lda % a_align == 0 && p.lda >= p.k && p.ldc >= p.n &&
         (p.batch == 1 || (p.stride_a % a_align == 0 && p.stride_w % 8 == 0)) &&
         p.m * p.k * a_bytes <= 96 * 1024;
}

cudaError_t SmallMGemmBf16(const SmallMGemmParams& p, cudaStream_t stream) {
  if (!SmallMGemmSupports(p)) return cudaErrorInvalidValue;
  switch (p.m) {
    case 1:
      return LaunchForA<1>(p, stream);
    case 2:
      return LaunchForA<2>(p, stream);
    case 3:
      return LaunchForA<3>(p, stream);
    default:
      return LaunchForA<4>(p, stream);
  }
}

}  // namespace kernels
}  // namespace deepinfer
