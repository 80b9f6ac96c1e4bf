// The kRowReuse pair of the FP8 fused decode MoE block (moe_decode_fused_fp8.h): activation
// reads shared by several weight rows, e4m3 widened with cvt.f16x2.e4m3x2. kStationary launches
// the same gate_up (then its own down, moe_decode_fused_fp8_stationary.cu, where it applies);
// kPipelined's gate_up (moe_decode_fused_fp8_pipelined.cu) may be followed by this down.
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

// ---- kRowReuse. gate_up: one warp per (part, kReuseRows rows) item, part major, grid-strided;
// per step a lane loads its vector v = lane + 32 n of the item's kReuseRows gate and kReuseRows
// up rows and multiplies the 2 * kReuseRows weight vectors with one read of the hidden values at
// v from shared memory. The steps of a warp's items form one stream whose next step is loaded
// before the current one is summed. The act rows are written in ActIndex's order. Before the PDL
// wait, warps whose first item is a shared part's prefetch its rows into L2.

constexpr int kReuseRows = 2;
// gate_up's block: 8 warps share one staged copy of the hidden rows.
constexpr int kReuseWarps = 8;
constexpr int kReuseThreads = kReuseWarps * 32;
// Output features per down item (one act read serves their kDownFeatures rows).
constexpr int kDownFeatures = 4;

// The float4 slot of hidden vector v's float4 q (values 16 v + 4 q ..) in shared memory: v's 4
// float4s permuted so that 8 lanes reading q of 8 consecutive v hit 8 different 16-byte bank
// groups.
__device__ __forceinline__ int SwizzledX4(int v, int q) { return 4 * v + (q ^ ((v >> 1) & 3)); }

// A gate_up item's rows.
template <int kT>
struct ReuseItem {
  const uint8_t* gate;  // gate row j0 (rows hidden_size bytes apart); up row j0 at `up`
  const uint8_t* up;
  const float* gs;  // the scale rows of gate rows j0.. and up rows j0.. (one each: j0 even)
  const float* us;
  float* act[kT];  // the part's act row per token (null: not chosen)
  int j0;
};

// Item (u, jg): part u's rows kReuseRows * jg ...
template <int kT>
__device__ __forceinline__ void RowPointers(const PartTable<kT>& tab, int u, int jg, int H,
                                            const uint8_t** gate, const uint8_t** up) {
  const int64_t j0 = int64_t{jg} * kReuseRows;
  *gate = tab.part[u].gate + j0 * H;
  *up = tab.part[u].up + j0 * H;
}

template <int kT>
__device__ __forceinline__ void MakeReuseItem(const PartTable<kT>& tab, int u, int jg, int H,
                                              ReuseItem<kT>* it) {
  const Fp8Part& q = tab.part[u];
  const int j0 = jg * kReuseRows;
  RowPointers<kT>(tab, u, jg, H, &it->gate, &it->up);
  it->gs = q.gu_scales + Fp8ScaleRow(q.gate_row0 + j0, q.gu_split) * q.gu_scale_ld;
  it->us = q.gu_scales + Fp8ScaleRow(q.up_row0 + j0, q.gu_split) * q.gu_scale_ld;
#pragma unroll
  for (int t = 0; t < kT; ++t) it->act[t] = tab.act[u][t];
  it->j0 = j0;
}

struct ReuseStep {
  uint4 g[kReuseRows], u[kReuseRows];
};

__device__ __forceinline__ void LoadReuseStep(const uint8_t* gate, const uint8_t* up, int H, int v,
                                              int kv, ReuseStep* s) {
#pragma unroll
  for (int r = 0; r < kReuseRows; ++r) {
    s->g[r] = v < kv ? LoadStreaming16(gate + int64_t{r} * H + kVec * v) : make_uint4(0, 0, 0, 0);
    s->u[r] = v < kv ? LoadStreaming16(up + int64_t{r} * H + kVec * v) : make_uint4(0, 0, 0, 0);
  }
}

