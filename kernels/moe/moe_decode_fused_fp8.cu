// The FP8 fused decode MoE block (moe_decode_fused_fp8.h): the kPerRow pair (the bf16 block's
// grid-strided gate_up / down pair of moe_decode_fused.cu with 16 e4m3 weights per 16-byte load
// and the block scale applied per 16-weight sum) and the entry point. Weights are read with
// L1::no_allocate so that the fp32 hidden / act rows stay in L1.
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

// 16-byte vectors (16 weights) per lane and row in one gate_up chunk (2048 values of a row per
// warp, as the bf16 kernel's 8 vectors of 8).
constexpr int kUnroll = 4;
// 16-byte loads per down thread and batch (12288 weights a block, the bf16 kernel's count).
constexpr int kDownLoads = 6;
constexpr float kTwoTo120 = 0x1p120f;

// The e4m3 bytes of w (the lowest first) as fp32 values times 2^-120: the sign to bit 31, the 7
// magnitude bits to bits 26..20, so the e4m3 exponent field is the fp32 one (bias 7 read as bias
// 127) and e4m3 subnormals become fp32 subnormals with the same mantissa. Exact.
__device__ __forceinline__ void Fp8x4Scaled(uint32_t w, float f[4]) {
  f[0] = __uint_as_float(((w << 24) & 0x80000000u) | ((w << 20) & 0x07F00000u));
  f[1] = __uint_as_float(((w << 16) & 0x80000000u) | ((w << 12) & 0x07F00000u));
  f[2] = __uint_as_float(((w << 8) & 0x80000000u) | ((w << 4) & 0x07F00000u));
  f[3] = __uint_as_float((w & 0x80000000u) | ((w >> 4) & 0x07F00000u));
}

// sum over i < 16 of x[i] * (e4m3 i of w) * 2^-120, x 16-byte aligned fp32 (through L1), in i
// order.
__device__ __forceinline__ float Dot16(const uint4& w, const float* x) {
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  float s = 0.0f;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float f[4];
    Fp8x4Scaled(words[q], f);
    const float4 a = __ldg(x4 + q);
    s = fmaf(a.x, f[0], s);
    s = fmaf(a.y, f[1], s);
    s = fmaf(a.z, f[2], s);
    s = fmaf(a.w, f[3], s);
  }
  return s;
}

// ---- kPerRow gate_up: one warp per (part, row j) item, part major, grid-strided; a warp issues
// the first chunk of its next item before it sums the current one.

struct GateUpChunk {
  uint4 g[kUnroll], u[kUnroll];
};

// Vectors v0 + 32 n (< kv) of the rows at gate / up.
__device__ __forceinline__ void LoadGateUpChunk(const uint8_t* gate, const uint8_t* up, int v0,
                                                int kv, GateUpChunk* c) {
#pragma unroll
  for (int n = 0; n < kUnroll; ++n) {
    const int v = v0 + n * 32;
    c->g[n] = v < kv ? LoadStreaming16(gate + kVec * v) : make_uint4(0, 0, 0, 0);
    c->u[n] = v < kv ? LoadStreaming16(up + kVec * v) : make_uint4(0, 0, 0, 0);
  }
}

// gs / us: the gate and up rows' scale rows (block b at [b]).
template <int kT>
__device__ __forceinline__ void AccumulateGateUpChunk(const GateUpChunk& c, int v0, int kv,
                                                      const float* gs, const float* us,
                                                      const float* hidden, int H,
                                                      float* const act[kT], float ag[kT],
                                                      float au[kT]) {
#pragma unroll
  for (int n = 0; n < kUnroll; ++n) {
    const int v = v0 + n * 32;
    if (v >= kv) break;
    const float sg = __ldg(gs + v / kVecsPerBlock) * kTwoTo120;
    const float su = __ldg(us + v / kVecsPerBlock) * kTwoTo120;
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      if (act[t] == nullptr) continue;
      const float* x = hidden + int64_t{t} * H + kVec * v;
      ag[t] = fmaf(Dot16(c.g[n], x), sg, ag[t]);
      au[t] = fmaf(Dot16(c.u[n], x), su, au[t]);
    }
  }
}

