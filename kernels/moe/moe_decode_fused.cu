// Both kernels stream bf16 weight rows with 16-byte loads (8 values per lane per load, up to
// kUnroll loads per lane and row in flight), convert them to fp32 with a shift and multiply them
// with fp32 activations that come through L1 (a few KB per token). One warp per weight row pair
// (gate_up) or output feature (down); blocks of kWarps warps, a full grid (the hardware balances
// the tail). Both are launched with programmatic dependent launch (kernels/common/launch.cuh):
// the gate_up kernel reads the routing, written by the kernel before it, only after the wait.
#include <cuda_runtime.h>

#include "kernels/common/launch.cuh"
#include "kernels/moe/moe_decode_fused.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kUnroll = 8;

__device__ __forceinline__ void Bf16x8ToFloat(const uint4& v, float f[8]) {
  const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}

// s += dot(a[0..3], w[0..3]) + dot(b[0..3], w[4..7]) in that order.
__device__ __forceinline__ float Dot8(float s, const float4& a, const float4& b, const float w[8]) {
  s = fmaf(a.x, w[0], s);
  s = fmaf(a.y, w[1], s);
  s = fmaf(a.z, w[2], s);
  s = fmaf(a.w, w[3], s);
  s = fmaf(b.x, w[4], s);
  s = fmaf(b.y, w[5], s);
  s = fmaf(b.z, w[6], s);
  s = fmaf(b.w, w[7], s);
  return s;
}

__device__ __forceinline__ float WarpSum(float s) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

__device__ __forceinline__ bool ValidExpert(const MoeDecodeFusedParams& p, int32_t e) {
  return e >= 0 && e < p.num_experts;
}

// Block column blockIdx.y: a (token, choice) pair (t * top_k + k) or a shared part
// (num_tokens * top_k + s). A routed column serves every token that chose its expert, unless an
// earlier token did (that token's column serves it); part[u] is token u's part index (-1: not
// served here).
template <int kT>
__device__ void GateUpBody(MoeDecodeFusedParams p) {
  const int K = p.top_k, P = K + p.shared_parts, H = p.hidden_size, I = p.inter;
  const int column = blockIdx.y;
  int part[kT];
  const uint16_t* gate;
  const uint16_t* up;
  if (column < kT * K) {
    const int t = column / K;
    const int32_t e = p.topk_ids[column];
    if (!ValidExpert(p, e)) return;
    bool any = false;
#pragma unroll
    for (int u = 0; u < kT; ++u) {
      part[u] = -1;
      for (int j = 0; j < K; ++j) {
        if (p.topk_ids[u * K + j] == e) part[u] = j;
      }
      if (u < t && part[u] >= 0) return;  // an earlier token's column computes this expert
      any = any || part[u] >= 0;
    }
    if (!any) return;
    gate = p.gate_up[p.slot_of_expert[e]];
    up = gate + int64_t{I} * H;
  } else {
    const int s = column - kT * K;
#pragma unroll
    for (int u = 0; u < kT; ++u) part[u] = K + s;
    gate = p.shared_gate_up + int64_t{s} * I * H;
    up = p.shared_gate_up + (int64_t{p.shared_parts} + s) * I * H;
  }

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, kv = H / 8;
  for (int j = blockIdx.x * kWarps + warp; j < I; j += gridDim.x * kWarps) {
    const uint4* g = reinterpret_cast<const uint4*>(gate + int64_t{j} * H);
    const uint4* u4 = reinterpret_cast<const uint4*>(up + int64_t{j} * H);
    float ag[kT], au[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) ag[t] = au[t] = 0.0f;
    for (int v0 = lane; v0 < kv; v0 += 32 * kUnroll) {
      uint4 wg[kUnroll], wu[kUnroll];
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) {
        const int v = v0 + i * 32;
        wg[i] = v < kv ? __ldg(g + v) : make_uint4(0, 0, 0, 0);
        wu[i] = v < kv ? __ldg(u4 + v) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) {
        const int v = v0 + i * 32;
        if (v >= kv) break;
        float gf[8], uf[8];
        Bf16x8ToFloat(wg[i], gf);
        Bf16x8ToFloat(wu[i], uf);
#pragma unroll
        for (int t = 0; t < kT; ++t) {
          if (part[t] < 0) continue;
          const float4* x = reinterpret_cast<const float4*>(p.hidden + int64_t{t} * H);
          const float4 a = __ldg(x + 2 * v), b = __ldg(x + 2 * v + 1);
          ag[t] = Dot8(ag[t], a, b, gf);
          au[t] = Dot8(au[t], a, b, uf);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      if (part[t] < 0) continue;
      const float gs = WarpSum(ag[t]), us = WarpSum(au[t]);
      // expf (not __expf), as SiluMulF32.
      if (lane == t) p.act[(int64_t{t} * P + part[t]) * I + j] = gs / (1.0f + expf(-gs)) * us;
    }
  }
}

// Token t's part q: its weight row for output feature f, its act row and its weight in the
// sum (false: an invalid expert id, nothing to add).
__device__ __forceinline__ bool DownPart(const MoeDecodeFusedParams& p, int t, int q, int f,
                                         const uint4** w, const float4** a, float* coef) {
  const int K = p.top_k, P = K + p.shared_parts, I = p.inter;
  *a = reinterpret_cast<const float4*>(p.act + (int64_t{t} * P + q) * I);
  if (q < K) {
    const int32_t e = p.topk_ids[t * K + q];
    if (!ValidExpert(p, e)) return false;
    *w = reinterpret_cast<const uint4*>(p.down[p.slot_of_expert[e]] + int64_t{f} * I);
    *coef = p.topk_weights[t * K + q];
  } else {
    *w = reinterpret_cast<const uint4*>(p.shared_down + int64_t{f} * p.shared_parts * I +
                                        int64_t{q - K} * I);
    *coef = 1.0f;
  }
  return true;
}

// One warp per output feature; parts two at a time so that two weight rows are in flight.
template <int kT>
__device__ void DownBody(MoeDecodeFusedParams p) {
  const int P = p.top_k + p.shared_parts, kv = p.inter / 8;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int f = blockIdx.x * kWarps + warp; f < p.hidden_size; f += gridDim.x * kWarps) {
    float acc[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      acc[t] = 0.0f;
      for (int q0 = 0; q0 < P; q0 += 2) {
        const uint4* w[2];
        const float4* a[2];
        float coef[2] = {0.0f, 0.0f};
        bool ok[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          ok[h] = q0 + h < P && DownPart(p, t, q0 + h, f, &w[h], &a[h], &coef[h]);
        }
        float s[2] = {0.0f, 0.0f};
        for (int v0 = lane; v0 < kv; v0 += 32 * kUnroll) {
          uint4 wv[2][kUnroll];
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int i = 0; i < kUnroll; ++i) {
              const int v = v0 + i * 32;
              wv[h][i] = ok[h] && v < kv ? __ldg(w[h] + v) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (!ok[h]) continue;
#pragma unroll
            for (int i = 0; i < kUnroll; ++i) {
              const int v = v0 + i * 32;
              if (v >= kv) break;
              float wf[8];
              Bf16x8ToFloat(wv[h][i], wf);
              s[h] = Dot8(s[h], a[h][2 * v], a[h][2 * v + 1], wf);
            }
          }
        }
        // Parts in order: the routed choices in k order, then the shared parts.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (ok[h]) acc[t] = fmaf(coef[h], s[h], acc[t]);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const float sum = WarpSum(acc[t]);
      if (lane == t) p.out[int64_t{t} * p.hidden_size + f] = sum;
    }
  }
}