// xs: the staged hidden rows (token t's at xs + t * H / 4).
template <int kT>
__device__ __forceinline__ void AccumulateReuseStep(const ReuseStep& s, const ReuseItem<kT>& it,
                                                    int v, int kv, const float4* xs, int H4,
                                                    float ag[kReuseRows][kT],
                                                    float au[kReuseRows][kT]) {
  if (v >= kv) return;
  const float sg = __ldg(it.gs + v / kVecsPerBlock), su = __ldg(it.us + v / kVecsPerBlock);
  float pg[kReuseRows][kT], pu[kReuseRows][kT];
#pragma unroll
  for (int r = 0; r < kReuseRows; ++r) {
#pragma unroll
    for (int t = 0; t < kT; ++t) pg[r][t] = pu[r][t] = 0.0f;
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float4 a[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      if (it.act[t] != nullptr) a[t] = xs[t * H4 + SwizzledX4(v, q)];
    }
#pragma unroll
    for (int r = 0; r < kReuseRows; ++r) {
      float w[4];
      Fp8x4(Word(s.g[r], q), w);
#pragma unroll
      for (int t = 0; t < kT; ++t) {
        if (it.act[t] != nullptr) pg[r][t] = Dot4(a[t], w, pg[r][t]);
      }
      Fp8x4(Word(s.u[r], q), w);
#pragma unroll
      for (int t = 0; t < kT; ++t) {
        if (it.act[t] != nullptr) pu[r][t] = Dot4(a[t], w, pu[r][t]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kReuseRows; ++r) {
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      ag[r][t] = fmaf(pg[r][t], sg, ag[r][t]);
      au[r][t] = fmaf(pu[r][t], su, au[r][t]);
    }
  }
}

template <int kT>
__device__ __forceinline__ void FinishReuseItem(const ReuseItem<kT>& it, int kvi,
                                                float ag[kReuseRows][kT],
                                                float au[kReuseRows][kT]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < kReuseRows; ++r) {
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      if (it.act[t] != nullptr) {
        const float g = WarpSum(ag[r][t]), v = WarpSum(au[r][t]);
        // expf (not __expf), as SiluMulF32.
        if (lane == r * kT + t) it.act[t][ActIndex(it.j0 + r, kvi)] = g / (1.0f + expf(-g)) * v;
      }
      ag[r][t] = au[r][t] = 0.0f;
    }
  }
}

// Before the PDL wait: a warp whose first item is a shared part's (items part major, the shared
// parts first in the table) prefetches that item's rows into L2 (a hint: no registers held,
// a wrong address costs bandwidth, never a result); the shared weights are never written and
// their addresses need no routing.
template <int kT>
__device__ NoPrefetchResult PrefetchSharedItem(MoeDecodeFusedFp8Params p) {
  const int H = p.hidden_size, groups = p.inter / kReuseRows;
  const int i = blockIdx.x * kReuseWarps + threadIdx.x / 32;
  if (i < p.shared_parts * groups) {
    const int u = i / groups, jg = i - u * groups;
    const int64_t row = int64_t{u} * p.inter + int64_t{jg} * kReuseRows;
    const int64_t up_row = int64_t{p.shared_parts} * p.inter + row;
    // Lane r < 2 * kReuseRows: gate row r, then up row r - kReuseRows.
    const int lane = threadIdx.x % 32;
    if (lane < 2 * kReuseRows) {
      const int64_t r = lane < kReuseRows ? row + lane : up_row + lane - kReuseRows;
      PrefetchL2(p.shared_gate_up + r * H, static_cast<uint32_t>(H));
    }
  }
  return {};
}

