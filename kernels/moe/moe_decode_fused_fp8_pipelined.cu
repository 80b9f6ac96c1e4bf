// kPipelined's gate_up of the FP8 fused decode MoE block (moe_decode_fused_fp8.h) at one token:
// the bf16 block's pipelined gate_up (moe_decode_fused.cu) in e4m3, a warp streaming whole row
// pairs with several of them in flight and its slice of the hidden row held in registers.
//
// Work. A unit is one (part, row j) pair: the gate row j and the up row j of a part, hidden_size
// bytes each. A lane owns the vectors v = lane + 32 n, n < kLaneVecs, of every row (16 e4m3
// values = one 16-byte load each), so its k slice is the same for every row: its 16 * kLaneVecs
// hidden values are loaded once after the PDL wait into fp32 registers (kLaneVecs = 4 at hidden
// 2048: 64 registers) and serve every row the warp streams; no shared memory, no barrier. Taken
// where hidden_size <= 32 * 16 * kLaneVecs = 2048 (Moonlight); wider rows (V3's 7168: 224 values
// a lane) do not fit in registers and run kStationary's pair.
//
// Order. Warp w of W owns a contiguous range of the shared parts' units (S * inter in all) and
// one of the routed parts' units (top_k * inter), balanced to one unit, shared first: every warp
// starts on shared rows, whose weights no kernel writes, so its first units' loads are issued
// BEFORE the PDL wait. After the wait the warp resolves the routing itself, lane k holding choice
// k's gate_up and scale pointers (topk_ids -> slot_of_expert -> the tables), handed to the other
// lanes with a shuffle per unit: no part table in shared memory and no warp waits for another.
//
// Pipeline. A ring of kRing units in registers (kRing * 2 * kLaneVecs 16-byte loads a lane): while
// unit n is summed, units n + 1 .. n + kRing - 1 are in flight, and unit n + kRing is issued into
// its slot right after it (the slots indexed statically: the loop is unrolled kRing times).
//
// Bytes in flight. A unit is 2 * 2048 B = 4 KB at hidden 2048; a warp keeps 3-4 units = 12-16 KB
// in flight, and never fewer than 3 units between its sums; 8 warps an SM (one 256-thread block)
// keep 96-128 KB in flight. At ~4 TB/s over 132 SMs (~30 KB/us an SM) 96 KB covers ~3 us of load
// latency. kRowReuse's gate_up (80 registers, 3 blocks of 8 warps an SM) holds 2-4 KB a warp, up
// to 96 KB an SM, but between two 2 KB steps a warp reads 4 float4 hidden values a vector from
// shared memory and its block stages the hidden row behind a __syncthreads. Registers a thread:
// the ring 4 * 8 * 4 = 128, the hidden slice 64, the rest unit bookkeeping: `nvcc -Xptxas -v`
// (sm_90) 249 at hidden 2048 (kFull), 236 narrower, no spills; 256 x 256 = 64K, one block an SM.
//
// Sums: per lane and row, each vector's 16 products (e4m3 widened exactly by cvt.f16x2.e4m3x2)
// summed in fp32 in k order from 0, times the vector's block scale added to the lane's fp32
// accumulator in n order; a butterfly; act = silu(g) * u (expf). These are kRowReuse's gate_up
// sums in the same order (its lane owns the same vectors): at one token the act values are its
// bit for bit. act is written in ActIndex's order, so both downs (kStationary's, kRowReuse's)
// read it unchanged.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/common/kernel_facts.h"
#include "kernels/common/launch.cuh"
#include "kernels/common/streaming_load.cuh"
#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/moe/moe_decode_fused_fp8.h"
#include "kernels/moe/moe_decode_fused_fp8_internal.cuh"

