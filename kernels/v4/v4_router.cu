// V4RouteF32: kWarps tokens per block, one warp each (RouteTokenInWarp; the last blocks of
// V4RouteFromHiddenF32 run the same routine on the logits they hand over). The selection marks a
// chosen expert by overwriting its score with NaN, which no comparison prefers, so each round is
// one pass over the remaining scores plus a 5-step butterfly.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/common/launch.cuh"
#include "kernels/moe/router_logits_tile.cuh"
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

// Routes token r in one warp from its logits (logit(x) for expert x): sel and score hold the
// warp's scores + bias and scores (experts floats each of shared memory), chosen and chosen_score
// its top_k picks and their scores; every lane must call. Each score is computed once, by the
// lane that owns its expert, so lane 0's tail (the sum, the weights, the sort) reads only shared
// memory. Lane 0 writes the token's ids and weights.
template <typename Logit>
__device__ void RouteTokenInWarp(const Params& p, int64_t r, Logit logit, float* sel,
                                 float* score, int32_t* chosen, float* chosen_score) {
  const int lane = threadIdx.x % 32;
  const int E = p.experts, K = p.top_k;
  if (p.hash_table != nullptr) {
    if (lane < K) {
      const int32_t id = p.hash_table[int64_t{p.token_ids[r]} * K + lane];
      chosen[lane] = id;
      // An id outside the experts (a bad hash table) is kept for the dispatcher to refuse, with
      // weight 0 instead of a read outside the row.
      chosen_score[lane] = id >= 0 && id < E ? Score(logit(id), p.sqrtsoftplus) : 0.0f;
    }
  } else {
    for (int x = lane; x < E; x += 32) {
      const float s = Score(logit(x), p.sqrtsoftplus);
      score[x] = s;
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
      // best_i stays INT_MAX only when every remaining score is NaN (NaN logits): id -1 with
      // weight 0, for the dispatcher to refuse.
      if (lane == 0) {
        chosen[k] = best_i < E ? best_i : -1;
        chosen_score[k] = best_i < E ? score[best_i] : 0.0f;
      }
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
    ids[k] = chosen[k];
    w[k] = chosen_score[k];
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

__device__ void V4RouteBody(Params p) {
  extern __shared__ float shared[];  // [kWarps][2][experts]: sel, then score
  const int warp = threadIdx.x / 32;
  __shared__ int32_t chosen[kWarps][kMaxV4RouteTopK];
  __shared__ float chosen_score[kWarps][kMaxV4RouteTopK];
  const int64_t r = int64_t{blockIdx.x} * kWarps + warp;
  if (r >= p.rows) return;
  const float* l = p.logits + r * p.experts;
  float* sel = shared + 2 * warp * p.experts;
  RouteTokenInWarp(
      p, r, [l](int x) { return l[x]; }, sel, sel + p.experts, chosen[warp], chosen_score[warp]);
}

// V4RouteFromHiddenF32: the logits of a tile (router_logits_tile.cuh), then the token tile's
// last block routes its TM tokens, one warp each, from the logits the tile's blocks wrote.
struct FromHiddenParams {
  router_logits::Tile tile;
  Params route;  // logits = tile.router_logits
};

template <int TM>
__device__ router_logits::WeightRounds<1> PrefetchFromHidden(FromHiddenParams p) {
  return router_logits::PrefetchWeights<1>(p.tile);
}

template <int TM>
__device__ void RouteFromHiddenBody(const router_logits::WeightRounds<1>& first,
                                    FromHiddenParams p) {
  __shared__ float sel[TM][kMaxV4RouteFromHiddenExperts], score[TM][kMaxV4RouteFromHiddenExperts];
  __shared__ int32_t chosen[TM][kMaxV4RouteTopK];
  __shared__ float chosen_score[TM][kMaxV4RouteTopK];
  if (!router_logits::LogitsTileIsLast<TM, 1>(first, p.tile)) return;
  const int warp = threadIdx.x / 32;
  const int64_t r = int64_t{blockIdx.y} * TM + warp;
  if (warp >= TM || r >= p.route.rows) return;
  // L2 reads: other blocks wrote these during this kernel.
  const float* l = p.tile.router_logits + r * p.route.experts;
  RouteTokenInWarp(
      p.route, r, [l](int x) { return __ldcg(l + x); }, sel[warp], score[warp], chosen[warp],
      chosen_score[warp]);
}

template <int TM>
cudaError_t LaunchFromHidden(const FromHiddenParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.tile.num_experts),
                  static_cast<unsigned>((p.tile.num_tokens + TM - 1) / TM));
  return LaunchPrefetchThenAfterPrecedingGrids<PrefetchFromHidden<TM>, RouteFromHiddenBody<TM>,
                                               router_logits::kThreads>(grid, 0, stream, p);
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool RouteArgsValid(const V4RouteArgs& a) {
  return a.rows >= 0 && a.experts >= 1 && a.experts <= kMaxV4RouteExperts && a.top_k >= 1 &&
         a.top_k <= std::min(a.experts, kMaxV4RouteTopK) &&
         (a.hash_table == nullptr || a.token_ids != nullptr);
}

Params ParamsOf(const V4RouteArgs& a) {
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
  return p;
}

}  // namespace

cudaError_t V4RouteF32(const V4RouteArgs& a, cudaStream_t stream) {
  if (!RouteArgsValid(a)) return cudaErrorInvalidValue;
  if (a.rows == 0) return cudaSuccess;
  const Params p = ParamsOf(a);
  // Hash routing reads no scores into shared memory.
  const size_t smem = a.hash_table != nullptr ? 0 : size_t{kWarps} * 2 * a.experts * sizeof(float);
  constexpr auto kEntry = EntryKernel<V4RouteBody, kThreads>();
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        kEntry, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  const unsigned grid = static_cast<unsigned>((a.rows + kWarps - 1) / kWarps);
  return LaunchAfterPrecedingGrids<V4RouteBody, kThreads>(grid, smem, stream, p);
}

int32_t V4RouteFromHiddenTileTokens(int64_t rows) {
  return rows <= 1 ? 1 : rows <= 2 ? 2 : rows <= 4 ? 4 : 8;
}

bool V4RouteFromHiddenSupported(const V4RouteFromHiddenArgs& a) {
  const V4RouteArgs& r = a.route;
  return RouteArgsValid(r) && r.rows <= kMaxV4RouteFromHiddenTokens &&
         r.experts <= kMaxV4RouteFromHiddenExperts && a.hidden_size > 0 &&
         a.hidden_size % 4 == 0 && a.hidden_size <= 0x7fffffff && a.hidden != nullptr &&
         a.router_weight != nullptr && r.topk_ids != nullptr && r.topk_weights != nullptr && Aligned16(a.hidden) &&
         Aligned16(a.router_weight);
}

cudaError_t V4RouteFromHiddenF32(const V4RouteFromHiddenParams& params, cudaStream_t stream) {
  if (!V4RouteFromHiddenSupported(params.args) || params.logits == nullptr ||
      params.tile_counters == nullptr) {
    return cudaErrorInvalidValue;
  }
  const V4RouteFromHiddenArgs& a = params.args;
  if (a.route.rows == 0) return cudaSuccess;
  FromHiddenParams p;
  p.route = ParamsOf(a.route);
  p.tile.num_tokens = static_cast<int32_t>(a.route.rows);
  p.tile.num_experts = static_cast<int32_t>(a.route.experts);
  p.tile.hidden_size = static_cast<int32_t>(a.hidden_size);
  p.tile.hidden = a.hidden;
  p.tile.router_weight = a.router_weight;
  p.tile.router_logits = params.logits;
  p.tile.tile_counters = params.tile_counters;
  switch (V4RouteFromHiddenTileTokens(a.route.rows)) {
    case 1:
      return LaunchFromHidden<1>(p, stream);
    case 2:
      return LaunchFromHidden<2>(p, stream);
    case 4:
      return LaunchFromHidden<4>(p, stream);
  }
  return LaunchFromHidden<8>(p, stream);
}

}  // namespace kernels
}  // namespace deepinfer
