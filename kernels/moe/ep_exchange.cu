// Device expert-parallel exchange (ep_exchange.h). Plain launches (full stream order, no PDL):
// the phases signal peers and must not overlap each other on one rank.
//
// Signals carry epochs: a rank keeps, per signal kind, the epoch it last received (control
// words 0..2). A sender signals epoch + 1 (its own count of that kind, which every rank advances
// in lock-step); the receiver waits until each source's signal reaches it, then stores it. So
// no signal is ever reset and a captured graph replays with advancing epochs.
// Multi-block senders signal from the last block to finish (a ticket counter), after every
// block fenced its peer writes at system scope.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/moe/ep_exchange.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kPlanThreads = 1024;  // == kMaxEpSlots: one scan element per thread
constexpr int kRowThreads = 256;
constexpr int kMaxTopK = 16;

// Control words in the scratch.
constexpr int kEpochCounts = 0;
constexpr int kEpochRows = 1;
constexpr int kEpochComb = 2;
constexpr int kError = 3;
constexpr int kTicketRows = 4;
constexpr int kTicketComb = 5;
constexpr int kTicketCombRecv = 6;
constexpr int kReceived = 8;
constexpr int kPairs = 9;

int64_t Align(int64_t x) { return (x + 255) / 256 * 256; }

template <typename T>
__device__ __forceinline__ T* At(char* base, int64_t offset) {
  return reinterpret_cast<T*>(base + offset);
}

__device__ __forceinline__ void StoreRelease(int32_t* p, int32_t v) {
  asm volatile("st.release.sys.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ int32_t LoadAcquire(const int32_t* p) {
  int32_t v;
  asm volatile("ld.acquire.sys.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Spins until *flag reaches epoch (wrapping compare); on timeout sets kEpErrorTimeout.
__device__ void WaitForEpoch(const int32_t* flag, int32_t epoch, int32_t* control) {
  const uint64_t start = GlobalTimerNs();
  while (static_cast<int32_t>(LoadAcquire(flag) - epoch) < 0) {
    if (GlobalTimerNs() - start > static_cast<uint64_t>(kEpWaitTimeoutNs)) {
      atomicOr(&control[kError], kEpErrorTimeout);
      return;
    }
  }
}

__device__ __forceinline__ void CopyRow(const float* src, float* dst, int32_t hidden) {
  const float4* s = reinterpret_cast<const float4*>(src);
  float4* d = reinterpret_cast<float4*>(dst);
  for (int32_t i = threadIdx.x; i < hidden / 4; i += blockDim.x) d[i] = s[i];
}

// Every block calls this once at its end; the last block to arrive gets true (and resets the
// ticket). The block's writes before it are fenced at system scope.
__device__ bool LastBlock(int32_t* ticket) {
  __shared__ bool last;
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(ticket, 1) == static_cast<int32_t>(gridDim.x) - 1;
    if (last) {
      *ticket = 0;
      __threadfence_system();
    }
  }
  __syncthreads();
  return last;
}

// Inclusive block scan of v over kPlanThreads threads (shared `buf` of kPlanThreads).
__device__ int32_t BlockInclusiveScan(int32_t v, int32_t* buf) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int off = 1; off < kPlanThreads; off <<= 1) {
    const int32_t add = threadIdx.x >= off ? buf[threadIdx.x - off] : 0;
    __syncthreads();
    buf[threadIdx.x] += add;
    __syncthreads();
  }
  const int32_t out = buf[threadIdx.x];
  __syncthreads();
  return out;
}