// Item i's rows: part i / inter's gate / up row j = i % inter.
template <int kT>
__device__ __forceinline__ void ItemRows(const PartTable<kT>& tab, int i, int I, int H,
                                         const uint8_t** gate, const uint8_t** up) {
  const int u = i / I, j = i - u * I;
  *gate = tab.part[u].gate + int64_t{j} * H;
  *up = tab.part[u].up + int64_t{j} * H;
}

template <int kT>
__device__ void FinishGateUpItem(const MoeDecodeFusedFp8Params& p, const PartTable<kT>& tab,
                                 const GateUpChunk& first, int i) {
  const int H = p.hidden_size, I = p.inter, kv = H / kVec, lane = threadIdx.x % 32;
  const int u = i / I, j = i - u * I;
  const Fp8Part& q = tab.part[u];
  const uint8_t* gate = q.gate + int64_t{j} * H;
  const uint8_t* up = q.up + int64_t{j} * H;
  const float* gs = q.gu_scales + Fp8ScaleRow(q.gate_row0 + j, q.gu_split) * q.gu_scale_ld;
  const float* us = q.gu_scales + Fp8ScaleRow(q.up_row0 + j, q.gu_split) * q.gu_scale_ld;
  float* act[kT];
#pragma unroll
  for (int t = 0; t < kT; ++t) act[t] = tab.act[u][t];
  float ag[kT], au[kT];
#pragma unroll
  for (int t = 0; t < kT; ++t) ag[t] = au[t] = 0.0f;
  AccumulateGateUpChunk<kT>(first, lane, kv, gs, us, p.hidden, H, act, ag, au);
  for (int v0 = lane + 32 * kUnroll; v0 < kv; v0 += 32 * kUnroll) {
    GateUpChunk c;
    LoadGateUpChunk(gate, up, v0, kv, &c);
    AccumulateGateUpChunk<kT>(c, v0, kv, gs, us, p.hidden, H, act, ag, au);
  }
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    if (act[t] == nullptr) continue;
    const float g = WarpSum(ag[t]), v = WarpSum(au[t]);
    // expf (not __expf), as SiluMulF32.
    if (lane == t) act[t][j] = g / (1.0f + expf(-g)) * v;
  }
}

template <int kT>
__device__ void GateUpBody(MoeDecodeFusedFp8Params p) {
  __shared__ PartTable<kT> tab;
  if (threadIdx.x < 32) BuildPartTable<kT>(p, &tab);
  __syncthreads();
  const int I = p.inter, H = p.hidden_size, kv = H / kVec, lane = threadIdx.x % 32;
  const int items = tab.count * I, stride = gridDim.x * kWarps;
  int i = blockIdx.x * kWarps + threadIdx.x / 32;
  GateUpChunk cur;
  if (i < items) {
    const uint8_t *gate, *up;
    ItemRows<kT>(tab, i, I, H, &gate, &up);
    LoadGateUpChunk(gate, up, lane, kv, &cur);
  }
  for (; i < items; i += stride) {
    const int next = i + stride;
    GateUpChunk nxt;
    if (next < items) {
      const uint8_t *gate, *up;
      ItemRows<kT>(tab, next, I, H, &gate, &up);
      LoadGateUpChunk(gate, up, lane, kv, &nxt);
    }
    FinishGateUpItem<kT>(p, tab, cur, i);
    cur = nxt;
  }
}

// ---- kPerRow down: one block per output feature f, grid-strided; feature f's parts' rows
// flattened into 16-weight chunks x = u * kv + v (part u's vector v of kv = inter / 16), thread i
// taking x = i + n * kDownThreads; the next feature's first batch issued before the current one is
// summed; the warps' sums in shared memory, added in warp order at the end.

struct DownBatch {
  uint4 w[kDownLoads];
};

template <int kT>
__device__ __forceinline__ void LoadDownBatch(const PartTable<kT>& tab, int f, int x0, int kv,
                                              DownBatch* b) {
  int u = x0 / kv, v = x0 - u * kv;
#pragma unroll
  for (int n = 0; n < kDownLoads; ++n) {
    b->w[n] =
        u < tab.count
            ? LoadStreaming16(tab.part[u].down + int64_t{f} * tab.part[u].down_stride + kVec * v)
            : make_uint4(0, 0, 0, 0);
    v += kDownThreads;
    while (v >= kv) {
      v -= kv;
      ++u;
    }
  }
}