namespace deepinfer {
namespace kernels {
namespace moe_fp8_internal {
namespace {

constexpr int kPipeWarps = 8;
constexpr int kPipeThreads = kPipeWarps * 32;
constexpr int kLaneVecs = 4;  // 16-byte vectors of a row a lane owns
constexpr int kRing = 4;      // units in a warp's register ring
constexpr int kMaxPipeHidden = 32 * kVec * kLaneVecs;

// A unit's 16-byte loads: gate vectors n (w[n]), then up vectors n (w[kLaneVecs + n]).
struct UnitLoads {
  uint4 w[2 * kLaneVecs];
};

struct PipeRing {
  UnitLoads slot[kRing];
};

// The warp's units: shared units shared0 .. shared0 + shared_count - 1 (index s * inter + j),
// then routed units routed0 .. (index k * inter + j); count in all.
struct WarpUnits {
  int shared0, shared_count, routed0, count;
};

__device__ __forceinline__ WarpUnits MakeWarpUnits(const MoeDecodeFusedFp8Params& p) {
  const int64_t W = int64_t{gridDim.x} * kPipeWarps;
  const int64_t w = int64_t{blockIdx.x} * kPipeWarps + threadIdx.x / 32;
  const int64_t ns = int64_t{p.shared_parts} * p.inter, nr = int64_t{p.top_k} * p.inter;
  WarpUnits u;
  u.shared0 = static_cast<int>(ns * w / W);
  u.shared_count = static_cast<int>(ns * (w + 1) / W) - u.shared0;
  u.routed0 = static_cast<int>(nr * w / W);
  u.count = u.shared_count + static_cast<int>(nr * (w + 1) / W) - u.routed0;
  return u;
}

// Unit m of the warp: its part (shared: s, routed: k), row j and whether it is a shared one.
struct UnitId {
  bool shared;
  int part, j;
};

__device__ __forceinline__ UnitId Unit(const WarpUnits& wu, int m, int inter) {
  UnitId id;
  id.shared = m < wu.shared_count;
  const int x = id.shared ? wu.shared0 + m : wu.routed0 + (m - wu.shared_count);
  id.part = x / inter;
  id.j = x - id.part * inter;
  return id;
}

// Lane k < top_k's routed choice k: its gate_up matrix and scale grid (null: invalid expert).
struct LaneRoute {
  const uint8_t* gate_up;
  const float* scales;
};

__device__ __forceinline__ LaneRoute ResolveRoute(const MoeDecodeFusedFp8Params& p) {
  LaneRoute r{nullptr, nullptr};
  const int lane = threadIdx.x % 32;
  if (lane < p.top_k) {
    const int32_t e = __ldcg(p.topk_ids + lane);
    if (ValidExpert(p, e)) {
      const int32_t slot = __ldg(p.slot_of_expert + e);
      r.gate_up = p.gate_up[slot];
      r.scales = p.gate_up_scales[slot];
    }
  }
  return r;
}

template <typename T>
__device__ __forceinline__ T* ShflPointer(T* ptr, int src) {
  return reinterpret_cast<T*>(
      __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(ptr), src));
}

// The gate row of a unit (the up row follows at `up`); gate null: an invalid expert's unit.
struct UnitRows {
  const uint8_t* gate;
  const uint8_t* up;
};

__device__ __forceinline__ UnitRows Rows(const MoeDecodeFusedFp8Params& p, const UnitId& id,
                                         const LaneRoute& route) {
  const int64_t H = p.hidden_size, I = p.inter;
  UnitRows r;
  if (id.shared) {
    r.gate = p.shared_gate_up + (int64_t{id.part} * I + id.j) * H;
    r.up = p.shared_gate_up + ((int64_t{p.shared_parts} + id.part) * I + id.j) * H;
  } else {
    const uint8_t* base = ShflPointer(route.gate_up, id.part);
    r.gate = base != nullptr ? base + int64_t{id.j} * H : nullptr;
    r.up = base != nullptr ? base + (I + id.j) * H : nullptr;
  }
  return r;
}

// kFull: kv == 32 * kLaneVecs (hidden 2048), every lane's vectors in the row.
template <bool kFull>
__device__ __forceinline__ void LoadUnit(const UnitRows& r, int kv, UnitLoads* u) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < kLaneVecs; ++n) {
    const int v = lane + 32 * n;
    const bool live = r.gate != nullptr && (kFull || v < kv);
    u->w[n] = live ? LoadStreaming16(r.gate + kVec * v) : make_uint4(0, 0, 0, 0);
    u->w[kLaneVecs + n] = live ? LoadStreaming16(r.up + kVec * v) : make_uint4(0, 0, 0, 0);
  }
}

// Before the PDL wait: the warp's first units, where they are shared ones (the rest of the ring
// zeros, loaded after the wait).
template <bool kFull>
__device__ PipeRing GateUpPipelinedPrefetch(MoeDecodeFusedFp8Params p) {
  PipeRing ring;
  const WarpUnits wu = MakeWarpUnits(p);
  const int kv = p.hidden_size / kVec;
  const LaneRoute none{nullptr, nullptr};
#pragma unroll
  for (int q = 0; q < kRing; ++q) {
    if (q < wu.shared_count) {
      LoadUnit<kFull>(Rows(p, Unit(wu, q, p.inter), none), kv, &ring.slot[q]);
    } else {
#pragma unroll
      for (int n = 0; n < 2 * kLaneVecs; ++n) ring.slot[q].w[n] = make_uint4(0, 0, 0, 0);
    }
  }
  return ring;
}

// Sums unit id's loads u with the lane's hidden values x and writes its act value.
template <bool kFull>
__device__ __forceinline__ void SumUnit(const MoeDecodeFusedFp8Params& p, const UnitId& id,
                                        const LaneRoute& route, const UnitLoads& u,
                                        const float4 x[kLaneVecs][4], int kv) {
  const int lane = threadIdx.x % 32, I = p.inter;
  const float* scales;
  int32_t ld, gate_row, up_row, split;
  float* act;
  if (id.shared) {
    scales = p.shared_gate_up_scales;
    ld = p.shared_gate_up_scale_ld;
    gate_row = id.part * I + id.j;
    up_row = (p.shared_parts + id.part) * I + id.j;
    split = p.shared_gate_up_split_rows;
    act = p.act + int64_t{p.top_k + id.part} * I;
  } else {
    scales = ShflPointer(route.scales, id.part);
    if (scales == nullptr) return;  // an invalid expert: no act row read by a down
    ld = p.gate_up_scale_ld;
    gate_row = id.j;
    up_row = I + id.j;
    split = I;
    act = p.act + int64_t{id.part} * I;
  }
  const float* gs = scales + Fp8ScaleRow(gate_row, split) * ld;
  const float* us = scales + Fp8ScaleRow(up_row, split) * ld;
  float ag = 0.0f, au = 0.0f;
#pragma unroll
  for (int n = 0; n < kLaneVecs; ++n) {
    const int v = lane + 32 * n;
    if (!kFull && v >= kv) break;
    const float sg = __ldg(gs + v / kVecsPerBlock), su = __ldg(us + v / kVecsPerBlock);
    float pg = 0.0f, pu = 0.0f;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float w[4];
      Fp8x4(Word(u.w[n], q), w);
      pg = Dot4(x[n][q], w, pg);
      Fp8x4(Word(u.w[kLaneVecs + n], q), w);
      pu = Dot4(x[n][q], w, pu);
    }
    ag = fmaf(pg, sg, ag);
    au = fmaf(pu, su, au);
  }
  const float g = WarpSum(ag), v = WarpSum(au);
  // expf (not __expf), as SiluMulF32.
  if (lane == 0) act[ActIndex(id.j, I / kVec)] = g / (1.0f + expf(-g)) * v;
}