// Orders this rank's (token, k) pairs by (slot, token): send position = slot's exclusive prefix +
// index within the slot. Low latency: a pair beyond its destination's capacity is not sent.
__global__ void __launch_bounds__(kPlanThreads)
    PlanKernel(EpExchangeConfig cfg, EpLayout L, EpMode mode, EpRankView v, int32_t num_tokens,
               const int32_t* topk_ids, const int32_t* topk_slots) {
  __shared__ int32_t count[kMaxEpSlots];
  __shared__ int32_t scan[kPlanThreads];
  char* s = v.scratch;
  int32_t* control = At<int32_t>(s, L.control);
  int32_t* pair_slot = At<int32_t>(s, L.pair_slot);
  int32_t* pair_sp = At<int32_t>(s, L.pair_sp);
  const int32_t P = cfg.world * cfg.slots_per_rank;
  const int32_t n = num_tokens * cfg.top_k;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int32_t j = threadIdx.x; j < P; j += kPlanThreads) count[j] = 0;
  if (threadIdx.x == 0) control[kPairs] = n;
  __syncthreads();
  for (int32_t base = 0; base < n; base += kPlanThreads) {
    const int32_t i = base + threadIdx.x;
    int32_t slot = -1;
    if (i < n) {
      const int32_t id = topk_slots != nullptr ? topk_slots[i] : topk_ids[i];
      if (id >= 0 && id < P) {
        slot = id;
      } else {
        atomicOr(&control[kError], kEpErrorBadId);
      }
    }
    const unsigned same = __match_any_sync(0xffffffffu, slot);
    const int32_t before = __popc(same & ((1u << lane) - 1));
    int32_t pos = -1;
    for (int w = 0; w < kPlanThreads / 32; ++w) {
      if (warp == w && slot >= 0) pos = count[slot] + before;
      __syncwarp();
      if (warp == w && slot >= 0 && before == 0) count[slot] += __popc(same);
      __syncthreads();
    }
    if (i < n) {
      pair_slot[i] = slot;
      pair_sp[i] = pos;  // index within the slot for now
    }
  }
  const int32_t mine = threadIdx.x < P ? count[threadIdx.x] : 0;
  const int32_t excl = BlockInclusiveScan(mine, scan) - mine;
  if (threadIdx.x < P) {
    At<int32_t>(s, L.slot_count)[threadIdx.x] = mine;
    At<int32_t>(s, L.slot_excl)[threadIdx.x] = excl;
    count[threadIdx.x] = excl;  // reused: exclusive prefix
  }
  __syncthreads();
  for (int32_t i = threadIdx.x; i < n; i += kPlanThreads) {
    const int32_t slot = pair_slot[i];
    if (slot < 0) {
      pair_sp[i] = -1;
      continue;
    }
    int32_t sp = count[slot] + pair_sp[i];
    if (mode == EpMode::kLowLatency) {
      const int32_t d = slot / cfg.slots_per_rank;
      if (sp - count[d * cfg.slots_per_rank] >= cfg.ll_capacity) {
        sp = -1;
        atomicOr(&control[kError], kEpErrorOverflow);
      }
    }
    pair_sp[i] = sp;
  }
}

// Low latency: one block per pair copies its row into the destination's region for this
// source; block 0 also sends the per-slot counts; the last block signals.
__global__ void __launch_bounds__(kRowThreads)
    LowLatencySendKernel(EpExchangeConfig cfg, EpLayout L, EpRankView v, const float* hidden) {
  char* s = v.scratch;
  int32_t* control = At<int32_t>(s, L.control);
  const int32_t* slot_excl = At<int32_t>(s, L.slot_excl);
  const int32_t n = control[kPairs];
  const int32_t me = v.rank, per = cfg.slots_per_rank;
  const int32_t i = blockIdx.x;
  if (i < n) {
    const int32_t sp = At<int32_t>(s, L.pair_sp)[i];
    if (sp >= 0) {
      const int32_t d = At<int32_t>(s, L.pair_slot)[i] / per;
      const int64_t idx = sp - slot_excl[d * per];
      float* dst = At<float>(v.window[d], L.disp_rows) +
                   (static_cast<int64_t>(me) * cfg.ll_capacity + idx) * cfg.hidden;
      CopyRow(hidden + static_cast<int64_t>(i / cfg.top_k) * cfg.hidden, dst, cfg.hidden);
    }
  }
  if (blockIdx.x == 0) {
    const int32_t* slot_count = At<int32_t>(s, L.slot_count);
    for (int32_t j = threadIdx.x; j < cfg.world * per; j += blockDim.x) {
      At<int32_t>(v.window[j / per], L.ll_counts)[me * per + j % per] = slot_count[j];
    }
    for (int32_t d = threadIdx.x; d < cfg.world; d += blockDim.x) {
      At<int32_t>(v.window[d], L.ll_start)[me] = slot_excl[d * per];
    }
  }
  if (LastBlock(&control[kTicketRows]) && threadIdx.x == 0) {
    const int32_t epoch = control[kEpochRows] + 1;
    for (int32_t d = 0; d < cfg.world; ++d) {
      StoreRelease(At<int32_t>(v.window[d], L.sig_rows) + me, epoch);
    }
  }
}

