// Permutation plan in one block of kPlanWarps warps: the choices are split into one contiguous
// segment per warp; each warp counts its segment per slot (order-free), the per-warp counts
// become per-warp starting ranks (exclusive over warps) and per-slot offsets (exclusive over
// slots), and each warp then walks its segment 32 choices at a time in order, ranking equal
// slots inside the 32 with __match_any_sync. No global atomics, so rows are deterministic.
// One block suffices for decode (a few hundred choices). A prefill has tens of thousands, and
// each choice's slot takes two dependent global loads (topk_ids, then slot_of_expert): the
// counting pass issues kPlanUnroll choices' loads per lane before using any, and keeps each
// slot in shared memory (int16) for the ranking pass when they fit (the device's opt-in shared
// memory per block; 65536 choices need 128 KB), so that pass does not load them again.
//
// Large permutations (prefill: tens to hundreds of thousands of choices) plan with many blocks
// instead (with a plan_workspace): the choices split into
// contiguous block segments; each block counts its segment per slot (PlanCountBody), one block
// turns the counts into each block's first rank per slot and the slot offsets (PlanScanBody),
// and each block then ranks its segment in order as above (PlanRankBody). The one-block plan
// is latency-bound there: two dependent loads per choice for a few hundred choices per warp,
// twice when the slots do not fit in shared memory (from ~110K choices). The gather then runs
// one block per token: the hidden row read once and written top_k times (one block per row
// read it top_k times). Rows and values are the same as the one-block plan's.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/common/launch.cuh"
#include "kernels/moe/moe_permute.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kPlanWarps = 16;
constexpr int kPlanThreads = kPlanWarps * 32;
static_assert(kPlanThreads >= kMaxMoeSlots, "one plan thread per slot");
constexpr int kPlanUnroll = 8;
static_assert(kMaxMoeSlots <= 32767, "slots are cached as int16");
constexpr int kGatherThreads = 256;
constexpr int kCombineThreads = 256;
// The multi-block plan: choices per block segment (at most), its warps, the scan's threads,
// and the most segments (more choices make each segment longer).
constexpr int kSegChoices = 1024;
constexpr int kSegThreads = 256;
constexpr int kSegWarps = kSegThreads / 32;
constexpr int kScanThreads = 1024;
static_assert(kScanThreads >= 2 * kMaxMoeSlots, "at least two scan threads per slot");
constexpr int64_t kMaxSegments = 2048;
// The combine issues every choice's load before the first sum up to this top_k.
constexpr int kCombineHoistK = 8;

__device__ __forceinline__ int SlotOf(const MoePermuteParams& p, int64_t i) {
  if (p.shared_slots > 0) {
    const int routed = p.top_k - p.shared_slots;
    const int64_t t = i / p.top_k;
    const int k = static_cast<int>(i - t * p.top_k);
    if (k >= routed) return p.num_slots - p.shared_slots + (k - routed);
    i = t * routed + k;
  }
  const int e = p.topk_ids[i];
  if (e < 0 || e >= p.num_experts) return -1;
  const int s = p.slot_of_expert[e];
  return s < p.num_slots - p.shared_slots ? s : -1;
}

// The routing weight of choice k of token t (1 for the shared choices).
__device__ __forceinline__ float ChoiceWeight(const MoeCombineParams& p, int64_t t, int k) {
  const int routed = p.top_k - p.shared_slots;
  return k < routed ? p.topk_weights[t * routed + k] : 1.0f;
}