template <int kT>
__device__ void GateUpReuseBody(const NoPrefetchResult&, MoeDecodeFusedFp8Params p) {
  extern __shared__ float4 xs[];  // [kT][hidden_size / 4], SwizzledX4 order
  __shared__ PartTable<kT> tab;
  if (threadIdx.x < 32) BuildPartTable<kT>(p, &tab);
  __syncthreads();
  const int H = p.hidden_size, H4 = H / 4, kv = H / kVec, kvi = p.inter / kVec;
  const int lane = threadIdx.x % 32, groups = p.inter / kReuseRows, items = tab.count * groups;
  const int steps = (kv + 31) / 32, stride = gridDim.x * kReuseWarps;
  // The first item's first step is loaded before the hidden rows are staged.
  int i = blockIdx.x * kReuseWarps + threadIdx.x / 32;
  int u = i / groups, jg = i - u * groups;
  ReuseItem<kT> it;
  ReuseStep cur;
  if (i < items) {
    MakeReuseItem<kT>(tab, u, jg, H, &it);
    LoadReuseStep(it.gate, it.up, H, lane, kv, &cur);
  }
  const float4* hidden4 = reinterpret_cast<const float4*>(p.hidden);
  for (int c = threadIdx.x; c < kT * H4; c += kReuseThreads) {
    const int t = c / H4, c4 = c - t * H4;
    xs[t * H4 + SwizzledX4(c4 / 4, c4 % 4)] = __ldg(hidden4 + c);
  }
  __syncthreads();
  if (i >= items) return;
  float ag[kReuseRows][kT], au[kReuseRows][kT];
#pragma unroll
  for (int r = 0; r < kReuseRows; ++r) {
#pragma unroll
    for (int t = 0; t < kT; ++t) ag[r][t] = au[r][t] = 0.0f;
  }
  for (int n = 0;;) {
    // The step after (i, n): (i, n + 1), or step 0 of item i + stride (part u, row group jg).
    const int nn = n + 1 < steps ? n + 1 : 0;
    const uint8_t *gate = it.gate, *up = it.up;
    bool more = true;
    if (nn == 0) {
      i += stride;
      jg += stride;
      while (jg >= groups) {
        jg -= groups;
        ++u;
      }
      more = i < items;
      if (more) RowPointers<kT>(tab, u, jg, H, &gate, &up);
    }
    ReuseStep nxt;
    if (more) LoadReuseStep(gate, up, H, lane + 32 * nn, kv, &nxt);
    AccumulateReuseStep<kT>(cur, it, lane + 32 * n, kv, xs, H4, ag, au);
    if (nn == 0) {
      FinishReuseItem<kT>(it, kvi, ag, au);
      if (!more) break;
      MakeReuseItem<kT>(tab, u, jg, H, &it);
    }
    cur = nxt;
    n = nn;
  }
}

// ---- kRowReuse down: one block per kDownFeatures consecutive output features (a group),
// grid-strided; the parts' rows flattened into 16-weight chunks as DownBody's, thread i taking
// chunk i + n * kDownThreads at step n, its kDownFeatures rows' vectors multiplied with one read
// of the act values (ActIndex order: a warp's reads contiguous). The steps of a block's groups
// form one stream whose next step is loaded before the current one is summed.

struct DownReuseStep {
  uint4 w[kDownFeatures];
};

template <int kT>
__device__ __forceinline__ void LoadDownReuseStep(const PartTable<kT>& tab, int f0, int u, int v,
                                                  DownReuseStep* s) {
  if (u < tab.count) {
    const Fp8Part& q = tab.part[u];
    const uint8_t* row = q.down + int64_t{f0} * q.down_stride + kVec * v;
#pragma unroll
    for (int f = 0; f < kDownFeatures; ++f)
      s->w[f] = LoadStreaming16(row + int64_t{f} * q.down_stride);
  } else {
#pragma unroll
    for (int f = 0; f < kDownFeatures; ++f) s->w[f] = make_uint4(0, 0, 0, 0);
  }
}