// Low latency receive, one block: waits for every source, then the regrouping tables: source s's
// rows of slot l sit at [src_off[s][l], src_off[s][l+1]) of its region (clamped to the
// capacity) and go to grouped rows from grp_base[s][l]; slots in order, sources in order within.
__global__ void __launch_bounds__(kPlanThreads)
    LowLatencyRecvPlanKernel(EpExchangeConfig cfg, EpLayout L, EpRankView v) {
  __shared__ int32_t column[kMaxEpSlots];
  char* s = v.scratch;
  char* win = v.window[v.rank];
  int32_t* control = At<int32_t>(s, L.control);
  const int32_t per = cfg.slots_per_rank, cap = cfg.ll_capacity;
  const int32_t epoch = control[kEpochRows] + 1;
  if (threadIdx.x < cfg.world) {
    WaitForEpoch(At<int32_t>(win, L.sig_rows) + threadIdx.x, epoch, control);
  }
  __syncthreads();
  const int32_t* counts = At<int32_t>(win, L.ll_counts);
  int32_t* src_off = At<int32_t>(s, L.src_off);
  if (threadIdx.x < cfg.world) {
    const int32_t src = threadIdx.x;
    int64_t acc = 0;
    for (int32_t l = 0; l < per; ++l) {
      src_off[src * (per + 1) + l] = static_cast<int32_t>(acc < cap ? acc : cap);
      acc += counts[src * per + l];
    }
    src_off[src * (per + 1) + per] = static_cast<int32_t>(acc < cap ? acc : cap);
    if (acc > cap) atomicOr(&control[kError], kEpErrorOverflow);
  }
  __syncthreads();
  for (int32_t l = threadIdx.x; l < per; l += blockDim.x) {
    int32_t sum = 0;
    for (int32_t src = 0; src < cfg.world; ++src) {
      sum += src_off[src * (per + 1) + l + 1] - src_off[src * (per + 1) + l];
    }
    column[l] = sum;
  }
  __syncthreads();
  const int32_t mine = threadIdx.x < per ? column[threadIdx.x] : 0;
  __shared__ int32_t scan[kPlanThreads];
  const int32_t incl = BlockInclusiveScan(mine, scan);
  int32_t* offsets = At<int32_t>(s, L.slot_offsets);
  if (threadIdx.x < per) {
    offsets[threadIdx.x] = incl - mine;
    if (threadIdx.x == per - 1) {
      offsets[per] = incl;
      control[kReceived] = incl;
    }
    int32_t base = incl - mine;
    const int32_t l = threadIdx.x;
    for (int32_t src = 0; src < cfg.world; ++src) {
      At<int32_t>(s, L.grp_base)[src * per + l] = base;
      base += src_off[src * (per + 1) + l + 1] - src_off[src * (per + 1) + l];
    }
  }
  if (threadIdx.x == 0) control[kEpochRows] = epoch;
}

// Low latency regrouping: one block per (source, row of its region).
__global__ void __launch_bounds__(kRowThreads)
    LowLatencyGroupKernel(EpExchangeConfig cfg, EpLayout L, EpRankView v) {
  char* s = v.scratch;
  char* win = v.window[v.rank];
  const int32_t per = cfg.slots_per_rank, cap = cfg.ll_capacity;
  const int32_t src = blockIdx.x / cap, idx = blockIdx.x % cap;
  const int32_t* off = At<int32_t>(s, L.src_off) + src * (per + 1);
  if (idx >= off[per]) return;
  // The slot l with off[l] <= idx < off[l + 1] (the last such l: empty slots repeat offsets).
  int32_t lo = 0, hi = per - 1;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (off[mid] <= idx) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int32_t g = At<int32_t>(s, L.grp_base)[src * per + lo] + (idx - off[lo]);
  CopyRow(At<float>(win, L.disp_rows) + (static_cast<int64_t>(src) * cap + idx) * cfg.hidden,
          At<float>(s, L.grouped) + static_cast<int64_t>(g) * cfg.hidden, cfg.hidden);
  if (threadIdx.x == 0) {
    At<int32_t>(s, L.recv_origin)[g] = (src << 24) | (At<int32_t>(win, L.ll_start)[src] + idx);
  }
}