// Dynamic shared memory: kPlanWarps * num_slots counters, then (cache_slots) one int16 slot
// per choice.
__device__ void PermutePlanBody(MoePermuteParams p, bool cache_slots) {
  extern __shared__ int warp_rank[];  // [kPlanWarps][num_slots]
  __shared__ int slot_total[kMaxMoeSlots];
  __shared__ int scan[2][kMaxMoeSlots];
  const int S = p.num_slots;
  int16_t* slot_cache = reinterpret_cast<int16_t*>(warp_rank + kPlanWarps * S);  // [choices]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t choices = int64_t{p.num_tokens} * p.top_k;
  const int64_t seg = (choices + kPlanWarps - 1) / kPlanWarps;
  const int64_t seg_begin = min(choices, warp * seg), seg_end = min(choices, seg_begin + seg);
  int* my_rank = warp_rank + warp * S;

  for (int i = threadIdx.x; i < kPlanWarps * S; i += kPlanThreads) warp_rank[i] = 0;
  __syncthreads();
  for (int64_t base = seg_begin + lane; base < seg_end; base += 32 * kPlanUnroll) {
    int slot[kPlanUnroll];
#pragma unroll
    for (int u = 0; u < kPlanUnroll; ++u) {
      const int64_t i = base + 32 * u;
      slot[u] = i < seg_end ? SlotOf(p, i) : -2;
    }
#pragma unroll
    for (int u = 0; u < kPlanUnroll; ++u) {
      if (slot[u] == -2) continue;
      if (cache_slots) slot_cache[base + 32 * u] = static_cast<int16_t>(slot[u]);
      if (slot[u] >= 0) atomicAdd(&my_rank[slot[u]], 1);
    }
  }
  __syncthreads();
  // Per slot: counts of the warps -> each warp's first rank inside the slot.
  const int s = threadIdx.x;
  int total = 0;
  if (s < S) {
    for (int w = 0; w < kPlanWarps; ++w) {
      const int c = warp_rank[w * S + s];
      warp_rank[w * S + s] = total;
      total += c;
    }
    slot_total[s] = total;
    p.slot_counts[s] = total;
  }
  // Inclusive scan over slots of the padded sizes (Hillis-Steele, double-buffered), then shift
  // to exclusive.
  const int padded = (total + p.row_align - 1) / p.row_align * p.row_align;
  if (s < S) slot_total[s] = padded;
  int buf = 0;
  if (s < kMaxMoeSlots) scan[0][s] = s < S ? padded : 0;
  __syncthreads();
  for (int d = 1; d < kMaxMoeSlots; d *= 2) {
    if (s < kMaxMoeSlots) scan[buf ^ 1][s] = scan[buf][s] + (s >= d ? scan[buf][s - d] : 0);
    buf ^= 1;
    __syncthreads();
  }
  if (s < S) {
    const int start = scan[buf][s] - slot_total[s];
    p.slot_offsets[s] = start;
    slot_total[s] = start;  // from here on: the slot's first row
    if (s == S - 1) p.slot_offsets[S] = scan[buf][s];
  }
  __syncthreads();
  // Ordered ranking: only this warp touches my_rank from here on.
  const unsigned lt_mask = (1u << lane) - 1u;
  for (int64_t base = seg_begin; base < seg_end; base += 32) {
    const int64_t i = base + lane;
    const int slot = i >= seg_end ? -2 : cache_slots ? slot_cache[i] : SlotOf(p, i);
    const unsigned peers = __match_any_sync(0xffffffffu, slot);
    if (slot >= 0) {
      const int row = slot_total[slot] + my_rank[slot] + __popc(peers & lt_mask);
      p.choice_row[i] = row;
      p.row_token[row] = static_cast<int>(i / p.top_k);
    } else if (slot == -1) {
      p.choice_row[i] = -1;
    }
    __syncwarp();
    if (slot >= 0 && lane == __ffs(peers) - 1) my_rank[slot] += __popc(peers);
    __syncwarp();
  }
}

// Segments of the multi-block plan: `segments` contiguous runs of seg choices (the last
// shorter).
struct Segments {
  int64_t count = 0;
  int64_t seg = 0;
};

Segments SegmentsFor(int64_t choices) {
  Segments g;
  g.count = std::min<int64_t>((choices + kSegChoices - 1) / kSegChoices, kMaxSegments);
  g.seg = (choices + g.count - 1) / std::max<int64_t>(g.count, 1);
  return g;
}