template <int kT>
__device__ __forceinline__ void AccumulateDownReuseStep(const PartTable<kT>& tab,
                                                        const DownReuseStep& s, int f0, int u,
                                                        int v, int kvi,
                                                        float acc[kDownFeatures][kT]) {
  if (u >= tab.count) return;
  const Fp8Part& q = tab.part[u];
  const float sc = __ldg(q.dn_scales + (f0 / kFp8BlockSize) * int64_t{q.dn_scale_ld} +
                         (q.down_col0 + kVec * v) / kFp8BlockSize);
  float part[kDownFeatures][kT];
#pragma unroll
  for (int f = 0; f < kDownFeatures; ++f) {
#pragma unroll
    for (int t = 0; t < kT; ++t) part[f][t] = 0.0f;
  }
#pragma unroll
  for (int qq = 0; qq < 4; ++qq) {
    float4 x[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const float* a = tab.act[u][t];
      if (a != nullptr) x[t] = reinterpret_cast<const float4*>(a)[qq * kvi + v];
    }
#pragma unroll
    for (int f = 0; f < kDownFeatures; ++f) {
      float w[4];
      Fp8x4(Word(s.w[f], qq), w);
#pragma unroll
      for (int t = 0; t < kT; ++t) {
        if (tab.act[u][t] != nullptr) part[f][t] = Dot4(x[t], w, part[f][t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    const float c = tab.coef[u][t] * sc;
#pragma unroll
    for (int f = 0; f < kDownFeatures; ++f) acc[f][t] = fmaf(c, part[f][t], acc[f][t]);
  }
}

template <int kT>
__device__ void DownReuseBody(MoeDecodeFusedFp8Params p) {
  __shared__ PartTable<kT> tab;
  __shared__ float partial[kMaxDownFeatures][kDownWarps][kT];
  if (threadIdx.x < 32) BuildPartTable<kT>(p, &tab);
  __syncthreads();
  const int H = p.hidden_size, kvi = p.inter / kVec, total = tab.count * kvi;
  // At least one step, so that a block writes its features also when no part is left.
  const int groups = H / kDownFeatures, steps = max(1, (total + kDownThreads - 1) / kDownThreads);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int first = blockIdx.x, stride = gridDim.x;
  // Step 0's chunk of this thread: part u0, vector v0.
  const int u0 = threadIdx.x / kvi, v0 = threadIdx.x - u0 * kvi;
  int m = 0;  // groups done by this block
  if (first < groups) {
    int g = first, u = u0, v = v0;
    DownReuseStep cur;
    LoadDownReuseStep<kT>(tab, g * kDownFeatures, u, v, &cur);
    float acc[kDownFeatures][kT];
#pragma unroll
    for (int f = 0; f < kDownFeatures; ++f) {
#pragma unroll
      for (int t = 0; t < kT; ++t) acc[f][t] = 0.0f;
    }
    for (int n = 0;;) {
      const int nn = n + 1 < steps ? n + 1 : 0;
      int ng = g, nu = u0, nv = v0;
      if (nn > 0) {
        nu = u;
        nv = v + kDownThreads;
        while (nv >= kvi) {
          nv -= kvi;
          ++nu;
        }
      } else {
        ng = g + stride;
      }
      DownReuseStep nxt;
      if (ng < groups) LoadDownReuseStep<kT>(tab, ng * kDownFeatures, nu, nv, &nxt);
      AccumulateDownReuseStep<kT>(tab, cur, g * kDownFeatures, u, v, kvi, acc);
      if (nn == 0) {
#pragma unroll
        for (int f = 0; f < kDownFeatures; ++f) {
#pragma unroll
          for (int t = 0; t < kT; ++t) {
            const float sum = WarpSum(acc[f][t]);
            if (lane == 0) partial[m * kDownFeatures + f][warp][t] = sum;
            acc[f][t] = 0.0f;
          }
        }
        ++m;
        if (ng >= groups) break;
      }
      cur = nxt;
      g = ng;
      u = nu;
      v = nv;
      n = nn;
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < m * kDownFeatures * kT; c += kDownThreads) {
    const int mf = c / kT, t = c - mf * kT;
    const int mg = mf / kDownFeatures, f = mf - mg * kDownFeatures;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kDownWarps; ++w) sum += partial[mf][w][t];
    p.out[int64_t{t} * H + (first + int64_t{mg} * stride) * kDownFeatures + f] = sum;
  }
}

// The shared memory of an SM of the first device that asks (0 if the query fails), asked once:
// H200 and H100 give every SM the same, and the process's devices are of one model.
int SmemPerSm() {
  static const int bytes = [] {
    int device = 0, b = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&b, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) !=
            cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return b;
  }();
  return bytes;
}

// kRowReuse's down on as many blocks per SM as fit, at least enough that none has more than
// kMaxDownFeatures features.
template <int kT>
cudaError_t LaunchDownReuse(const MoeDecodeFusedFp8Params& p, int sms, cudaStream_t stream) {
  constexpr auto kDown = EntryKernel<DownReuseBody<kT>, kDownThreads>();
  static const int down_per_sm =
      BlocksPerSm(reinterpret_cast<const void*>(kDown), kDownThreads, /*fallback=*/4);
  const int64_t groups = p.hidden_size / kDownFeatures;
  int64_t down_blocks = BalancedUnits(groups, int64_t{sms} * down_per_sm);
  down_blocks = std::max<int64_t>(
      down_blocks, (groups * kDownFeatures + kMaxDownFeatures - 1) / kMaxDownFeatures);
  return LaunchAfterPrecedingGrids<DownReuseBody<kT>, kDownThreads>(
      dim3(static_cast<unsigned>(down_blocks)), 0, stream, p);
}

// As moe_decode_fused_fp8.cu's LaunchPerRow; gate_up with the hidden rows in dynamic shared
// memory (its blocks per SM also bounded by that); down kRowReuse's or the stationary one.
template <int kT>
cudaError_t LaunchPair(const MoeDecodeFusedFp8Params& p, bool stationary_down, cudaStream_t stream,
                       bool* launched) {
  constexpr auto kGateUp =
      PrefetchEntryKernel<PrefetchSharedItem<kT>, GateUpReuseBody<kT>, kReuseThreads>();
  constexpr int kMaxSmem = kT * kMoeDecodeFusedFp8MaxStagedHidden * static_cast<int>(sizeof(float));
  const KernelFacts facts =
      KernelFactsForCurrentDevice(reinterpret_cast<const void*>(kGateUp), kMaxSmem);
  if (facts.error != cudaSuccess) return facts.error;
  const int smem = kT * p.hidden_size * static_cast<int>(sizeof(float));
  *launched = facts.max_smem >= kMaxSmem;
  if (!*launched) return cudaSuccess;
  static const int gate_up_per_sm =
      BlocksPerSm(reinterpret_cast<const void*>(kGateUp), kReuseThreads, /*fallback=*/4);
  // Static shared memory (the part table) and the 1 KB per block the SM reserves, rounded up.
  const int per_block_smem = smem + static_cast<int>(sizeof(PartTable<kT>)) + 2048;
  const int fit_smem = SmemPerSm() > 0 ? std::max(1, SmemPerSm() / per_block_smem) : 1;
  const int gate_up_fit = std::min(gate_up_per_sm, fit_smem);
  const int64_t max_parts = int64_t{kT} * p.top_k + p.shared_parts;
  const int64_t gate_up_warps = BalancedUnits(max_parts * (p.inter / kReuseRows),
                                              int64_t{facts.sms} * gate_up_fit * kReuseWarps);
  const int64_t gate_up_blocks = (gate_up_warps + kReuseWarps - 1) / kReuseWarps;
  cudaError_t err = LaunchPrefetchThenAfterPrecedingGrids<PrefetchSharedItem<kT>,
                                                          GateUpReuseBody<kT>, kReuseThreads>(
      dim3(static_cast<unsigned>(gate_up_blocks)), static_cast<size_t>(smem), stream, p);
  if (err != cudaSuccess) return err;
  if (stationary_down && StationaryDownApplies(p))
    return LaunchStationaryDown(p, facts.sms, stream);
  return LaunchDownReuse<kT>(p, facts.sms, stream);
}

}  // namespace

cudaError_t LaunchRowReuse(const MoeDecodeFusedFp8Params& p, bool stationary_down,
                           cudaStream_t stream, bool* launched) {
  return p.num_tokens == 1 ? LaunchPair<1>(p, stationary_down, stream, launched)
                           : LaunchPair<2>(p, stationary_down, stream, launched);
}

cudaError_t LaunchRowReuseDown(const MoeDecodeFusedFp8Params& p, cudaStream_t stream) {
  int sms = 0;
  const cudaError_t err = CurrentDeviceSms(&sms);
  if (err != cudaSuccess) return err;
  return p.num_tokens == 1 ? LaunchDownReuse<1>(p, sms, stream)
                           : LaunchDownReuse<2>(p, sms, stream);
}

}  // namespace moe_fp8_internal
}  // namespace kernels
}  // namespace deepinfer