// Throughput phase 1: this rank's slot counts to every rank.
__global__ void __launch_bounds__(kPlanThreads)
    CountsSendKernel(EpExchangeConfig cfg, EpLayout L, EpRankView v) {
  char* s = v.scratch;
  int32_t* control = At<int32_t>(s, L.control);
  const int32_t P = cfg.world * cfg.slots_per_rank;
  const int32_t* slot_count = At<int32_t>(s, L.slot_count);
  for (int32_t j = threadIdx.x; j < P; j += blockDim.x) {
    for (int32_t d = 0; d < cfg.world; ++d) {
      At<int32_t>(v.window[d], L.all_counts)[v.rank * P + j] = slot_count[j];
    }
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int32_t epoch = control[kEpochCounts] + 1;
    for (int32_t d = 0; d < cfg.world; ++d) {
      StoreRelease(At<int32_t>(v.window[d], L.sig_counts) + v.rank, epoch);
    }
  }
}

// Throughput phase 2 plan, one block: waits for every rank's counts; a slot's rows from this
// rank start at its receiver at (rows of the receiver's earlier slots from all ranks) + (rows
// of this slot from lower ranks).
__global__ void __launch_bounds__(kPlanThreads)
    ThroughputRowsPlanKernel(EpExchangeConfig cfg, EpLayout L, EpRankView v) {
  __shared__ int32_t scan[kPlanThreads];
  __shared__ int32_t incl_all[kMaxEpSlots];
  char* s = v.scratch;
  char* win = v.window[v.rank];
  int32_t* control = At<int32_t>(s, L.control);
  const int32_t P = cfg.world * cfg.slots_per_rank, per = cfg.slots_per_rank;
  const int32_t epoch = control[kEpochCounts] + 1;
  if (threadIdx.x < cfg.world) {
    WaitForEpoch(At<int32_t>(win, L.sig_counts) + threadIdx.x, epoch, control);
  }
  __syncthreads();
  const int32_t* all = At<int32_t>(win, L.all_counts);
  int32_t column = 0, lower = 0;
  if (threadIdx.x < P) {
    for (int32_t src = 0; src < cfg.world; ++src) {
      const int32_t c = all[src * P + threadIdx.x];
      column += c;
      if (src < v.rank) lower += c;
    }
  }
  const int32_t incl = BlockInclusiveScan(column, scan);
  if (threadIdx.x < P) incl_all[threadIdx.x] = incl;
  __syncthreads();
  if (threadIdx.x < P) {
    const int32_t d = threadIdx.x / per;
    const int32_t dest_first = d == 0 ? 0 : incl_all[d * per - 1];
    At<int32_t>(s, L.tp_base)[threadIdx.x] = incl - column - dest_first + lower;
    if (threadIdx.x % per == per - 1 && incl - dest_first > cfg.tp_capacity) {
      atomicOr(&control[kError], kEpErrorOverflow);
    }
  }
  if (threadIdx.x == 0) control[kEpochCounts] = epoch;
}

// Throughput phase 2 rows: one block per pair writes its row at its grouped row on the receiver
// (or drops it beyond the capacity); the last block signals.
__global__ void __launch_bounds__(kRowThreads)
    ThroughputRowsKernel(EpExchangeConfig cfg, EpLayout L, EpRankView v, const float* hidden) {
  char* s = v.scratch;
  int32_t* control = At<int32_t>(s, L.control);
  const int32_t n = control[kPairs];
  const int32_t i = blockIdx.x;
  if (i < n) {
    int32_t* pair_sp = At<int32_t>(s, L.pair_sp);
    const int32_t sp = pair_sp[i];
    if (sp >= 0) {
      const int32_t slot = At<int32_t>(s, L.pair_slot)[i];
      const int32_t d = slot / cfg.slots_per_rank;
      const int32_t pos =
          At<int32_t>(s, L.tp_base)[slot] + (sp - At<int32_t>(s, L.slot_excl)[slot]);
      if (pos < cfg.tp_capacity) {
        CopyRow(hidden + static_cast<int64_t>(i / cfg.top_k) * cfg.hidden,
                At<float>(v.window[d], L.disp_rows) + static_cast<int64_t>(pos) * cfg.hidden,
                cfg.hidden);
        if (threadIdx.x == 0) At<int32_t>(v.window[d], L.tp_origin)[pos] = (v.rank << 24) | sp;
      } else {
        __syncthreads();  // every thread has read pair_sp[i]
        if (threadIdx.x == 0) {
          pair_sp[i] = -1;
          atomicOr(&control[kError], kEpErrorOverflow);
        }
      }
    }
  }
  if (LastBlock(&control[kTicketRows]) && threadIdx.x == 0) {
    const int32_t epoch = control[kEpochRows] + 1;
    for (int32_t d = 0; d < cfg.world; ++d) {
      StoreRelease(At<int32_t>(v.window[d], L.sig_rows) + v.rank, epoch);
    }
  }
}