// Block b counts its segment's choices per slot: counts[b * num_slots + s].
__device__ void PlanCountBody(MoePermuteParams p, int64_t seg, int32_t* counts) {
  __shared__ int hist[kMaxMoeSlots];
  const int S = p.num_slots;
  const int64_t choices = int64_t{p.num_tokens} * p.top_k;
  const int64_t begin = min(choices, blockIdx.x * seg), end = min(choices, begin + seg);
  for (int s = threadIdx.x; s < S; s += kSegThreads) hist[s] = 0;
  __syncthreads();
  for (int64_t i = begin + threadIdx.x; i < end; i += kSegThreads) {
    const int slot = SlotOf(p, i);
    if (slot >= 0) atomicAdd(&hist[slot], 1);
  }
  __syncthreads();
  for (int s = threadIdx.x; s < S; s += kSegThreads) counts[blockIdx.x * int64_t{S} + s] = hist[s];
}

// One block: counts[b][s] -> slot_offsets[s] + the rows of slot s in segments before b (each
// segment's first row per slot), slot_counts, slot_offsets (padded to row_align).
// Thread (part, s) = (tid / S, tid % S) walks segments [part * per, (part + 1) * per).
__device__ void PlanScanBody(MoePermuteParams p, int64_t segments, int32_t* counts) {
  __shared__ int part_sum[kScanThreads];  // [parts][S]
  __shared__ int slot_total[kMaxMoeSlots];
  __shared__ int scan[2][kMaxMoeSlots];
  const int S = p.num_slots;
  const int parts = kScanThreads / S;
  const int s = threadIdx.x % S, part = threadIdx.x / S;
  const int64_t per = (segments + parts - 1) / parts;
  const int64_t b0 = min(segments, part * per), b1 = min(segments, b0 + per);
  const bool active = part < parts;
  int sum = 0;
  if (active) {
    for (int64_t b = b0; b < b1; ++b) sum += counts[b * S + s];
    part_sum[part * S + s] = sum;
  }
  __syncthreads();
  int total = 0;
  if (threadIdx.x < S) {
    for (int q = 0; q < parts; ++q) total += part_sum[q * S + threadIdx.x];
    p.slot_counts[threadIdx.x] = total;
  }
  const int t = threadIdx.x;
  const int padded = (total + p.row_align - 1) / p.row_align * p.row_align;
  if (t < S) slot_total[t] = padded;
  int buf = 0;
  if (t < kMaxMoeSlots) scan[0][t] = t < S ? padded : 0;
  __syncthreads();
  for (int d = 1; d < kMaxMoeSlots; d *= 2) {
    if (t < kMaxMoeSlots) scan[buf ^ 1][t] = scan[buf][t] + (t >= d ? scan[buf][t - d] : 0);
    buf ^= 1;
    __syncthreads();
  }
  if (t < S) {
    const int start = scan[buf][t] - slot_total[t];
    p.slot_offsets[t] = start;
    if (t == S - 1) p.slot_offsets[S] = scan[buf][t];
  }
  __syncthreads();
  if (active) {
    int row = scan[buf][s] - slot_total[s];  // the slot's first row
    for (int q = 0; q < part; ++q) row += part_sum[q * S + s];
    for (int64_t b = b0; b < b1; ++b) {
      const int c = counts[b * S + s];
      counts[b * S + s] = row;
      row += c;
    }
  }
}