template <int kT>
__device__ __forceinline__ void AccumulateDownBatch(const PartTable<kT>& tab, const DownBatch& b,
                                                    int f, int x0, int kv, float acc[kT]) {
  int u = x0 / kv, v = x0 - u * kv;
  const int64_t scale_row = f / kFp8BlockSize;
#pragma unroll
  for (int n = 0; n < kDownLoads; ++n) {
    if (u >= tab.count) break;
    const Fp8Part& q = tab.part[u];
    const float s =
        __ldg(q.dn_scales + scale_row * q.dn_scale_ld + (q.down_col0 + kVec * v) / kFp8BlockSize) *
        kTwoTo120;
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const float* a = tab.act[u][t];
      if (a == nullptr) continue;
      acc[t] = fmaf(tab.coef[u][t] * s, Dot16(b.w[n], a + kVec * v), acc[t]);
    }
    v += kDownThreads;
    while (v >= kv) {
      v -= kv;
      ++u;
    }
  }
}

template <int kT>
__device__ void DownBody(MoeDecodeFusedFp8Params p) {
  __shared__ PartTable<kT> tab;
  __shared__ float partial[kMaxDownFeatures][kDownWarps][kT];
  if (threadIdx.x < 32) BuildPartTable<kT>(p, &tab);
  __syncthreads();
  const int H = p.hidden_size, kv = p.inter / kVec, total = tab.count * kv;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int first = blockIdx.x, stride = gridDim.x;
  constexpr int kBatch = kDownThreads * kDownLoads;
  DownBatch cur;
  if (first < H) LoadDownBatch<kT>(tab, first, threadIdx.x, kv, &cur);
  int n = 0;
  for (int f = first; f < H; f += stride, ++n) {
    DownBatch nxt;
    if (f + stride < H) LoadDownBatch<kT>(tab, f + stride, threadIdx.x, kv, &nxt);
    float acc[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) acc[t] = 0.0f;
    AccumulateDownBatch<kT>(tab, cur, f, threadIdx.x, kv, acc);
    for (int x0 = threadIdx.x + kBatch; x0 < total; x0 += kBatch) {
      DownBatch b;
      LoadDownBatch<kT>(tab, f, x0, kv, &b);
      AccumulateDownBatch<kT>(tab, b, f, x0, kv, acc);
    }
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const float sum = WarpSum(acc[t]);
      if (lane == 0) partial[n][warp][t] = sum;
    }
    cur = nxt;
  }
  __syncthreads();
  for (int c = threadIdx.x; c < n * kT; c += kDownThreads) {
    const int m = c / kT, t = c - m * kT;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kDownWarps; ++w) sum += partial[m][w][t];
    p.out[int64_t{t} * H + first + int64_t{m} * stride] = sum;
  }
}

// gate_up on about one pass over the SMs, then down on as many blocks per SM as fit, at least
// enough that none has more than kMaxDownFeatures features.
template <int kT>
cudaError_t LaunchPerRow(const MoeDecodeFusedFp8Params& p, cudaStream_t stream) {
  constexpr auto kGateUp = EntryKernel<GateUpBody<kT>, kThreads>();
  constexpr auto kDown = EntryKernel<DownBody<kT>, kDownThreads>();
  static const int gate_up_per_sm =
      BlocksPerSm(reinterpret_cast<const void*>(kGateUp), kThreads, /*fallback=*/4);
  static const int down_per_sm =
      BlocksPerSm(reinterpret_cast<const void*>(kDown), kDownThreads, /*fallback=*/4);
  int sms = 0;
  cudaError_t err = CurrentDeviceSms(&sms);
  if (err != cudaSuccess) return err;
  const int64_t max_parts = int64_t{kT} * p.top_k + p.shared_parts;
  const int64_t gate_up_warps =
      BalancedUnits(max_parts * p.inter, int64_t{sms} * gate_up_per_sm * kWarps);
  const int64_t gate_up_blocks = (gate_up_warps + kWarps - 1) / kWarps;
  int64_t down_blocks = BalancedUnits(p.hidden_size, int64_t{sms} * down_per_sm);
  down_blocks = std::max<int64_t>(
      down_blocks, (int64_t{p.hidden_size} + kMaxDownFeatures - 1) / kMaxDownFeatures);
  err = LaunchAfterPrecedingGrids<GateUpBody<kT>, kThreads>(
      dim3(static_cast<unsigned>(gate_up_blocks)), 0, stream, p);
  if (err != cudaSuccess) return err;
  return LaunchAfterPrecedingGrids<DownBody<kT>, kDownThreads>(
      dim3(static_cast<unsigned>(down_blocks)), 0, stream, p);
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace
}  // namespace moe_fp8_internal