// Throughput receive, one block: waits for every rank's rows; offsets from the counts (clamped to
// the capacity) and the origins of the rows.
__global__ void __launch_bounds__(kPlanThreads)
    ThroughputRecvKernel(EpExchangeConfig cfg, EpLayout L, EpRankView v) {
  __shared__ int32_t scan[kPlanThreads];
  char* s = v.scratch;
  char* win = v.window[v.rank];
  int32_t* control = At<int32_t>(s, L.control);
  const int32_t P = cfg.world * cfg.slots_per_rank, per = cfg.slots_per_rank;
  const int32_t epoch = control[kEpochRows] + 1;
  if (threadIdx.x < cfg.world) {
    WaitForEpoch(At<int32_t>(win, L.sig_rows) + threadIdx.x, epoch, control);
  }
  __syncthreads();
  const int32_t* all = At<int32_t>(win, L.all_counts);
  int32_t column = 0;
  if (threadIdx.x < per) {
    for (int32_t src = 0; src < cfg.world; ++src) {
      column += all[src * P + v.rank * per + threadIdx.x];
    }
  }
  const int32_t incl = BlockInclusiveScan(column, scan);
  int32_t* offsets = At<int32_t>(s, L.slot_offsets);
  const int32_t cap = cfg.tp_capacity;
  if (threadIdx.x < per) {
    offsets[threadIdx.x] = min(incl - column, cap);
    if (threadIdx.x == per - 1) {
      offsets[per] = min(incl, cap);
      control[kReceived] = min(incl, cap);
      if (incl > cap) atomicOr(&control[kError], kEpErrorOverflow);
    }
  }
  __syncthreads();
  const int32_t received = control[kReceived];
  for (int32_t g = threadIdx.x; g < received; g += blockDim.x) {
    At<int32_t>(s, L.recv_origin)[g] = At<int32_t>(win, L.tp_origin)[g];
  }
  if (threadIdx.x == 0) control[kEpochRows] = epoch;
}

// Combine send: one block per received row sends the expert output back to its source at the
// row's send position; the last block signals every rank.
__global__ void __launch_bounds__(kRowThreads)
    CombineSendKernel(EpExchangeConfig cfg, EpLayout L, EpRankView v, const float* expert_out) {
  char* s = v.scratch;
  int32_t* control = At<int32_t>(s, L.control);
  const int32_t g = blockIdx.x;
  if (g < control[kReceived]) {
    const int32_t origin = At<int32_t>(s, L.recv_origin)[g];
    const int32_t src = origin >> 24, sp = origin & 0xffffff;
    CopyRow(expert_out + static_cast<int64_t>(g) * cfg.hidden,
            At<float>(v.window[src], L.comb_rows) + static_cast<int64_t>(sp) * cfg.hidden,
            cfg.hidden);
  }
  if (LastBlock(&control[kTicketComb]) && threadIdx.x == 0) {
    const int32_t epoch = control[kEpochComb] + 1;
    for (int32_t d = 0; d < cfg.world; ++d) {
      StoreRelease(At<int32_t>(v.window[d], L.sig_comb) + v.rank, epoch);
    }
  }
}

