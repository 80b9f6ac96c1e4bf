// V4RouteF32: kWarps tokens per block, one warp each. The selection marks a chosen expert by
// overwriting its score with NaN, which no comparison prefers, so each round is one pass over
// the remaining scores plus a 5-step butterfly.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/common/launch.cuh"
#include "kernels/v4/v4_router.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr unsigned kFull = 0xffffffffu;

struct Params {
  int64_t rows = 0;
  int experts = 0, top_k = 0;
  const float* logits = nullptr;
  const float* bias = nullptr;
  const int32_t* hash_table = nullptr;
  const int32_t* token_ids = nullptr;
  bool sqrtsoftplus = true;
  float scaling = 1.0f;
  int32_t* topk_ids = nullptr;
  float* topk_weights = nullptr;
};

__device__ __forceinline__ float Score(float l, bool sqrtsoftplus) {
  if (sqrtsoftplus) return sqrtf(l > 20.0f ? l : log1pf(expf(l)));
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-l)));
}

// Whether (v, i) ranks before (bv, bi): the larger value, the lower id on a tie.
__device__ __forceinline__ bool Before(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

__device__ void V4RouteBody(Params p) {
  extern __shared__ float shared[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int E = p.experts, K = p.top_k;
  float* sel = shared + warp * E;
  __shared__ int32_t chosen[kWarps][kMaxV4RouteTopK];
  const int64_t r = int64_t{blockIdx.x} * kWarps + warp;
  if (r >= p.rows) return;
  const float* l = p.logits + r * E;
  if (p.hash_table != nullptr) {
    if (lane < K) chosen[warp][lane] = p.hash_table[int64_t{p.token_ids[r]} * K + lane];
  } else {
    for (int x = lane; x < E; x += 32) {
      const float s = Score(l[x], p.sqrtsoftplus);
      sel[x] = p.bias != nullptr ? __fadd_rn(s, p.bias[x]) : s;
    }
    __syncwarp();
    for (int k = 0; k < K; ++k) {
      float best = -INFINITY;
      int best_i = INT_MAX;
      for (int x = lane; x < E; x += 32) {
        if (Before(sel[x], x, best, best_i)) {
          best = sel[x];
          best_i = x;
        }
      }
      for (int off = 16; off > 0; off /= 2) {
        const float ov = __shfl_xor_sync(kFull, best, off);
        const int oi = __shfl_xor_sync(kFull, best_i, off);
        if (Before(ov, oi, best, best_i)) {
          best = ov;
          best_i = oi;
        }
      }
      // best_i stays INT_MAX only when every remaining score is NaN (NaN logits).
      if (lane == 0) chosen[warp][k] = best_i < E ? best_i : -1;
      if (best_i < E && lane == best_i % 32) sel[best_i] = NAN;
      __syncwarp();
    }
  }
  __syncwarp();
  if (lane != 0) return;
  // The chosen scores summed in selection order, then the pairs sorted by id (insertion sort:
  // stable, as the CPU's std::stable_sort).
  int32_t ids[kMaxV4RouteTopK];
  float w[kMaxV4RouteTopK];
  float sum = 0.0f;
  for (int k = 0; k < K; ++k) {
    ids[k] = chosen[warp][k];
    // An id outside the experts (a bad hash table, or NaN logits) is kept for the dispatcher to
    // refuse, with weight 0 instead of a read outside the row.
    w[k] = ids[k] >= 0 && ids[k] < E ? Score(l[ids[k]], p.sqrtsoftplus) : 0.0f;
    sum = __fadd_rn(sum, w[k]);
  }
  const float denom = __fadd_rn(sum, 1e-20f);
  for (int k = 0; k < K; ++k) w[k] = __fmul_rn(__fdiv_rn(w[k], denom), p.scaling);
  for (int k = 1; k < K; ++k) {
    const int32_t id = ids[k];
    const float wk = w[k];
    int j = k - 1;
    for (; j >= 0 && ids[j] > id; --j) {
      ids[j + 1] = ids[j];
      w[j + 1] = w[j];
    }
    ids[j + 1] = id;
    w[j + 1] = wk;
  }
  for (int k = 0; k < K; ++k) {
    p.topk_ids[r * K + k] = ids[k];
    p.topk_weights[r * K + k] = w[k];
  }
}

}  // namespace

cudaError_t V4RouteF32(const V4RouteArgs& a, cudaStream_t stream) {
  if (a.rows < 0 || a.experts < 1 || a.experts > kMaxV4RouteExperts || a.top_k < 1 ||
      a.top_k > std::min(a.experts, kMaxV4RouteTopK) ||
      (a.hash_table != nullptr && a.token_ids == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (a.rows == 0) return cudaSuccess;
  Params p;
  p.rows = a.rows;
  p.experts = static_cast<int>(a.experts);
  p.top_k = static_cast<int>(a.top_k);
  p.logits = a.logits;
  p.bias = a.bias;
  p.hash_table = a.hash_table;
  p.token_ids = a.token_ids;
  p.sqrtsoftplus = a.sqrtsoftplus;
  p.scaling = a.scaling;
  p.topk_ids = a.topk_ids;
  p.topk_weights = a.topk_weights;
  // Hash routing reads no scores into shared memory.
  const size_t smem = a.hash_table != nullptr ? 0 : size_t{kWarps} * a.experts * sizeof(float);
  constexpr auto kEntry = EntryKernel<V4RouteBody, kThreads>();
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        kEntry, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  const unsigned grid = static_cast<unsigned>((a.rows + kWarps - 1) / kWarps);
  return LaunchAfterPrecedingGrids<V4RouteBody, kThreads>(grid, smem, stream, p);
}

}  // namespace kernels
}  // namespace deepinfer
