// SinkAttentionF32: the kernel choice, the split count, the launches, the CUDA-core kernel and
// the split combine, and the compact bf16 copy of the entries (SinkAttentionEntriesToBf16). The
// tensor-core kernels are sink_attention_mma.cuh and sink_attention_prefill.cuh, compiled here.
//
// CUDA-core kernel (CoreBody): one block of 8 warps per (token, 16 heads, split). Q of the 16
// heads sits in shared memory; the token's rows go through in tiles of 32 (rows padded to dim + 1
// floats, so that lane r reading row r's element d and lanes reading consecutive elements of one
// row are both free of bank conflicts). Warp w owns heads 2w and 2w + 1: lane r scores row r of
// the tile for both (fp32 FMA over the dim), the warp runs the online softmax, and then each lane
// accumulates output columns lane + 32 j of both heads over the tile's rows, the probabilities
// broadcast by shuffles.
//
// Splits (FlashDecoding): each block of a split writes its unnormalised output and its running
// (max, sum) in log2 units to the workspace; CombineBody merges a (token, head)'s splits:
//   out = sum_s 2^(m_s - M) O_s / sum_s 2^(m_s - M) l_s,  M = max_s m_s
// (the sink entered split 0's running state, see StartState).
#include <cuda_bf16.h>
#include <math.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/common/kernel_facts.h"
#include "kernels/common/launch.cuh"
#include "kernels/v4/sink_attention.h"
#include "kernels/v4/sink_attention_mma.cuh"
#include "kernels/v4/sink_attention_prefill.cuh"
#include "kernels/v4/sink_attention_rows.cuh"