// Block b ranks its segment: first[b * S + s] is its first row of slot s (PlanScanBody); its
// warps split the segment, count per slot, and each walks its part in order, 32 choices at a
// time, as the one-block plan's ranking pass.
__device__ void PlanRankBody(MoePermuteParams p, int64_t seg, const int32_t* first) {
  __shared__ int warp_rank[kSegWarps][kMaxMoeSlots];
  const int S = p.num_slots;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t choices = int64_t{p.num_tokens} * p.top_k;
  const int64_t begin = min(choices, blockIdx.x * seg), end = min(choices, begin + seg);
  const int64_t sub = (end - begin + kSegWarps - 1) / kSegWarps;
  const int64_t w_begin = min(end, begin + warp * sub), w_end = min(end, w_begin + sub);
  for (int i = threadIdx.x; i < kSegWarps * S; i += kSegThreads) warp_rank[i / S][i % S] = 0;
  __syncthreads();
  for (int64_t i = w_begin + lane; i < w_end; i += 32) {
    const int slot = SlotOf(p, i);
    if (slot >= 0) atomicAdd(&warp_rank[warp][slot], 1);
  }
  __syncthreads();
  for (int s = threadIdx.x; s < S; s += kSegThreads) {
    int row = first[blockIdx.x * int64_t{S} + s];
    for (int w = 0; w < kSegWarps; ++w) {
      const int c = warp_rank[w][s];
      warp_rank[w][s] = row;
      row += c;
    }
  }
  __syncthreads();
  int* my_row = warp_rank[warp];
  const unsigned lt_mask = (1u << lane) - 1u;
  for (int64_t base = w_begin; base < w_end; base += 32) {
    const int64_t i = base + lane;
    const int slot = i < w_end ? SlotOf(p, i) : -2;
    const unsigned peers = __match_any_sync(0xffffffffu, slot);
    if (slot >= 0) {
      const int row = my_row[slot] + __popc(peers & lt_mask);
      p.choice_row[i] = row;
      p.row_token[row] = static_cast<int>(i / p.top_k);
    } else if (slot == -1) {
      p.choice_row[i] = -1;
    }
    __syncwarp();
    if (slot >= 0 && lane == __ffs(peers) - 1) my_row[slot] += __popc(peers);
    __syncwarp();
  }
}

__device__ void GatherBody(int64_t hidden_size, bool vec4, const float* hidden,
                           const int32_t* rows_total, const int32_t* row_token, float* out) {
  const int row = blockIdx.x;
  if (row >= *rows_total) return;
  const int64_t t = row_token[row];
  if (vec4) {
    const float4* src = reinterpret_cast<const float4*>(hidden + t * hidden_size);
    float4* dst = reinterpret_cast<float4*>(out + row * hidden_size);
    for (int64_t c = threadIdx.x; c < hidden_size / 4; c += kGatherThreads) dst[c] = src[c];
  } else {
    const float* src = hidden + t * hidden_size;
    float* dst = out + row * hidden_size;
    for (int64_t c = threadIdx.x; c < hidden_size; c += kGatherThreads) dst[c] = src[c];
  }
}