template <bool kFull>
__device__ void GateUpPipelinedBody(const PipeRing& prefetched, MoeDecodeFusedFp8Params p) {
  const WarpUnits wu = MakeWarpUnits(p);
  if (wu.count == 0) return;
  const int lane = threadIdx.x % 32, kv = p.hidden_size / kVec;
  // Routing (dependent loads, answered while the prefetched units arrive), then the hidden slice.
  const LaneRoute route = p.top_k > 0 ? ResolveRoute(p) : LaneRoute{nullptr, nullptr};
  float4 x[kLaneVecs][4];
  const float4* hidden4 = reinterpret_cast<const float4*>(p.hidden);
#pragma unroll
  for (int n = 0; n < kLaneVecs; ++n) {
    const int v = lane + 32 * n;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      x[n][q] = kFull || v < kv ? __ldg(hidden4 + 4 * v + q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  PipeRing ring = prefetched;
  // Unit m lives in slot m % kRing. The prefetch issued the shared units among 0 .. kRing - 1;
  // the rest of them now.
#pragma unroll
  for (int q = 0; q < kRing; ++q) {
    if (q >= wu.shared_count && q < wu.count) {
      LoadUnit<kFull>(Rows(p, Unit(wu, q, p.inter), route), kv, &ring.slot[q]);
    }
  }
  for (int n0 = 0; n0 < wu.count; n0 += kRing) {
#pragma unroll
    for (int s = 0; s < kRing; ++s) {
      const int n = n0 + s;
      if (n >= wu.count) break;
      SumUnit<kFull>(p, Unit(wu, n, p.inter), route, ring.slot[s], x, kv);
      // Unit n + kRing into the slot just summed (units n + 1 .. n + kRing - 1 in flight).
      if (n + kRing < wu.count) {
        LoadUnit<kFull>(Rows(p, Unit(wu, n + kRing, p.inter), route), kv, &ring.slot[s]);
      }
    }
  }
}

// One warp per unit at most; else every resident warp (one block an SM at 236-249 registers),
// each a balanced range.
template <bool kFull>
cudaError_t LaunchGateUp(const MoeDecodeFusedFp8Params& p, int sms, cudaStream_t stream) {
  constexpr auto kGateUp = PrefetchEntryKernel<GateUpPipelinedPrefetch<kFull>,
                                               GateUpPipelinedBody<kFull>, kPipeThreads>();
  static const int per_sm =
      BlocksPerSm(reinterpret_cast<const void*>(kGateUp), kPipeThreads, /*fallback=*/1);
  const int64_t units = int64_t{p.top_k + p.shared_parts} * p.inter;
  const int64_t warps = std::min<int64_t>(units, int64_t{sms} * std::max(1, per_sm) * kPipeWarps);
  const int64_t blocks = (warps + kPipeWarps - 1) / kPipeWarps;
  return LaunchPrefetchThenAfterPrecedingGrids<GateUpPipelinedPrefetch<kFull>,
                                               GateUpPipelinedBody<kFull>, kPipeThreads>(
      dim3(static_cast<unsigned>(blocks)), 0, stream, p);
}

}  // namespace

bool PipelinedGateUpApplies(const MoeDecodeFusedFp8Params& p) {
  return p.num_tokens == 1 && p.hidden_size <= kMaxPipeHidden;
}

cudaError_t LaunchPipelined(const MoeDecodeFusedFp8Params& p, cudaStream_t stream) {
  int sms = 0;
  cudaError_t err = CurrentDeviceSms(&sms);
  if (err != cudaSuccess) return err;
  err = p.hidden_size == kMaxPipeHidden ? LaunchGateUp<true>(p, sms, stream)
                                        : LaunchGateUp<false>(p, sms, stream);
  if (err != cudaSuccess) return err;
  if (StationaryDownApplies(p)) return LaunchStationaryDown(p, sms, stream);
  return LaunchRowReuseDown(p, stream);
}

}  // namespace moe_fp8_internal
}  // namespace kernels
}  // namespace deepinfer