// Combine receive: one block per token waits for every rank, then adds the token's choices in
// ascending expert id (ties in k order).
__global__ void __launch_bounds__(kRowThreads)
    CombineRecvKernel(EpExchangeConfig cfg, EpLayout L, EpRankView v, int32_t num_tokens,
                      const int32_t* topk_ids, const float* topk_weights, float* out) {
  char* s = v.scratch;
  char* win = v.window[v.rank];
  int32_t* control = At<int32_t>(s, L.control);
  const int32_t epoch = control[kEpochComb] + 1;
  if (threadIdx.x < cfg.world) {
    WaitForEpoch(At<int32_t>(win, L.sig_comb) + threadIdx.x, epoch, control);
  }
  __syncthreads();
  const int32_t t = blockIdx.x;
  if (t < num_tokens) {
    const int32_t K = cfg.top_k;
    int32_t id[kMaxTopK], sp[kMaxTopK];
    float w[kMaxTopK];
    for (int32_t k = 0; k < K; ++k) {
      // Insertion by (id, k): stable for equal ids.
      int32_t e = topk_ids[t * K + k], p = At<int32_t>(s, L.pair_sp)[t * K + k];
      float wk = topk_weights[t * K + k];
      int32_t j = k;
      while (j > 0 && id[j - 1] > e) {
        id[j] = id[j - 1];
        sp[j] = sp[j - 1];
        w[j] = w[j - 1];
        --j;
      }
      id[j] = e;
      sp[j] = p;
      w[j] = wk;
    }
    const float* rows = At<float>(win, L.comb_rows);
    float* o = out + static_cast<int64_t>(t) * cfg.hidden;
    for (int32_t h = threadIdx.x; h < cfg.hidden; h += blockDim.x) {
      float acc = o[h];
      for (int32_t k = 0; k < K; ++k) {
        if (sp[k] >= 0)
          acc = __fmaf_rn(w[k], rows[static_cast<int64_t>(sp[k]) * cfg.hidden + h], acc);
      }
      o[h] = acc;
    }
  }
  if (LastBlock(&control[kTicketCombRecv]) && threadIdx.x == 0) control[kEpochComb] = epoch;
}

__global__ void ChooseSlotsKernel(int32_t n, int32_t top_k, int32_t num_experts, int32_t rank,
                                  const int32_t* topk_ids, const int32_t* replica_start,
                                  const int32_t* replicas, int32_t* topk_slots) {
  const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t e = topk_ids[i];
  if (e < 0 || e >= num_experts) {
    topk_slots[i] = -1;
    return;
  }
  const int32_t first = replica_start[e], count = replica_start[e + 1] - first;
  const int64_t t = i / top_k;
  topk_slots[i] = count > 0 ? replicas[first + (t + rank + e) % count] : -1;
}

__global__ void RowSlotsKernel(EpExchangeConfig cfg, EpLayout L, EpRankView v, int32_t* row_slot) {
  const int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (g >= L.max_received) return;
  const int32_t* off = At<int32_t>(v.scratch, L.slot_offsets);
  const int32_t per = cfg.slots_per_rank;
  if (g >= off[per]) {
    row_slot[g] = -1;
    return;
  }
  int32_t lo = 0, hi = per - 1;  // the last l with off[l] <= g
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (off[mid] <= g) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  row_slot[g] = lo;
}

}  // namespace

cudaError_t EpRowSlots(const EpExchangeConfig& cfg, const EpRankView& view, int32_t* row_slot,
                       cudaStream_t stream) {
  if (!EpConfigValid(cfg, nullptr)) return cudaErrorInvalidValue;
  const EpLayout L = EpLayoutOf(cfg);
  RowSlotsKernel<<<static_cast<unsigned>((L.max_received + 255) / 256), 256, 0, stream>>>(
      cfg, L, view, row_slot);
  return cudaGetLastError();
}

cudaError_t EpChooseSlots(int32_t num_tokens, int32_t top_k, int32_t num_experts, int32_t rank,
                          const int32_t* topk_ids, const int32_t* replica_start,
                          const int32_t* replicas, int32_t* topk_slots, cudaStream_t stream) {
  const int32_t n = num_tokens * top_k;
  if (n <= 0) return cudaSuccess;
  ChooseSlotsKernel<<<(n + 255) / 256, 256, 0, stream>>>(n, top_k, num_experts, rank, topk_ids,
                                                         replica_start, replicas, topk_slots);
  return cudaGetLastError();
}