__device__ __forceinline__ unsigned Bf16x2Bits(float lo, float hi) {
  return static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

// The same gather, rounding to bf16 on the way (vec4: 4 floats in, 8 bytes out per step).
__device__ void GatherBf16Body(int64_t hidden_size, bool vec4, const float* hidden,
                               const int32_t* rows_total, const int32_t* row_token, uint16_t* out) {
  const int row = blockIdx.x;
  if (row >= *rows_total) return;
  const int64_t t = row_token[row];
  if (vec4) {
    const float4* src = reinterpret_cast<const float4*>(hidden + t * hidden_size);
    uint2* dst = reinterpret_cast<uint2*>(out + row * hidden_size);
    for (int64_t c = threadIdx.x; c < hidden_size / 4; c += kGatherThreads) {
      const float4 v = src[c];
      dst[c] = make_uint2(Bf16x2Bits(v.x, v.y), Bf16x2Bits(v.z, v.w));
    }
  } else {
    const float* src = hidden + t * hidden_size;
    uint16_t* dst = out + row * hidden_size;
    for (int64_t c = threadIdx.x; c < hidden_size; c += kGatherThreads) {
      dst[c] = __bfloat16_as_ushort(__float2bfloat16_rn(src[c]));
    }
  }
}

// One block per token: its hidden row read once (16-byte loads) and written to the row of each
// of its choices (choice_row >= 0), as T (float, or uint16_t: bf16 rounded to nearest even).
// hidden_size % 4 == 0 and 16-byte aligned rows (8-byte for bf16 out).
template <typename T>
__device__ void GatherByTokenBody(int64_t hidden_size, int top_k, const float* __restrict__ hidden,
                                  const int32_t* __restrict__ choice_row, T* __restrict__ out) {
  const int64_t t = blockIdx.x;
  const float4* src = reinterpret_cast<const float4*>(hidden + t * hidden_size);
  const int32_t* rows = choice_row + t * top_k;
  const int64_t h4 = hidden_size / 4;
  // Two 16-byte loads in flight per thread before its stores (a 2048-wide row: all of it).
  for (int64_t c0 = threadIdx.x; c0 < h4; c0 += 2 * kGatherThreads) {
    const int64_t c1 = c0 + kGatherThreads;
    const float4 v0 = src[c0];
    const float4 v1 = c1 < h4 ? src[c1] : v0;
    for (int k = 0; k < top_k; ++k) {
      const int row = rows[k];
      if (row < 0) continue;
      T* dst = out + int64_t{row} * hidden_size;
      if constexpr (sizeof(T) == 2) {
        reinterpret_cast<uint2*>(dst)[c0] =
            make_uint2(Bf16x2Bits(v0.x, v0.y), Bf16x2Bits(v0.z, v0.w));
        if (c1 < h4) {
          reinterpret_cast<uint2*>(dst)[c1] =
              make_uint2(Bf16x2Bits(v1.x, v1.y), Bf16x2Bits(v1.z, v1.w));
        }
      } else {
        reinterpret_cast<float4*>(dst)[c0] = v0;
        if (c1 < h4) reinterpret_cast<float4*>(dst)[c1] = v1;
      }
    }
  }
}

// The gather for padded layouts (row_align > 1): one block per choice, to its row (gap rows
// have no source token, so the row-major gather above cannot be used). T: float or uint16_t
// (bf16, rounded to nearest even). vec4: 16-byte loads (and 16- or 8-byte stores), the width
// the row-major gathers use; the scalar loop issues a quarter of the bytes per instruction.
template <typename T>
__device__ void GatherByChoiceBody(int64_t hidden_size, int top_k, bool vec4, const float* hidden,
                                   const int32_t* choice_row, T* out) {
  const int64_t i = blockIdx.x;
  const int row = choice_row[i];
  if (row < 0) return;
  const float* src = hidden + (i / top_k) * hidden_size;
  T* dst = out + row * hidden_size;
  if (vec4) {
    const float4* src4 = reinterpret_cast<const float4*>(src);
    for (int64_t c = threadIdx.x; c < hidden_size / 4; c += kGatherThreads) {
      const float4 v = src4[c];
      if constexpr (sizeof(T) == 2) {
        reinterpret_cast<uint2*>(dst)[c] = make_uint2(Bf16x2Bits(v.x, v.y), Bf16x2Bits(v.z, v.w));
      } else {
        reinterpret_cast<float4*>(dst)[c] = v;
      }
    }
    return;
  }
  for (int64_t c = threadIdx.x; c < hidden_size; c += kGatherThreads) {
    if constexpr (sizeof(T) == 2) {
      dst[c] = __bfloat16_as_ushort(__float2bfloat16_rn(src[c]));
    } else {
      dst[c] = src[c];
    }
  }
}

__device__ __forceinline__ float Widen(float v) { return v; }
__device__ __forceinline__ float Widen(uint16_t v) {
  return __uint_as_float(static_cast<unsigned>(v) << 16);
}

// V consecutive columns of expert_out (V = 4: one 16-byte or 8-byte load).
template <typename T, int V>
struct Cols;
template <typename T>
struct Cols<T, 1> {
  float v[1];
  __device__ __forceinline__ explicit Cols(const T* p) { v[0] = Widen(*p); }
};
template <>
struct Cols<float, 4> {
  float v[4];
  __device__ __forceinline__ explicit Cols(const float* p) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  }
};
template <>
struct Cols<uint16_t, 4> {
  float v[4];
  __device__ __forceinline__ explicit Cols(const uint16_t* p) {
    const uint2 q = *reinterpret_cast<const uint2*>(p);
    v[0] = __uint_as_float(q.x << 16), v[1] = __uint_as_float(q.x & 0xffff0000u);
    v[2] = __uint_as_float(q.y << 16), v[3] = __uint_as_float(q.y & 0xffff0000u);
  }
};