template <int kT>
cudaError_t Launch(const MoeDecodeFusedParams& p, cudaStream_t stream) {
  const dim3 gate_up_grid((p.inter + kWarps - 1) / kWarps, kT * p.top_k + p.shared_parts);
  cudaError_t err = LaunchAfterPrecedingGrids<GateUpBody<kT>, kThreads>(gate_up_grid, 0, stream, p);
  if (err != cudaSuccess) return err;
  const dim3 down_grid((p.hidden_size + kWarps - 1) / kWarps);
  return LaunchAfterPrecedingGrids<DownBody<kT>, kThreads>(down_grid, 0, stream, p);
}

}  // namespace

int64_t MoeDecodeFusedActFloats(int32_t num_tokens, int32_t top_k, int32_t shared_parts,
                                int32_t inter) {
  return int64_t{num_tokens} * (top_k + shared_parts) * inter;
}

cudaError_t MoeDecodeFusedF32(const MoeDecodeFusedParams& p, cudaStream_t stream) {
  const bool sizes_ok = p.num_tokens >= 1 && p.num_tokens <= kMoeDecodeFusedMaxTokens &&
                        p.top_k >= 1 && p.shared_parts >= 0 &&
                        p.top_k + p.shared_parts <= kMoeDecodeFusedMaxParts && p.num_experts >= 1 &&
                        p.hidden_size > 0 && p.hidden_size % 8 == 0 && p.inter > 0 &&
                        p.inter % 8 == 0;
  const bool pointers_ok =
      p.hidden != nullptr && p.topk_ids != nullptr && p.topk_weights != nullptr &&
      p.slot_of_expert != nullptr && p.gate_up != nullptr && p.down != nullptr &&
      p.act != nullptr && p.out != nullptr &&
      (p.shared_parts == 0 || (p.shared_gate_up != nullptr && p.shared_down != nullptr)) &&
      reinterpret_cast<uintptr_t>(p.hidden) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(p.act) % 16 == 0;
  if (!sizes_ok || !pointers_ok) return cudaErrorInvalidValue;
  return p.num_tokens == 1 ? Launch<1>(p, stream) : Launch<2>(p, stream);
}

}  // namespace kernels
}  // namespace deepinfer