bool EpConfigValid(const EpExchangeConfig& cfg, const char** why) {
  const char* w = nullptr;
  if (cfg.world < 1 || cfg.world > kMaxEpRanks) {
    w = "world must be 1..kMaxEpRanks";
  } else if (cfg.slots_per_rank < 1 ||
             static_cast<int64_t>(cfg.world) * cfg.slots_per_rank > kMaxEpSlots) {
    w = "world * slots_per_rank must be 1..kMaxEpSlots";
  } else if (cfg.top_k < 1 || cfg.top_k > kMaxTopK) {
    w = "top_k must be 1..16";
  } else if (cfg.max_tokens < 1 ||
             static_cast<int64_t>(cfg.max_tokens) * cfg.top_k >= (int64_t{1} << 24)) {
    w = "max_tokens * top_k must be 1..2^24-1";
  } else if (cfg.hidden < 4 || cfg.hidden % 4 != 0) {
    w = "hidden must be a positive multiple of 4";
  } else if (cfg.ll_capacity < 1 ||
             cfg.ll_capacity > static_cast<int64_t>(cfg.max_tokens) * cfg.top_k) {
    w = "ll_capacity must be 1..max_tokens * top_k";
  } else if (cfg.tp_capacity < 1 || cfg.tp_capacity >= (1 << 30)) {
    w = "tp_capacity must be 1..2^30-1";
  }
  if (why != nullptr) *why = w;
  return w == nullptr;
}

EpLayout EpLayoutOf(const EpExchangeConfig& cfg) {
  EpLayout L;
  const int64_t W = cfg.world, per = cfg.slots_per_rank, P = W * per, H = cfg.hidden;
  const int64_t pairs = static_cast<int64_t>(cfg.max_tokens) * cfg.top_k;
  const int64_t ll_rows = W * cfg.ll_capacity;
  L.max_received = ll_rows > cfg.tp_capacity ? ll_rows : cfg.tp_capacity;
  int64_t at = 0;
  auto take = [&at](int64_t bytes) {
    const int64_t here = at;
    at = Align(at + bytes);
    return here;
  };
  L.sig_counts = take(W * 4);
  L.sig_rows = take(W * 4);
  L.sig_comb = take(W * 4);
  L.ll_counts = take(W * per * 4);
  L.ll_start = take(W * 4);
  L.all_counts = take(W * P * 4);
  L.tp_origin = take(int64_t{cfg.tp_capacity} * 4);
  L.disp_rows = take(L.max_received * H * 4);
  L.comb_rows = take(pairs * H * 4);
  L.window_bytes = at;
  at = 0;
  L.control = take(16 * 4);
  L.pair_slot = take(pairs * 4);
  L.pair_sp = take(pairs * 4);
  L.slot_count = take(P * 4);
  L.slot_excl = take(P * 4);
  L.tp_base = take(P * 4);
  L.src_off = take(W * (per + 1) * 4);
  L.grp_base = take(W * per * 4);
  L.slot_offsets = take((per + 1) * 4);
  L.recv_origin = take(L.max_received * 4);
  L.grouped = take(ll_rows * H * 4);
  L.scratch_bytes = at;
  return L;
}

cudaError_t EpInitBuffers(const EpExchangeConfig& cfg, const EpRankView& view,
                          cudaStream_t stream) {
  if (!EpConfigValid(cfg, nullptr)) return cudaErrorInvalidValue;
  const EpLayout L = EpLayoutOf(cfg);
  cudaError_t e = cudaMemsetAsync(view.window[view.rank], 0, L.window_bytes, stream);
  if (e != cudaSuccess) return e;
  return cudaMemsetAsync(view.scratch, 0, L.scratch_bytes, stream);
}

cudaError_t EpDispatchSend(const EpExchangeConfig& cfg, EpMode mode, const EpRankView& view,
                           int32_t num_tokens, const float* hidden, const int32_t* topk_ids,
                           const int32_t* topk_slots, cudaStream_t stream) {
  if (!EpConfigValid(cfg, nullptr) || num_tokens < 0 || num_tokens > cfg.max_tokens) {
    return cudaErrorInvalidValue;
  }
  const EpLayout L = EpLayoutOf(cfg);
  PlanKernel<<<1, kPlanThreads, 0, stream>>>(cfg, L, mode, view, num_tokens, topk_ids, topk_slots);
  if (mode == EpMode::kLowLatency) {
    const unsigned blocks = num_tokens * cfg.top_k > 0 ? num_tokens * cfg.top_k : 1;
    LowLatencySendKernel<<<blocks, kRowThreads, 0, stream>>>(cfg, L, view, hidden);
  } else {
    CountsSendKernel<<<1, kPlanThreads, 0, stream>>>(cfg, L, view);
  }
  return cudaGetLastError();
}