// One block (x) per token, threads over groups of V columns. __fmul_rn / __fadd_rn keep nvcc
// from fusing the product and the sum into an FMA, which would round differently from the
// reference. T: float or uint16_t (bf16 bits) expert outputs.
template <typename T, int V>
__device__ void CombineBody(MoeCombineParams p, const T* expert_out) {
  const int64_t t = blockIdx.x;
  const int64_t c = (blockIdx.y * int64_t{kCombineThreads} + threadIdx.x) * V;
  if (c >= p.hidden_size) return;
  float* out = p.out + t * p.hidden_size + c;
  float acc[V];
  for (int j = 0; j < V; ++j) acc[j] = p.accumulate ? out[j] : 0.0f;
  for (int k = 0; k < p.top_k; ++k) {
    const int row = p.choice_row[t * p.top_k + k];
    if (row < 0) continue;
    const float w = ChoiceWeight(p, t, k);
    const Cols<T, V> y(expert_out + int64_t{row} * p.hidden_size + c);
    for (int j = 0; j < V; ++j) acc[j] = __fadd_rn(acc[j], __fmul_rn(w, y.v[j]));
  }
  if constexpr (V == 4) {
    *reinterpret_cast<float4*>(out) = make_float4(acc[0], acc[1], acc[2], acc[3]);
  } else {
    out[0] = acc[0];
  }
}

// CombineBody for V = 4 and top_k <= kCombineHoistK: every choice's row, weight and 4 columns
// loaded before the first sum (the loop above waits for each choice's load in turn), then the
// same sums in the same order.
template <typename T>
__device__ void CombineHoistedBody(MoeCombineParams p, const T* expert_out) {
  const int64_t t = blockIdx.x;
  const int64_t c = (blockIdx.y * int64_t{kCombineThreads} + threadIdx.x) * 4;
  if (c >= p.hidden_size) return;
  float* out = p.out + t * p.hidden_size + c;
  int row[kCombineHoistK];
  float w[kCombineHoistK];
#pragma unroll
  for (int k = 0; k < kCombineHoistK; ++k) {
    row[k] = k < p.top_k ? p.choice_row[t * p.top_k + k] : -1;
    w[k] = k < p.top_k ? ChoiceWeight(p, t, k) : 0.0f;
  }
  float y[kCombineHoistK][4] = {};
#pragma unroll
  for (int k = 0; k < kCombineHoistK; ++k) {
    if (row[k] < 0) continue;
    const Cols<T, 4> q(expert_out + int64_t{row[k]} * p.hidden_size + c);
#pragma unroll
    for (int j = 0; j < 4; ++j) y[k][j] = q.v[j];
  }
  float acc[4];
  if (p.accumulate) {
    const float4 o = *reinterpret_cast<const float4*>(out);
    acc[0] = o.x, acc[1] = o.y, acc[2] = o.z, acc[3] = o.w;
  } else {
    acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
  }
#pragma unroll
  for (int k = 0; k < kCombineHoistK; ++k) {
    if (row[k] < 0) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[j] = __fadd_rn(acc[j], __fmul_rn(w[k], y[k][j]));
  }
  *reinterpret_cast<float4*>(out) = make_float4(acc[0], acc[1], acc[2], acc[3]);
}