cudaError_t MoeDecodeFusedFp8(const MoeDecodeFusedFp8Params& p, cudaStream_t stream) {
  using moe_fp8_internal::Aligned16;
  using moe_fp8_internal::kVec;
  const bool routed = p.top_k > 0, shared = p.shared_parts > 0;
  const bool sizes_ok = p.num_tokens >= 1 && p.num_tokens <= kMoeDecodeFusedMaxTokens &&
                        p.top_k >= 0 && p.shared_parts >= 0 && p.top_k + p.shared_parts >= 1 &&
                        p.top_k + p.shared_parts <= kMoeDecodeFusedMaxParts &&
                        (!routed || p.num_experts >= 1) && p.hidden_size > 0 &&
                        p.hidden_size % kVec == 0 && p.inter > 0 && p.inter % kVec == 0;
  if (!sizes_ok) return cudaErrorInvalidValue;
  const bool routed_ok =
      !routed ||
      (p.topk_ids != nullptr && p.topk_weights != nullptr && p.slot_of_expert != nullptr &&
       p.gate_up != nullptr && p.gate_up_scales != nullptr && p.down != nullptr &&
       p.down_scales != nullptr && p.gate_up_scale_ld >= Fp8ScaleCols(p.hidden_size) &&
       p.down_scale_ld >= Fp8ScaleCols(p.inter));
  const bool shared_ok =
      !shared ||
      (p.shared_gate_up != nullptr && p.shared_gate_up_scales != nullptr &&
       p.shared_down != nullptr && p.shared_down_scales != nullptr && Aligned16(p.shared_gate_up) &&
       Aligned16(p.shared_down) && p.shared_gate_up_scale_ld >= Fp8ScaleCols(p.hidden_size) &&
       p.shared_gate_up_split_rows >= 0 &&
       p.shared_down_scale_ld >= Fp8ScaleCols(int64_t{p.shared_parts} * p.inter));
  const bool pointers_ok = p.hidden != nullptr && p.act != nullptr && p.out != nullptr &&
                           Aligned16(p.hidden) && Aligned16(p.act);
  const bool variant_ok = p.variant == MoeDecodeFusedFp8Variant::kDefault ||
                          p.variant == MoeDecodeFusedFp8Variant::kPerRow ||
                          p.variant == MoeDecodeFusedFp8Variant::kRowReuse ||
                          p.variant == MoeDecodeFusedFp8Variant::kStationary ||
                          p.variant == MoeDecodeFusedFp8Variant::kPipelined;
  if (!routed_ok || !shared_ok || !pointers_ok || !variant_ok) return cudaErrorInvalidValue;
  const MoeDecodeFusedFp8Variant variant = p.variant == MoeDecodeFusedFp8Variant::kDefault
                                               ? kMoeDecodeFusedFp8DefaultVariant
                                               : p.variant;
  if (variant == MoeDecodeFusedFp8Variant::kPipelined &&
      moe_fp8_internal::PipelinedGateUpApplies(p)) {
    return moe_fp8_internal::LaunchPipelined(p, stream);
  }
  // Elsewhere kPipelined is kStationary.
  const bool stationary = variant == MoeDecodeFusedFp8Variant::kStationary ||
                          variant == MoeDecodeFusedFp8Variant::kPipelined;
  // kRowReuse's gate_up (kRowReuse's and kStationary's) reads a row pair's scales from one
  // scale row (an even split).
  const bool row_reuse = variant == MoeDecodeFusedFp8Variant::kRowReuse || stationary;
  if (row_reuse && p.hidden_size <= kMoeDecodeFusedFp8MaxStagedHidden &&
      p.shared_gate_up_split_rows % 2 == 0) {
    bool launched = false;
    const cudaError_t err = moe_fp8_internal::LaunchRowReuse(p, stationary, stream, &launched);
    if (err != cudaSuccess || launched) return err;
  }
  return p.num_tokens == 1 ? moe_fp8_internal::LaunchPerRow<1>(p, stream)
                           : moe_fp8_internal::LaunchPerRow<2>(p, stream);
}

}  // namespace kernels
}  // namespace deepinfer