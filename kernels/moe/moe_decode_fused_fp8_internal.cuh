// Pieces shared by the FP8 fused decode MoE block's kernels (moe_decode_fused_fp8.h): kPerRow
// and the entry point in moe_decode_fused_fp8.cu, kRowReuse's pair in
// moe_decode_fused_fp8_row_reuse.cu, kStationary's down in moe_decode_fused_fp8_stationary.cu,
// kPipelined's gate_up in moe_decode_fused_fp8_pipelined.cu.
// Include only from those .cu files.
#ifndef DEEPINFER_KERNELS_MOE_MOE_DECODE_FUSED_FP8_INTERNAL_CUH_
#define DEEPINFER_KERNELS_MOE_MOE_DECODE_FUSED_FP8_INTERNAL_CUH_

#include <cuda_fp16.h>
#include <cuda_fp8.h>
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

// The order in which kRowReuse's and kPipelined's gate_ups write an act row, read by both downs:
// the position of act value j (of a row of inter = 16 * kvi values), vector v = j / 16's float4 q
// stored as float4 q * kvi + v, so that kRowReuse down's lanes reading float4 q of consecutive
// vectors read consecutive 16 bytes (the stationary down reads a vector's 4 float4s once).
__device__ __forceinline__ int ActIndex(int j, int kvi) {
  return 4 * (((j >> 2) & 3) * kvi + (j >> 4)) + (j & 3);
}

__device__ __forceinline__ uint32_t Word(const uint4& w, int q) {
  return q == 0 ? w.x : q == 1 ? w.y : q == 2 ? w.z : w.w;
}

// The e4m3 bytes of w (the lowest first) as their fp32 values: cvt.f16x2.e4m3x2 (exact) and
// fp16 -> fp32.
__device__ __forceinline__ void Fp8x4(uint32_t w, float f[4]) {
  const __half2 lo(
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xFFFFu), __NV_E4M3));
  const __half2 hi(
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3));
  const float2 a = __half22float2(lo), b = __half22float2(hi);
  f[0] = a.x;
  f[1] = a.y;
  f[2] = b.x;
  f[3] = b.y;
}

// s + a.x * w[0] + a.y * w[1] + a.z * w[2] + a.w * w[3], in that order.
__device__ __forceinline__ float Dot4(const float4& a, const float w[4], float s) {
  s = fmaf(a.x, w[0], s);
  s = fmaf(a.y, w[1], s);
  s = fmaf(a.z, w[2], s);
  return fmaf(a.w, w[3], s);
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

// Launches kRowReuse's gate_up, then kRowReuse's down, or where stationary_down and
// StationaryDownApplies(p) the stationary down; *launched false (nothing launched, cudaSuccess)
// where the device lacks gate_up's shared memory. The arguments are checked by
// MoeDecodeFusedFp8, hidden_size <= kMoeDecodeFusedFp8MaxStagedHidden and
// shared_gate_up_split_rows even.
cudaError_t LaunchRowReuse(const MoeDecodeFusedFp8Params& p, bool stationary_down,
                           cudaStream_t stream, bool* launched);

// Whether the stationary down takes p: one token and a feature's 16-value chunks,
// (top_k + shared_parts) * inter / 16, at most its threads times its chunks per thread.
bool StationaryDownApplies(const MoeDecodeFusedFp8Params& p);

// Launches the stationary down (one block per SM of the sms the device has) after a launch of
// kRowReuse's gate_up on the stream (it reads act in ActIndex's order); p checked, and
// StationaryDownApplies(p).
cudaError_t LaunchStationaryDown(const MoeDecodeFusedFp8Params& p, int sms, cudaStream_t stream);

// kRowReuse's down alone, after a gate_up that wrote act in ActIndex's order; p checked.
cudaError_t LaunchRowReuseDown(const MoeDecodeFusedFp8Params& p, cudaStream_t stream);

// Whether kPipelined's gate_up takes p: one token and hidden_size <= 2048 (a lane's slice of the
// hidden row in registers).
bool PipelinedGateUpApplies(const MoeDecodeFusedFp8Params& p);

// Launches kPipelined's gate_up, then the stationary down where StationaryDownApplies(p), else
// kRowReuse's down; p checked, and PipelinedGateUpApplies(p).
cudaError_t LaunchPipelined(const MoeDecodeFusedFp8Params& p, cudaStream_t stream);

}  // namespace moe_fp8_internal
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_MOE_DECODE_FUSED_FP8_INTERNAL_CUH_