template <typename T>
cudaError_t LaunchCombine(const MoeCombineParams& p, const T* expert_out, cudaStream_t stream) {
  const bool vec4 = p.hidden_size % 4 == 0 && reinterpret_cast<uintptr_t>(p.out) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(expert_out) % (4 * sizeof(T)) == 0;
  const int64_t per_block = int64_t{kCombineThreads} * (vec4 ? 4 : 1);
  const int64_t col_blocks = (p.hidden_size + per_block - 1) / per_block;
  if (col_blocks > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(col_blocks));
  if (vec4 && p.top_k <= kCombineHoistK) {
    return LaunchAfterPrecedingGrids<CombineHoistedBody<T>, kCombineThreads>(grid, 0, stream, p,
                                                                             expert_out);
  }
  if (vec4) {
    return LaunchAfterPrecedingGrids<CombineBody<T, 4>, kCombineThreads>(grid, 0, stream, p,
                                                                         expert_out);
  }
  return LaunchAfterPrecedingGrids<CombineBody<T, 1>, kCombineThreads>(grid, 0, stream, p,
                                                                       expert_out);
}

// The one-block plan (dynamic shared memory: the per-warp counters, and the choices' slots
// when they fit in the opt-in limit).
cudaError_t LaunchPlan(const MoePermuteParams& p, int64_t choices, cudaStream_t stream) {
  const size_t counters = sizeof(int) * kPlanWarps * p.num_slots;
  const size_t cached = counters + sizeof(int16_t) * static_cast<size_t>(choices);
  // Shared memory a block may opt into beyond the default 48 KB, minus the static arrays.
  int device = 0, optin = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  }
  if (err != cudaSuccess) return err;
  const size_t static_bytes = sizeof(int) * 3 * kMaxMoeSlots;
  const bool cache_slots = cached + static_bytes <= static_cast<size_t>(optin);
  const size_t shared = cache_slots ? cached : counters;
  if (shared + static_bytes > 48 * 1024) {
    err =
        cudaFuncSetAttribute(EntryKernel<PermutePlanBody, kPlanThreads>(),
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
    if (err != cudaSuccess) return err;
  }
  return LaunchAfterPrecedingGrids<PermutePlanBody, kPlanThreads>(1, shared, stream, p,
                                                                  cache_slots);
}

}  // namespace

int64_t MoePermutePlanWorkspaceBytes(int32_t num_tokens, int32_t top_k, int32_t num_slots) {
  const int64_t choices = int64_t{num_tokens} * top_k;
  if (choices < kMoeMultiBlockPlanChoices || num_slots < 1) return 0;
  return SegmentsFor(choices).count * num_slots * int64_t{sizeof(int32_t)};
}