cudaError_t EpDispatchRows(const EpExchangeConfig& cfg, EpMode mode, const EpRankView& view,
                           int32_t num_tokens, const float* hidden, cudaStream_t stream) {
  if (!EpConfigValid(cfg, nullptr) || num_tokens < 0 || num_tokens > cfg.max_tokens) {
    return cudaErrorInvalidValue;
  }
  if (mode == EpMode::kLowLatency) return cudaSuccess;
  const EpLayout L = EpLayoutOf(cfg);
  ThroughputRowsPlanKernel<<<1, kPlanThreads, 0, stream>>>(cfg, L, view);
  const unsigned blocks = num_tokens * cfg.top_k > 0 ? num_tokens * cfg.top_k : 1;
  ThroughputRowsKernel<<<blocks, kRowThreads, 0, stream>>>(cfg, L, view, hidden);
  return cudaGetLastError();
}

cudaError_t EpDispatchRecv(const EpExchangeConfig& cfg, EpMode mode, const EpRankView& view,
                           cudaStream_t stream) {
  if (!EpConfigValid(cfg, nullptr)) return cudaErrorInvalidValue;
  const EpLayout L = EpLayoutOf(cfg);
  if (mode == EpMode::kLowLatency) {
    LowLatencyRecvPlanKernel<<<1, kPlanThreads, 0, stream>>>(cfg, L, view);
    LowLatencyGroupKernel<<<cfg.world * cfg.ll_capacity, kRowThreads, 0, stream>>>(cfg, L, view);
  } else {
    ThroughputRecvKernel<<<1, kPlanThreads, 0, stream>>>(cfg, L, view);
  }
  return cudaGetLastError();
}

cudaError_t EpCombineSend(const EpExchangeConfig& cfg, const EpRankView& view,
                          const float* expert_out, cudaStream_t stream) {
  if (!EpConfigValid(cfg, nullptr)) return cudaErrorInvalidValue;
  const EpLayout L = EpLayoutOf(cfg);
  CombineSendKernel<<<static_cast<unsigned>(L.max_received), kRowThreads, 0, stream>>>(cfg, L, view,
                                                                                       expert_out);
  return cudaGetLastError();
}

cudaError_t EpCombineRecv(const EpExchangeConfig& cfg, const EpRankView& view, int32_t num_tokens,
                          const int32_t* topk_ids, const float* topk_weights, float* out,
                          cudaStream_t stream) {
  if (!EpConfigValid(cfg, nullptr) || num_tokens < 0 || num_tokens > cfg.max_tokens) {
    return cudaErrorInvalidValue;
  }
  const EpLayout L = EpLayoutOf(cfg);
  const unsigned blocks = num_tokens > 0 ? num_tokens : 1;
  CombineRecvKernel<<<blocks, kRowThreads, 0, stream>>>(cfg, L, view, num_tokens, topk_ids,
                                                        topk_weights, out);
  return cudaGetLastError();
}

const float* EpReceivedRows(const EpExchangeConfig& cfg, EpMode mode, const EpRankView& view) {
  const EpLayout L = EpLayoutOf(cfg);
  if (mode == EpMode::kLowLatency) return reinterpret_cast<const float*>(view.scratch + L.grouped);
  return reinterpret_cast<const float*>(view.window[view.rank] + L.disp_rows);
}

const int32_t* EpSlotOffsets(const EpExchangeConfig& cfg, const EpRankView& view) {
  return reinterpret_cast<const int32_t*>(view.scratch + EpLayoutOf(cfg).slot_offsets);
}

int32_t* EpErrorWord(const EpExchangeConfig& cfg, const EpRankView& view) {
  return reinterpret_cast<int32_t*>(view.scratch + EpLayoutOf(cfg).control) + kError;
}

cudaError_t EpClearError(const EpExchangeConfig& cfg, const EpRankView& view, cudaStream_t stream) {
  return cudaMemsetAsync(EpErrorWord(cfg, view), 0, sizeof(int32_t), stream);
}

}  // namespace kernels
}  // namespace deepinfer