namespace deepinfer {
namespace kernels {
namespace sink {

constexpr int kCoreThreads = 256;
constexpr int kCoreWarps = kCoreThreads / 32;
constexpr int kCoreHeads = 2 * kCoreWarps;
constexpr int kCoreRows = 32;  // a lane per row

size_t CoreSmemBytes(int64_t dim) {
  return (static_cast<size_t>(kCoreHeads) * dim + static_cast<size_t>(kCoreRows) * (dim + 1)) *
             sizeof(float) +
         16;
}

__device__ __forceinline__ float WarpMax(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float WarpSum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// kCols: output columns per lane and head (dim <= 32 * kCols).
template <int kCols>
__device__ void CoreBody(SinkAttentionParams p, int32_t num_splits) {
  extern __shared__ __align__(16) unsigned char sink_smem[];
  const int dim = static_cast<int>(p.dim), ld = dim + 1;
  float* qs = reinterpret_cast<float*>(sink_smem);
  float* ks = qs + kCoreHeads * dim;
  int32_t* scratch = reinterpret_cast<int32_t*>(ks + kCoreRows * ld);

  const int64_t t = blockIdx.x, h0 = static_cast<int64_t>(blockIdx.y) * kCoreHeads;
  const int split = blockIdx.z;
  const TokenRows rows = LoadTokenRows(p, t, scratch);
  int32_t begin, end;
  SplitRows<kCoreRows>(rows.count, split, num_splits, &begin, &end);
  for (int i = threadIdx.x; i < kCoreHeads * dim; i += kCoreThreads) {
    const int hl = i / dim;
    const int64_t h = h0 + hl;
    qs[i] = h < p.heads ? p.q[(t * p.heads + h) * dim + (i - hl * dim)] : 0.0f;
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* q0 = qs + 2 * warp * dim;
  const float* q1 = q0 + dim;
  float m[2], l[2], acc[2][kCols];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    StartState(p, h0 + 2 * warp + i, split, &m[i], &l[i]);
#pragma unroll
    for (int j = 0; j < kCols; ++j) acc[i][j] = 0.0f;
  }
  const float scale2 = p.scale * kLog2e;

#pragma unroll 1
  for (int32_t row0 = begin; row0 < end; row0 += kCoreRows) {
    const int n = min(kCoreRows, end - row0);
    __syncthreads();  // Q is stored; every warp is done with the previous tile
    for (int r = warp; r < kCoreRows; r += kCoreWarps) {
      float* dst = ks + r * ld;
      if (r < n) {
        const float* src = rows.RowStart(row0 + r);
        if (src != nullptr) {
          for (int d = lane; d < dim; d += 32) dst[d] = src[d];
        } else {  // an entry spread over blocks
          for (int d = lane; d < dim; d += 32) dst[d] = *rows.At(row0 + r, d);
        }
      } else {
        for (int d = lane; d < dim; d += 32) dst[d] = 0.0f;
      }
    }
    __syncthreads();

    const float* kr = ks + lane * ld;
    float dot0 = 0.0f, dot1 = 0.0f;
#pragma unroll 4
    for (int d = 0; d < dim; ++d) {
      const float k = kr[d];
      dot0 = fmaf(q0[d], k, dot0);
      dot1 = fmaf(q1[d], k, dot1);
    }
    const float s[2] = {lane < n ? dot0 * scale2 : -INFINITY, lane < n ? dot1 * scale2 : -INFINITY};
    float pr[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float base;
      const float alpha = Rescale(WarpMax(s[i]), &m[i], &base);
      pr[i] = exp2f(s[i] - base);
      l[i] = l[i] * alpha + WarpSum(pr[i]);
#pragma unroll
      for (int j = 0; j < kCols; ++j) acc[i][j] *= alpha;
    }
#pragma unroll 2
    for (int r = 0; r < n; ++r) {
      const float pa = __shfl_sync(0xffffffffu, pr[0], r);
      const float pb = __shfl_sync(0xffffffffu, pr[1], r);
      const float* vr = ks + r * ld;
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const int d = lane + 32 * j;
        if (d < dim) {
          const float v = vr[d];
          acc[0][j] = fmaf(pa, v, acc[0][j]);
          acc[1][j] = fmaf(pb, v, acc[1][j]);
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t h = h0 + 2 * warp + i;
    if (h >= p.heads) continue;
    const int64_t th = t * p.heads + h;
    if (num_splits == 1) {
      const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const int d = lane + 32 * j;
        if (d < dim) p.out[th * dim + d] = acc[i][j] * inv;
      }
    } else {
      float* dst = PartialOut(p, num_splits, th, split);
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const int d = lane + 32 * j;
        if (d < dim) dst[d] = acc[i][j];
      }
      if (lane == 0) {
        float* state = PartialState(p, num_splits, th, split);
        state[0] = m[i];
        state[1] = l[i];
      }
    }
  }
}

constexpr int kCombineThreads = 128;

// One block per (token, head, kCombineThreads output columns): the merge of its splits (see the
// top of this file), a thread per column, the splits' loads of a column all issued before its
// sum (a split of weight 0 is loaded but not added).
__device__ void CombineBody(SinkAttentionParams p, int32_t num_splits) {
  __shared__ float weight[kMaxSinkAttentionSplits];
  __shared__ float denom;
  const int64_t th = blockIdx.x;
  if (threadIdx.x < 32) {
    const float* state = PartialState(p, num_splits, th, 0);
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < num_splits; s += 32) mx = fmaxf(mx, state[2 * s]);
    mx = WarpMax(mx);
    float sum = 0.0f;
    for (int s = threadIdx.x; s < num_splits; s += 32) {
      // A split with nothing (sum 0) weighs 0 without evaluating exp2(-inf - -inf).
      const float w = state[2 * s + 1] > 0.0f ? exp2f(state[2 * s] - mx) : 0.0f;
      weight[s] = w;
      sum += w * state[2 * s + 1];
    }
    sum = WarpSum(sum);
    if (threadIdx.x == 0) denom = sum;
  }
  __syncthreads();
  const int64_t c = int64_t{blockIdx.y} * kCombineThreads + threadIdx.x;
  if (c >= p.dim) return;
  const float* part = PartialOut(p, num_splits, th, 0) + c;
  const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
  float v[kMaxSinkAttentionSplits];
#pragma unroll
  for (int s = 0; s < kMaxSinkAttentionSplits; ++s) {
    if (s < num_splits) v[s] = part[s * p.dim];
  }
  float acc = 0.0f;
#pragma unroll
  for (int s = 0; s < kMaxSinkAttentionSplits; ++s) {
    if (s < num_splits && weight[s] != 0.0f) acc = fmaf(weight[s], v[s], acc);
  }
  p.out[th * p.dim + c] = acc * inv;
}

constexpr int kEntriesThreads = 256;

// One block per block-table entry (j, s) = (blockIdx.x, blockIdx.y): block j of row s of the
// entries' tables into compact block s * table_stride + j, rounded to bf16.
__device__ void EntriesToBf16Body(V4PagedRows entries, uint16_t* data, int32_t* tables) {
  const int64_t s = blockIdx.y, j = blockIdx.x, bf = entries.block_floats;
  const int64_t dst_block = s * entries.table_stride + j;
  const float* src = entries.data + int64_t{entries.block_tables[dst_block]} * bf;
  uint16_t* dst = data + dst_block * bf;
  for (int64_t i = threadIdx.x; i < bf; i += kEntriesThreads) {
    dst[i] = __bfloat16_as_ushort(__float2bfloat16_rn(src[i]));
  }
  if (threadIdx.x == 0) tables[dst_block] = static_cast<int32_t>(dst_block);
}

}  // namespace sink

namespace {

using sink::kCoreHeads;
using sink::kCoreThreads;
using sink::kMmaHeads;
using sink::kMmaThreads;
using sink::MmaShape;
using sink::PrefillShape;

bool Aligned(const void* ptr, size_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

bool ParamsOk(const SinkAttentionParams& p) {
  if (p.tokens < 0 || p.num_splits < 0 || p.num_splits > kMaxSinkAttentionSplits ||
      p.prefill_blocks < 0) {
    return false;
  }
  if (p.tokens == 0) return true;
  if (p.heads < 1 || p.dim < 1 || (p.q == nullptr && p.q_bf16 == nullptr) || p.kv == nullptr ||
      p.positions == nullptr || p.window_len == nullptr || p.step_start == nullptr ||
      p.sinks == nullptr || (p.out == nullptr && p.out_bf16 == nullptr)) {
    return false;
  }
  // The output's rope slice (out_bf16 only): whole pairs within the dim.
  if (p.out_bf16 != nullptr &&
      (p.out_rope_dim < 0 || p.out_rope_dim > p.dim || p.out_rope_dim % 2 != 0 ||
       (p.out_rope_dim > 0 &&
        (p.out_rope_positions == nullptr || p.out_rope_inv_freq == nullptr)))) {
    return false;
  }
  // out_bf16 is written by the tensor-core kernel itself: one split.
  if (p.out_bf16 != nullptr && p.num_splits > 1) return false;
  // The ring (window positions before the step): a slot per token.
  if (p.ring != nullptr && (p.ring_rows < 1 || p.ring_stride < 0 || p.ring_slot == nullptr)) {
    return false;
  }
  const V4PagedRows& e = p.entries;
  if (e.data != nullptr &&
      (e.block_floats < 1 || e.block_tables == nullptr || e.table_stride < 0 ||
       e.token_seq == nullptr || (p.extra_len == nullptr && p.selected == nullptr))) {
    return false;
  }
  if (p.selected != nullptr &&
      (p.selected_stride < 1 || p.selected_stride > std::numeric_limits<int32_t>::max())) {
    return false;
  }
  // Grid limits: tokens on x (and tokens x heads combine blocks), head groups on y.
  const int64_t kMaxGridX = std::numeric_limits<int32_t>::max();
  return p.tokens * p.heads <= kMaxGridX && (p.heads + kCoreHeads - 1) / kCoreHeads <= 65535;
}

template <int kCols>
const void* CoreEntry() {
  return reinterpret_cast<const void*>(EntryKernel<sink::CoreBody<kCols>, kCoreThreads>());
}

// The CUDA-core kernel's entry for the dim.
const void* CoreKernel(int64_t dim) {
  if (dim <= 128) return CoreEntry<4>();
  if (dim <= 256) return CoreEntry<8>();
  if (dim <= 512) return CoreEntry<16>();
  return CoreEntry<32>();
}

template <int kCols>
cudaError_t LaunchCore(dim3 grid, const SinkAttentionParams& p, int32_t splits,
                       cudaStream_t stream) {
  return LaunchAfterPrecedingGrids<sink::CoreBody<kCols>, kCoreThreads>(
      grid, sink::CoreSmemBytes(p.dim), stream, p, splits);
}

// The entry and dynamic shared memory of a tensor-core kernel.
const void* MmaKernel(SinkAttentionKernel k) {
  switch (k) {
    case SinkAttentionKernel::kTensorCoreExact:
      return reinterpret_cast<const void*>(EntryKernel<sink::MmaBody<true>, kMmaThreads>());
    case SinkAttentionKernel::kTensorCoreBf16Prefill:
      return reinterpret_cast<const void*>(EntryKernel<sink::PrefillBody, kMmaThreads>());
    default:
      return reinterpret_cast<const void*>(EntryKernel<sink::MmaBody<false>, kMmaThreads>());
  }
}

size_t MmaSmemBytes(SinkAttentionKernel k) {
  switch (k) {
    case SinkAttentionKernel::kTensorCoreExact:
      return MmaShape<true>::kSmemBytes;
    case SinkAttentionKernel::kTensorCoreBf16Prefill:
      return PrefillShape::kSmemBytes;
    default:
      return MmaShape<false>::kSmemBytes;
  }
}

// Whether a tensor-core kernel runs on the current device (sm_80+, its shared memory).
bool MmaKernelFits(SinkAttentionKernel k) {
  const size_t smem = MmaSmemBytes(k);
  const KernelFacts f = KernelFactsForCurrentDevice(MmaKernel(k), static_cast<int>(smem));
  return f.error == cudaSuccess && f.ptx_version >= 80 && static_cast<size_t>(f.max_smem) >= smem;
}

// Heads per block of the kernel.
int64_t HeadsPerBlock(SinkAttentionKernel k) {
  return k == SinkAttentionKernel::kCudaCore ? kCoreHeads : kMmaHeads;
}

}  // namespace

bool SinkAttentionKernelRuns(const SinkAttentionParams& p, SinkAttentionKernel kernel) {
  if (!ParamsOk(p)) return false;
  // The bf16 forms are the bf16 tensor-core kernels'.
  const bool bf16_io = p.q_bf16 != nullptr || p.out_bf16 != nullptr;
  if (bf16_io && ((kernel != SinkAttentionKernel::kTensorCoreBf16 &&
                   kernel != SinkAttentionKernel::kTensorCoreBf16Prefill) ||
                  (p.q_bf16 != nullptr && !Aligned(p.q_bf16, 16)) ||
                  (p.out_bf16 != nullptr && !Aligned(p.out_bf16, 4)))) {
    return false;
  }
  switch (kernel) {
    case SinkAttentionKernel::kCudaCore: {
      if (p.dim > kMaxSinkAttentionDim) return false;
      const KernelFacts f = KernelFactsForCurrentDevice(CoreKernel(p.dim), kAllSharedMemory);
      return f.error == cudaSuccess &&
             static_cast<size_t>(f.max_smem) >= sink::CoreSmemBytes(p.dim);
    }
    case SinkAttentionKernel::kTensorCoreExact:
    case SinkAttentionKernel::kTensorCoreBf16:
    case SinkAttentionKernel::kTensorCoreBf16Prefill: {
      // Rows move in 16-byte pieces: every row start (and, for an entry spread over blocks,
      // every block's) 16-byte aligned.
      if (p.dim != kSinkAttentionMmaDim || !Aligned(p.q, 16) || !Aligned(p.kv, 16) ||
          !Aligned(p.out, 8) ||
          (p.ring != nullptr && (!Aligned(p.ring, 16) || p.ring_stride % 4 != 0)) ||
          (p.entries.data != nullptr &&
           (!Aligned(p.entries.data, 16) || p.entries.block_floats % 4 != 0))) {
        return false;
      }
      // One split, the token's selection within shared memory.
      if (kernel == SinkAttentionKernel::kTensorCoreBf16Prefill &&
          (p.num_splits > 1 ||
           (p.selected != nullptr && p.selected_stride > kPrefillMaxSelected))) {
        return false;
      }
      // The bf16 copies (kTensorCoreBf16Prefill's; the others ignore them) move in 16-byte
      // pieces of 8 values too.
      if (kernel == SinkAttentionKernel::kTensorCoreBf16Prefill &&
          ((p.kv_bf16 != nullptr && !Aligned(p.kv_bf16, 16)) ||
           (p.ring_bf16 != nullptr && (!Aligned(p.ring_bf16, 16) || p.ring_stride % 8 != 0)) ||
           (p.entries_bf16.data != nullptr &&
            (p.entries.data == nullptr || !Aligned(p.entries_bf16.data, 16) ||
             p.entries.block_floats % 8 != 0 || p.entries_bf16.seq_stride < 0 ||
             p.entries_bf16.seq_stride % 8 != 0 ||
             (p.entries_bf16.block_tables != nullptr && p.entries_bf16.table_stride < 0))))) {
        return false;
      }
      return MmaKernelFits(kernel);
    }
    case SinkAttentionKernel::kAuto:
      break;
  }
  return false;
}

SinkAttentionKernel SinkAttentionKernelFor(const SinkAttentionParams& p) {
  if (p.kernel != SinkAttentionKernel::kAuto) {
    return SinkAttentionKernelRuns(p, p.kernel) ? p.kernel : SinkAttentionKernel::kAuto;
  }
  if (p.out_bf16 != nullptr &&
      SinkAttentionKernelRuns(p, SinkAttentionKernel::kTensorCoreBf16Prefill)) {
    return SinkAttentionKernel::kTensorCoreBf16Prefill;
  }
  if (p.q_bf16 != nullptr || p.out_bf16 != nullptr) {
    return SinkAttentionKernelRuns(p, SinkAttentionKernel::kTensorCoreBf16)
               ? SinkAttentionKernel::kTensorCoreBf16
               : SinkAttentionKernel::kAuto;
  }
  for (SinkAttentionKernel k :
       {SinkAttentionKernel::kTensorCoreExact, SinkAttentionKernel::kCudaCore}) {
    if (SinkAttentionKernelRuns(p, k)) return k;
  }
  return SinkAttentionKernel::kAuto;
}

bool SinkAttentionTakesBf16Io(int64_t dim) {
  return dim == kSinkAttentionMmaDim && MmaKernelFits(SinkAttentionKernel::kTensorCoreBf16);
}

cudaError_t SinkAttentionSplits(const SinkAttentionParams& p, int32_t* splits) {
  *splits = 1;
  if (!ParamsOk(p)) return cudaErrorInvalidValue;
  if (p.num_splits > 0 || p.tokens == 0 || p.out_bf16 != nullptr) {
    *splits = std::max<int32_t>(p.num_splits, 1);
    return cudaSuccess;
  }
  const SinkAttentionKernel k = SinkAttentionKernelFor(p);
  if (k == SinkAttentionKernel::kAuto) return cudaErrorInvalidValue;
  if (k == SinkAttentionKernel::kTensorCoreBf16Prefill) return cudaSuccess;  // one split
  const bool core = k == SinkAttentionKernel::kCudaCore;
  const KernelFacts f =
      core ? KernelFactsForCurrentDevice(CoreKernel(p.dim), kAllSharedMemory)
           : KernelFactsForCurrentDevice(MmaKernel(k), static_cast<int>(MmaSmemBytes(k)));
  if (f.error != cudaSuccess) return f.error;
  // Blocks resident at once: the tensor-core kernels take one SM each, the CUDA-core kernel
  // about two (its shared memory at dim 512).
  const int64_t slots = static_cast<int64_t>(f.sms) * (core ? 2 : 1);
  const int64_t per_split = p.tokens * ((p.heads + HeadsPerBlock(k) - 1) / HeadsPerBlock(k));
  // Up to 16 splits: a decode token's rows (a 128-row window and up to 512 entries) in tiles of
  // 16-32 rows leave each split at least a few tiles.
  constexpr int64_t kMaxAutoSplits = 16;
  *splits = static_cast<int32_t>(std::clamp<int64_t>(slots / per_split, 1, kMaxAutoSplits));
  return cudaSuccess;
}

cudaError_t SinkAttentionWorkspaceBytes(const SinkAttentionParams& p, size_t* bytes) {
  *bytes = 0;
  int32_t splits = 1;
  const cudaError_t e = SinkAttentionSplits(p, &splits);
  if (e != cudaSuccess) return e;
  if (splits > 1) {
    *bytes = static_cast<size_t>(p.tokens) * p.heads * splits * (p.dim + 2) * sizeof(float);
  }
  return cudaSuccess;
}

int64_t SinkAttentionEntriesBf16Values(const V4PagedRows& entries, int64_t table_rows) {
  return std::max<int64_t>(table_rows, 0) * std::max<int64_t>(entries.table_stride, 0) *
         std::max<int64_t>(entries.block_floats, 0);
}

cudaError_t SinkAttentionEntriesToBf16(const V4PagedRows& entries, int64_t table_rows,
                                       uint16_t* data, int32_t* tables, cudaStream_t stream) {
  if (table_rows < 0 || entries.table_stride < 0 || entries.block_floats < 0) {
    return cudaErrorInvalidValue;
  }
  if (table_rows == 0 || entries.table_stride == 0 || entries.block_floats == 0) {
    return cudaSuccess;
  }
  if (entries.data == nullptr || entries.block_tables == nullptr || data == nullptr ||
      tables == nullptr || table_rows > 65535 ||
      entries.table_stride > std::numeric_limits<int32_t>::max() ||
      table_rows * entries.table_stride > std::numeric_limits<int32_t>::max()) {
    return cudaErrorInvalidValue;
  }
  return LaunchAfterPrecedingGrids<sink::EntriesToBf16Body, sink::kEntriesThreads>(
      dim3(static_cast<unsigned>(entries.table_stride), static_cast<unsigned>(table_rows)), 0,
      stream, entries, data, tables);
}

cudaError_t SinkAttentionF32(const SinkAttentionParams& p, cudaStream_t stream) {
  if (!ParamsOk(p)) return cudaErrorInvalidValue;
  if (p.tokens == 0) return cudaSuccess;
  const SinkAttentionKernel k = SinkAttentionKernelFor(p);
  if (k == SinkAttentionKernel::kAuto) return cudaErrorInvalidValue;
  int32_t splits = 1;
  cudaError_t e = SinkAttentionSplits(p, &splits);
  if (e != cudaSuccess) return e;
  if (splits > 1) {
    size_t need = 0;
    e = SinkAttentionWorkspaceBytes(p, &need);
    if (e != cudaSuccess) return e;
    if (p.workspace == nullptr || p.workspace_bytes < need || !Aligned(p.workspace, 16)) {
      return cudaErrorInvalidValue;
    }
  }
  const int64_t per_block = HeadsPerBlock(k);
  const int64_t head_blocks = (p.heads + per_block - 1) / per_block;
  dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(head_blocks),
            static_cast<unsigned>(splits));
  if (k == SinkAttentionKernel::kTensorCoreBf16Prefill) {
    // Blocks that take several tokens each: one per SM over the head groups by default.
    int64_t blocks = p.prefill_blocks;
    if (blocks == 0) {
      const KernelFacts f =
          KernelFactsForCurrentDevice(MmaKernel(k), static_cast<int>(MmaSmemBytes(k)));
      if (f.error != cudaSuccess) return f.error;
      blocks = std::max<int64_t>(1, f.sms / head_blocks);
    }
    grid.x = static_cast<unsigned>(std::min(p.tokens, blocks));
  }
  switch (k) {
    case SinkAttentionKernel::kCudaCore:
      e = p.dim <= 128   ? LaunchCore<4>(grid, p, splits, stream)
          : p.dim <= 256 ? LaunchCore<8>(grid, p, splits, stream)
          : p.dim <= 512 ? LaunchCore<16>(grid, p, splits, stream)
                         : LaunchCore<32>(grid, p, splits, stream);
      break;
    case SinkAttentionKernel::kTensorCoreExact:
      e = LaunchAfterPrecedingGrids<sink::MmaBody<true>, kMmaThreads>(
          grid, MmaShape<true>::kSmemBytes, stream, p, splits);
      break;
    case SinkAttentionKernel::kTensorCoreBf16:
      e = LaunchAfterPrecedingGrids<sink::MmaBody<false>, kMmaThreads>(
          grid, MmaShape<false>::kSmemBytes, stream, p, splits);
      break;
    case SinkAttentionKernel::kTensorCoreBf16Prefill:
      e = LaunchAfterPrecedingGrids<sink::PrefillBody, kMmaThreads>(
          grid, PrefillShape::kSmemBytes, stream, p, splits);
      break;
    case SinkAttentionKernel::kAuto:
      return cudaErrorInvalidValue;
  }
  if (e != cudaSuccess || splits == 1) return e;
  return LaunchAfterPrecedingGrids<sink::CombineBody, sink::kCombineThreads>(
      dim3(static_cast<unsigned>(p.tokens * p.heads),
           static_cast<unsigned>((p.dim + sink::kCombineThreads - 1) / sink::kCombineThreads)),
      0, stream, p, splits);
}

}  // namespace kernels
}  // namespace deepinfer