cudaError_t MoePermuteF32(const MoePermuteParams& p, cudaStream_t stream) {
  if (p.num_slots < 1 || p.num_slots > kMaxMoeSlots || p.num_tokens < 0 || p.top_k < 0 ||
      p.num_experts < 0 || p.hidden_size < 0 || p.row_align < 1 || p.shared_slots < 0 ||
      p.shared_slots > p.top_k || p.shared_slots >= p.num_slots) {
    return cudaErrorInvalidValue;
  }
  const int64_t choices = int64_t{p.num_tokens} * p.top_k;
  if (MoePermutedRowsBound(p.num_tokens, p.top_k, p.num_slots, p.row_align) >= (int64_t{1} << 31)) {
    return cudaErrorInvalidValue;
  }
  const bool large = choices >= kMoeMultiBlockPlanChoices;
  cudaError_t err = cudaSuccess;
  if (large && p.plan_workspace != nullptr) {
    const Segments g = SegmentsFor(choices);
    int32_t* counts = static_cast<int32_t*>(p.plan_workspace);
    const unsigned blocks = static_cast<unsigned>(g.count);
    err =
        LaunchAfterPrecedingGrids<PlanCountBody, kSegThreads>(blocks, 0, stream, p, g.seg, counts);
    if (err == cudaSuccess) {
      err = LaunchAfterPrecedingGrids<PlanScanBody, kScanThreads>(1, 0, stream, p, g.count, counts);
    }
    if (err == cudaSuccess) {
      err = LaunchAfterPrecedingGrids<PlanRankBody, kSegThreads>(
          blocks, 0, stream, p, g.seg, static_cast<const int32_t*>(counts));
    }
  } else {
    err = LaunchPlan(p, choices, stream);
  }
  if (err != cudaSuccess || choices == 0 || p.hidden_size == 0) return err;
  const bool aligned = p.hidden_size % 4 == 0 && reinterpret_cast<uintptr_t>(p.hidden) % 16 == 0;
  if (large && aligned) {
    if (p.permuted_hidden_bf16 != nullptr) {
      if (reinterpret_cast<uintptr_t>(p.permuted_hidden_bf16) % 8 == 0) {
        return LaunchAfterPrecedingGrids<GatherByTokenBody<uint16_t>, kGatherThreads>(
            static_cast<unsigned>(p.num_tokens), 0, stream, p.hidden_size, p.top_k, p.hidden,
            static_cast<const int32_t*>(p.choice_row), p.permuted_hidden_bf16);
      }
    } else if (reinterpret_cast<uintptr_t>(p.permuted_hidden) % 16 == 0) {
      return LaunchAfterPrecedingGrids<GatherByTokenBody<float>, kGatherThreads>(
          static_cast<unsigned>(p.num_tokens), 0, stream, p.hidden_size, p.top_k, p.hidden,
          static_cast<const int32_t*>(p.choice_row), p.permuted_hidden);
    }
  }
  if (p.row_align > 1) {
    if (p.permuted_hidden_bf16 != nullptr) {
      const bool vec4 = aligned && reinterpret_cast<uintptr_t>(p.permuted_hidden_bf16) % 8 == 0;
      return LaunchAfterPrecedingGrids<GatherByChoiceBody<uint16_t>, kGatherThreads>(
          static_cast<unsigned>(choices), 0, stream, p.hidden_size, p.top_k, vec4, p.hidden,
          p.choice_row, p.permuted_hidden_bf16);
    }
    const bool vec4 = aligned && reinterpret_cast<uintptr_t>(p.permuted_hidden) % 16 == 0;
    return LaunchAfterPrecedingGrids<GatherByChoiceBody<float>, kGatherThreads>(
        static_cast<unsigned>(choices), 0, stream, p.hidden_size, p.top_k, vec4, p.hidden,
        p.choice_row, p.permuted_hidden);
  }
  if (p.permuted_hidden_bf16 != nullptr) {
    const bool vec4 = aligned && reinterpret_cast<uintptr_t>(p.permuted_hidden_bf16) % 8 == 0;
    return LaunchAfterPrecedingGrids<GatherBf16Body, kGatherThreads>(
        static_cast<unsigned>(choices), 0, stream, p.hidden_size, vec4, p.hidden,
        p.slot_offsets + p.num_slots, p.row_token, p.permuted_hidden_bf16);
  }
  const bool vec4 = aligned && reinterpret_cast<uintptr_t>(p.permuted_hidden) % 16 == 0;
  return LaunchAfterPrecedingGrids<GatherBody, kGatherThreads>(
      static_cast<unsigned>(choices), 0, stream, p.hidden_size, vec4, p.hidden,
      p.slot_offsets + p.num_slots, p.row_token, p.permuted_hidden);
}

cudaError_t MoeCombineF32(const MoeCombineParams& p, cudaStream_t stream) {
  if (p.num_tokens < 0 || p.top_k < 0 || p.hidden_size < 0 || p.shared_slots < 0 ||
      p.shared_slots > p.top_k) {
    return cudaErrorInvalidValue;
  }
  if (p.num_tokens == 0 || p.hidden_size == 0) return cudaSuccess;
  if (p.top_k == 0) {
    if (p.accumulate) return cudaSuccess;
    return cudaMemsetAsync(p.out, 0, sizeof(float) * p.num_tokens * p.hidden_size, stream);
  }
  if (p.expert_out_bf16 != nullptr) return LaunchCombine(p, p.expert_out_bf16, stream);
  return LaunchCombine(p, p.expert_out, stream);
}

}  // namespace kernels
}  // namespace deepinfer
