// Pieces shared by the FP8 fused decode MoE block's kernel pairs (moe_decode_fused_fp8.h):
// kPerRow and the entry point in moe_decode_fused_fp8.cu, kRowReuse in
// moe_decode_fused_fp8_row_reuse.cu. Include only from those .cu files.
#ifndef DEEPINFER_KERNELS_MOE_MOE_DECODE_FUSED_FP8_INTERNAL_CUH_
#define DEEPINFER_KERNELS_MOE_MOE_DECODE_FUSED_FP8_INTERNAL_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/kernel_facts.h"
#include "kernels/moe/moe_decode_fused_fp8.h"

namespace deepinfer {
namespace kernels {
namespace moe_fp8_internal {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kDownThreads = 128;
constexpr int kDownWarps = kDownThreads / 32;
constexpr int kMaxDownFeatures = 64;       // output features of one down block at most
constexpr int kVec = 16;                   // weights per 16-byte vector
constexpr int kVecsPerBlock = 128 / kVec;  // vectors per 128-wide scale block

__device__ __forceinline__ float WarpSum(float s) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

__device__ __forceinline__ bool ValidExpert(const MoeDecodeFusedFp8Params& p, int32_t e) {
  return e >= 0 && e < p.num_experts;
}

// ---- The part table (as moe_decode_fused.cu's): the shared parts, then every routed expert
// once, each with its matrices, scale grids and per token its act row (null: not chosen) and
// routing weight. Built by one warp per block after the PDL wait.

struct Fp8Part {
  const uint8_t* gate;  // gate row 0 (rows hidden_size bytes apart); up rows at `up`
  const uint8_t* up;
  const float* gu_scales;         // the gate_up matrix's scale grid
  int32_t gu_scale_ld, gu_split;  // its row stride and stacking row
  int32_t gate_row0, up_row0;     // the part's gate / up row 0 as rows of that matrix
  const uint8_t* down;            // row f at down + f * down_stride
  int32_t down_stride;
  const float* dn_scales;  // the down matrix's scale grid (one grid)
  int32_t dn_scale_ld;
  int32_t down_col0;  // the part's column 0 in that matrix
};

template <int kT>
struct PartTable {
  static constexpr int kMaxParts = kT * kMoeDecodeFusedMaxParts;
  int count;
  Fp8Part part[kMaxParts];
  float* act[kMaxParts][kT];  // token t's act row of this part, null: not chosen by t
  float coef[kMaxParts][kT];
};

// Run by one whole warp.
template <int kT>
__device__ void BuildPartTable(const MoeDecodeFusedFp8Params& p, PartTable<kT>* tab) {
  const int lane = threadIdx.x % 32;
  const int K = p.top_k, S = p.shared_parts, P = K + S, H = p.hidden_size, I = p.inter;
  for (int s = lane; s < S; s += 32) {
    Fp8Part& q = tab->part[s];
    q.gate = p.shared_gate_up + int64_t{s} * I * H;
    q.up = p.shared_gate_up + (int64_t{S} + s) * I * H;
    q.gu_scales = p.shared_gate_up_scales;
    q.gu_scale_ld = p.shared_gate_up_scale_ld;
    q.gu_split = p.shared_gate_up_split_rows;
    q.gate_row0 = s * I;
    q.up_row0 = (S + s) * I;
    q.down = p.shared_down + int64_t{s} * I;
    q.down_stride = S * I;
    q.dn_scales = p.shared_down_scales;
    q.dn_scale_ld = p.shared_down_scale_ld;
    q.down_col0 = s * I;
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      tab->act[s][t] = p.act + (int64_t{t} * P + K + s) * I;
      tab->coef[s][t] = 1.0f;
    }
  }
  int count = S;
  for (int c0 = 0; c0 < kT * K; c0 += 32) {
    const int c = c0 + lane;
    bool live = false;
    int32_t e = -1;
    int part[kT];
    if (c < kT * K) {
      const int t = c / K;
      e = p.topk_ids[c];
      live = ValidExpert(p, e);
#pragma unroll
      for (int u = 0; u < kT; ++u) {
        part[u] = -1;
        for (int j = 0; j < K; ++j) {
          if (p.topk_ids[u * K + j] == e) part[u] = j;
        }
        if (u < t && part[u] >= 0) live = false;  // an earlier token's column has this expert
      }
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, live);
    if (live) {
      const int u = count + __popc(ballot & ((1u << lane) - 1u));
      const int32_t slot = p.slot_of_expert[e];
      Fp8Part& q = tab->part[u];
      q.gate = p.gate_up[slot];
      q.up = p.gate_up[slot] + int64_t{I} * H;
      q.gu_scales = p.gate_up_scales[slot];
      q.gu_scale_ld = p.gate_up_scale_ld;
      q.gu_split = I;
      q.gate_row0 = 0;
      q.up_row0 = I;
      q.down = p.down[slot];
      q.down_stride = I;
      q.dn_scales = p.down_scales[slot];
      q.dn_scale_ld = p.down_scale_ld;
      q.down_col0 = 0;
#pragma unroll
      for (int t = 0; t < kT; ++t) {
        tab->act[u][t] = part[t] >= 0 ? p.act + (int64_t{t} * P + part[t]) * I : nullptr;
        tab->coef[u][t] = part[t] >= 0 ? p.topk_weights[t * K + part[t]] : 0.0f;
      }
    }
    count += __popc(ballot);
  }
  if (lane == 0) tab->count = count;
}

// Launches the kRowReuse pair, *launched false (nothing launched, cudaSuccess) where the device
// lacks its shared memory. The arguments are checked by MoeDecodeFusedFp8, hidden_size <=
// kMoeDecodeFusedFp8MaxStagedHidden and shared_gate_up_split_rows even.
cudaError_t LaunchRowReuse(const MoeDecodeFusedFp8Params& p, cudaStream_t stream, bool* launched);

}  // namespace moe_fp8_internal
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_MOE_DECODE_FUSED_FP8_INTERNAL_CUH_
