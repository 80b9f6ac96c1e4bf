// kStationary's down (moe_decode_fused_fp8.h): at one token, after kRowReuse's gate_up, a down
// kernel that keeps each thread's act values in registers for the whole kernel, so that a
// 16-byte weight load costs no act read and no part-table look-up (the FP8 form of
// moe_decode_fused.cu's stationary down).
//
// A feature's parts are flattened into chunks of 16 values, x = u * kvi + v (part u: the routed
// choices in k order, then the shared parts, i.e. act row u of the token; vector v of kvi =
// inter / 16: one 16-byte e4m3 load), and thread i of a kStatThreads block owns the chunks
// x = i + n * kStatThreads, n < kChunks, the same for every feature. Resolved once per thread:
// a chunk's row-0 weight pointer and row stride, its routing weight (1 for a shared part) times
// its block scale for each of the (at most two) 128-row scale rows of the block's features, and
// after the PDL wait its 16 act values. One block per SM owns a contiguous range of
// ceil(hidden / blocks) <= kMaxStatFeatures features, kFeat at a time, the next kFeat features'
// weight loads issued before the current ones are summed.
//
// Before the PDL wait the kernel resolves its chunks (topk_ids, topk_weights, the slot, pointer
// and scale tables) and issues its first kFeat features' weight loads into registers. The
// routing is read there as a value, not only as a hint: the router that wrote it has completed,
// because this grid is launched only after every block of kRowReuse's gate_up passed its own
// wait (a PDL grid's blocks start once every block of the grid before it executed
// griddepcontrol.launch_dependents, which gate_up's blocks do right after their wait), and that
// wait returns after the grid before gate_up (the router) completed; gate_up writes only act; the
// weights, scales and tables are written by no kernel. Only act is read after the wait.
//
// Sums (the numerics of kRowReuse's down, another order): per chunk the 16 products (e4m3
// widened exactly by cvt.f16x2.e4m3x2) summed in fp32 in k order from 0, multiplied by the
// chunk's routing weight * block scale (one fp32 product) and added to the thread's fp32 sum in
// n order; a butterfly per warp and feature; the warps' sums in warp order (deterministic: a
// replay equals the eager run). out[f] is overwritten, as kRowReuse's down does.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/common/launch.cuh"
#include "kernels/common/streaming_load.cuh"
#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/moe/moe_decode_fused_fp8.h"
#include "kernels/moe/moe_decode_fused_fp8_internal.cuh"

namespace deepinfer {
namespace kernels {
namespace moe_fp8_internal {
namespace {

// 384 threads: Moonlight's 8 parts x 88 chunks = 704 <= 2 x 384, V3's 9 x 128 = 1152 = 3 x 384.
constexpr int kStatThreads = 384;
constexpr int kStatWarps = kStatThreads / 32;
constexpr int kMaxStatChunks = 3;
constexpr int kBlk = static_cast<int>(kFp8BlockSize);
// A block's features: at most two scale rows (kMaxStatFeatures <= kBlk).
constexpr int kMaxStatFeatures = 64;
static_assert(kMaxStatFeatures <= kBlk, "a block's features span at most two scale rows");

// A thread's chunks: row 0's 16 weights (null: no chunk, or an invalid expert), the bytes
// between rows, and the routing weight times the block scale for the scale row of the block's
// first feature (cs[0]) and of its last (cs[1]).
template <int kChunks>
struct StatChunks {
  const uint8_t* w[kChunks];
  int32_t stride[kChunks];
  float cs[2][kChunks];
};

template <int kChunks, int kFeat>
struct StatPrefetched {
  StatChunks<kChunks> c;
  uint4 w[kFeat][kChunks];  // features first .. first + kFeat - 1 (zeros past the block's range)
};

// The block's contiguous feature range [*first, *end).
__device__ __forceinline__ void StatFeatures(int hidden, int* first, int* end) {
  const int per_block = (hidden + gridDim.x - 1) / gridDim.x;
  *first = blockIdx.x * per_block;
  *end = min(hidden, *first + per_block);
}

template <int kChunks, int kFeat>
__device__ __forceinline__ void LoadStatStep(const StatChunks<kChunks>& c, int f, int end,
                                             uint4 w[kFeat][kChunks]) {
#pragma unroll
  for (int i = 0; i < kFeat; ++i) {
#pragma unroll
    for (int n = 0; n < kChunks; ++n) {
      w[i][n] = c.w[n] != nullptr && f + i < end
                    ? LoadStreaming16(c.w[n] + static_cast<int64_t>(f + i) * c.stride[n])
                    : make_uint4(0, 0, 0, 0);
    }
  }
}

template <int kChunks, int kFeat>
__device__ StatPrefetched<kChunks, kFeat> DownStationaryPrefetch(MoeDecodeFusedFp8Params p) {
  StatPrefetched<kChunks, kFeat> r;
  const int K = p.top_k, S = p.shared_parts, I = p.inter, kvi = I / kVec;
  int first, end;
  StatFeatures(p.hidden_size, &first, &end);
  const int row0 = first / kBlk, row1 = (end - 1) / kBlk;
  const float* scales[kChunks];
  int32_t scale_ld[kChunks];
  float coef[kChunks];
#pragma unroll
  for (int n = 0; n < kChunks; ++n) {
    const int x = threadIdx.x + n * kStatThreads, u = x / kvi, v = x - u * kvi;
    r.c.w[n] = nullptr;
    r.c.stride[n] = 0;
    scales[n] = nullptr;
    scale_ld[n] = 0;
    coef[n] = 0.0f;
    if (u < K) {
      const int32_t e = __ldcg(p.topk_ids + u);
      if (ValidExpert(p, e)) {
        const int32_t slot = __ldg(p.slot_of_expert + e);
        r.c.w[n] = p.down[slot] + kVec * v;
        r.c.stride[n] = I;
        scales[n] = p.down_scales[slot] + kVec * v / kBlk;
        scale_ld[n] = p.down_scale_ld;
        coef[n] = __ldcg(p.topk_weights + u);
      }
    } else if (u < K + S) {
      const int s = u - K;
      r.c.w[n] = p.shared_down + int64_t{s} * I + kVec * v;
      r.c.stride[n] = S * I;
      scales[n] = p.shared_down_scales + (s * I + kVec * v) / kBlk;
      scale_ld[n] = p.shared_down_scale_ld;
      coef[n] = 1.0f;
    }
  }
  LoadStatStep<kChunks, kFeat>(r.c, first, end, r.w);
#pragma unroll
  for (int n = 0; n < kChunks; ++n) {
    r.c.cs[0][n] = r.c.cs[1][n] = 0.0f;
    if (scales[n] != nullptr) {
      r.c.cs[0][n] = coef[n] * __ldg(scales[n] + int64_t{row0} * scale_ld[n]);
      r.c.cs[1][n] =
          row1 > row0 ? coef[n] * __ldg(scales[n] + int64_t{row1} * scale_ld[n]) : r.c.cs[0][n];
    }
  }
  return r;
}

template <int kChunks, int kFeat>
__device__ void DownStationaryBody(const StatPrefetched<kChunks, kFeat>& pre,
                                   MoeDecodeFusedFp8Params p) {
  __shared__ float partial[kMaxStatFeatures][kStatWarps];
  const StatChunks<kChunks>& c = pre.c;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int kvi = p.inter / kVec;
  // Chunk x = u * kvi + v's 16 act values: act row u's vector v, whose float4 q kRowReuse's
  // gate_up wrote at float4 q * kvi + v of the row (ActIndex).
  float4 a[kChunks][4];
#pragma unroll
  for (int n = 0; n < kChunks; ++n) {
    const int x = threadIdx.x + n * kStatThreads, u = x / kvi, v = x - u * kvi;
    const float4* row = reinterpret_cast<const float4*>(p.act + int64_t{u} * p.inter);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      a[n][q] = c.w[n] != nullptr ? __ldcg(row + q * kvi + v) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  int first, end;
  StatFeatures(p.hidden_size, &first, &end);
  const int row0 = first / kBlk;
  uint4 cur[kFeat][kChunks];
#pragma unroll
  for (int i = 0; i < kFeat; ++i) {
#pragma unroll
    for (int n = 0; n < kChunks; ++n) cur[i][n] = pre.w[i][n];
  }
  for (int f = first; f < end; f += kFeat) {
    uint4 nxt[kFeat][kChunks];
    LoadStatStep<kChunks, kFeat>(c, f + kFeat, end, nxt);
#pragma unroll
    for (int i = 0; i < kFeat; ++i) {
      const int row = (f + i) / kBlk == row0 ? 0 : 1;
      float acc = 0.0f;
#pragma unroll
      for (int n = 0; n < kChunks; ++n) {
        if (c.w[n] == nullptr) continue;
        float s = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          float wf[4];
          Fp8x4(Word(cur[i][n], q), wf);
          s = Dot4(a[n][q], wf, s);
        }
        acc = fmaf(row == 0 ? c.cs[0][n] : c.cs[1][n], s, acc);
      }
      const float sum = WarpSum(acc);
      if (lane == 0 && f + i < end) partial[f + i - first][warp] = sum;
    }
#pragma unroll
    for (int i = 0; i < kFeat; ++i) {
#pragma unroll
      for (int n = 0; n < kChunks; ++n) cur[i][n] = nxt[i][n];
    }
  }
  __syncthreads();
  for (int m = threadIdx.x; m < end - first; m += kStatThreads) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kStatWarps; ++w) sum += partial[m][w];
    p.out[first + m] = sum;
  }
}

// One block per SM (a block of kStatThreads fits once), at least ceil(hidden / kMaxStatFeatures)
// blocks.
template <int kChunks, int kFeat>
cudaError_t Launch(const MoeDecodeFusedFp8Params& p, int sms, cudaStream_t stream) {
  const int64_t H = p.hidden_size;
  const int64_t per_block = std::min<int64_t>(kMaxStatFeatures, (H + sms - 1) / sms);
  const int64_t blocks = (H + per_block - 1) / per_block;
  return LaunchPrefetchThenAfterPrecedingGrids<DownStationaryPrefetch<kChunks, kFeat>,
                                               DownStationaryBody<kChunks, kFeat>, kStatThreads>(
      dim3(static_cast<unsigned>(blocks)), 0, stream, p);
}

int64_t Chunks(const MoeDecodeFusedFp8Params& p) {
  return int64_t{p.top_k + p.shared_parts} * (p.inter / kVec);
}

}  // namespace

bool StationaryDownApplies(const MoeDecodeFusedFp8Params& p) {
  return p.num_tokens == 1 && Chunks(p) <= int64_t{kMaxStatChunks} * kStatThreads;
}

// 2 chunks a thread (Moonlight): 4 features a step; 3 (V3): 2.
cudaError_t LaunchStationaryDown(const MoeDecodeFusedFp8Params& p, int sms, cudaStream_t stream) {
  return Chunks(p) <= 2 * kStatThreads ? Launch<2, 4>(p, std::max(1, sms), stream)
                                       : Launch<kMaxStatChunks, 2>(p, std::max(1, sms), stream);
}

}  // namespace moe_fp8_internal
}  // namespace kernels
}  // namespace deepinfer
