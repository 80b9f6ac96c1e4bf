// DeepSeek-V4's attention on the GPU: one shared K = V head, many query heads with per-head
// sink logits, each query token over its own list of key rows (its sliding window, then its
// compressed entries: all of them on HCA layers, the indexer's selection on CSA layers), read
// where the cache keeps them (the window ring, this step's keys, the paged compressed stream).
// The GPU counterpart of V4Ops::SinkAttention (worker/backend/v4_ops.h), fp32 in and out.
//
// One block per (token, group of heads, split of the token's rows) reads each key row once for
// the whole group: 16 heads on CUDA cores (any dim up to kMaxSinkAttentionDim), or on tensor
// cores (dim 512: V4-Flash) all 64 heads of a block as one [64 x 512] · [512 x rows] product,
// so a decode token's 64 heads read each of its rows from memory once (FlashMLA's sparse-decode
// shape). A token's rows may be split over several blocks (decode: few tokens, every SM busy);
// the splits write an unnormalised output, running max and sum to a caller's workspace and a
// combine kernel merges them. No allocation, no host synchronisation: graph-capturable.
#ifndef DEEPINFER_KERNELS_V4_SINK_ATTENTION_H_
#define DEEPINFER_KERNELS_V4_SINK_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "worker/backend/v4_ops.h"

namespace deepinfer {
namespace kernels {

// bf16 copies of the paged entries' rows (SinkAttentionParams::entries_bf16): blocks of
// entries.block_floats values, token t's entry element e at
//   data[tables[token_seq[t] * table_stride + e / block_floats] * block_floats + e % block_floats]
// (the entries' own block tables and stride where block_tables is null: a copy of the whole
// stream in its layout). seq_stride > 0 says more (SinkAttentionEntriesToBf16's layout): block-
// table row s's stream lies contiguously from data + s * seq_stride, so element e of token t's
// stream is data[token_seq[t] * seq_stride + e]; kTensorCoreBf16Prefill then reads no table.
struct SinkEntriesBf16 {
  const uint16_t* data = nullptr;
  const int32_t* block_tables = nullptr;
  int64_t table_stride = 0;
  int64_t seq_stride = 0;
};

// Which kernel SinkAttentionF32 runs.
enum class SinkAttentionKernel : int32_t {
  // kTensorCoreExact where it runs (SinkAttentionKernelRuns), else kCudaCore; with out_bf16
  // (a prefill: one split), kTensorCoreBf16Prefill where it runs; else with q_bf16 or
  // out_bf16, kTensorCoreBf16.
  kAuto = 0,
  // fp32 FMA on CUDA cores, 16 heads per block; any dim up to kMaxSinkAttentionDim.
  kCudaCore = 1,
  // dim 512, a GPU with bf16 tensor cores (sm_80+), 16-byte aligned q, kv, ring and entries,
  // ring_stride and the entries' block_floats multiples of 4, 8-byte aligned out: bf16 mma.sync
  // with every fp32 operand (Q, K = V, P) split into a bf16 hi + lo pair and
  // each product taken as hi·hi + hi·lo + lo·hi (three MMAs, fp32 sums): a relative error of
  // at most about 3 * 2^-16 per product instead of bf16's 2^-7, fp32-grade results.
  kTensorCoreExact = 2,
  // The same shapes with Q, K = V and P rounded to bf16 (one MMA per product; each operand
  // carries bf16's rounding, up to 2^-8 relative): the fast kernel for bf16 models. The only
  // kernel that takes q_bf16 and out_bf16 (SinkAttentionTakesBf16Io), with
  // kTensorCoreBf16Prefill.
  kTensorCoreBf16 = 3,
  // kTensorCoreBf16's operands and shapes (and q_bf16, out_bf16, the bf16 row copies) with one
  // split only and a selection stride of at most kPrefillMaxSelected: the prefill's kernel. Its
  // warps divide the work otherwise (sink_attention_prefill.cuh: scores over all dims per warp,
  // P through shared memory, 64-row key tiles), so its sums run in another order: its output
  // equals kTensorCoreBf16's within bf16 rounding of P, not bit for bit.
  kTensorCoreBf16Prefill = 5,
};

// The largest dim kCudaCore takes.
constexpr int64_t kMaxSinkAttentionDim = 1024;
// The dim of the tensor-core kernels.
constexpr int64_t kSinkAttentionMmaDim = 512;
// The largest num_splits.
constexpr int32_t kMaxSinkAttentionSplits = 32;
// The largest selected_stride kTensorCoreBf16Prefill takes (the token's selection is kept in
// its shared memory).
constexpr int64_t kPrefillMaxSelected = 2048;

// V4Ops::SinkAttention's arguments (worker/backend/v4_ops.h: SinkAttentionArgs) and what the
// kernels add. Query t of head h attends over, in this order, its window (positions
// positions[t] - window_len[t] + 1 .. positions[t]: rows of this step's kv from step_start[t]
// on, rows p % ring_rows of its ring slot before) and its compressed entries (rows of its paged
// stream: the first extra_len[t], or the rows in selected[t * selected_stride ..] up to the
// first negative entry or selected_stride entries, IndexerTopKF32's output; extra_len is then
// not read), all read where they lie. With S = scale * q[t, h] · k over those rows:
//   out[t, h] = sum_k softmax([S] ++ [sinks[h]])_k * k   (the sink's probability is dropped).
// With q_bf16 the bf16 kernel reads the query as given (the bits it would round q to); with
// out_bf16 its epilogue rotates out's rope slice back and writes bf16 (SinkAttentionArgs), so
// a prefill's query and output each cross memory once, in bf16.
// All pointers are device memory; every row read must lie in its buffer (not checked on the
// device). A token with no rows gets out = 0.
struct SinkAttentionParams : SinkAttentionArgs {
  // Splits of each token's rows (0: chosen from the token count and the device's SM count so
  // that a few decode tokens still fill the GPU). Tests and the benchmark set it.
  int32_t num_splits = 0;
  // With more than one split, at least SinkAttentionWorkspaceBytes(params) bytes of device
  // memory for the splits' partial results (the call fails without it).
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  SinkAttentionKernel kernel = SinkAttentionKernel::kAuto;
  // kTensorCoreBf16Prefill's blocks per group of 64 heads, each taking every such block count's
  // token in turn (0: one per SM, at most one per token). Tests and the benchmark set it.
  int32_t prefill_blocks = 0;
  // bf16 copies of the key rows' buffers, read only by kTensorCoreBf16Prefill (the other
  // kernels ignore them): each the bits of its buffer's values rounded to bf16 (nearest even, as
  // RoundF32ToBf16 rounds), kv's and the ring's at the same element offsets, the entries' in
  // SinkEntriesBf16's layout; a row whose buffer has a copy is read from it, with the same result.
  // Each may be absent (that buffer's rows are read in fp32); each given one 16-byte aligned;
  // ring_bf16 needs ring_stride a multiple of 8 and entries_bf16 the entries' block_floats a
  // multiple of 8. Only the rows the tokens read need to hold their values.
  const uint16_t* kv_bf16 = nullptr;    // kv's [tokens, dim]
  const uint16_t* ring_bf16 = nullptr;  // ring's slots of ring_stride values
  SinkEntriesBf16 entries_bf16;         // data null: none
};

// Whether the bf16 tensor-core kernels take q_bf16 and out_bf16 for queries of this dim on the
// current device (dim 512, sm_80+, kTensorCoreBf16's shared memory): params with them run on
// kTensorCoreBf16 or kTensorCoreBf16Prefill (16-byte aligned q_bf16, 4-byte aligned out_bf16;
// 16-byte aligned, it is written in 16-byte pieces) and one split (num_splits 0 or 1); kAuto
// picks kTensorCoreBf16Prefill for out_bf16 where it runs (a selection stride up to
// kPrefillMaxSelected, its shared memory), else kTensorCoreBf16.
bool SinkAttentionTakesBf16Io(int64_t dim);

// Whether `kernel` (not kAuto) runs these params on the current device: the shape and pointer
// alignment it needs and the device's support (sm_80+ and its shared memory for the tensor-core
// kernels). The first call per kernel raises its dynamic shared-memory limit.
bool SinkAttentionKernelRuns(const SinkAttentionParams& params, SinkAttentionKernel kernel);

// The kernel SinkAttentionF32 runs for these params (kAuto resolved); kAuto itself when none
// runs them (a dim above kMaxSinkAttentionDim, or a forced kernel that does not run them).
SinkAttentionKernel SinkAttentionKernelFor(const SinkAttentionParams& params);

// The split count SinkAttentionF32 uses for these params on the current device.
cudaError_t SinkAttentionSplits(const SinkAttentionParams& params, int32_t* splits);

// Bytes of workspace SinkAttentionF32 needs (0 with one split).
cudaError_t SinkAttentionWorkspaceBytes(const SinkAttentionParams& params, size_t* bytes);

// Values of the bf16 copy of the entries that SinkAttentionEntriesToBf16 writes: a block of
// entries.block_floats per block-table entry of the table_rows rows.
int64_t SinkAttentionEntriesBf16Values(const V4PagedRows& entries, int64_t table_rows);

// Enqueues a compact bf16 copy of the blocks that rows 0 .. table_rows - 1 of entries'
// block tables name (every entry of a row, table_stride of them): block j of row s, rounded to
// nearest even, into block s * table_stride + j of data (SinkAttentionEntriesBf16Values values),
// whose index goes to tables[s * table_stride + j] ([table_rows, table_stride] int32). The
// result is the entries_bf16 of params with these entries (block_tables = tables, table_stride
// = entries.table_stride, seq_stride = entries.table_stride * entries.block_floats). cudaErrorInvalidValue for a missing pointer or table_rows < 0.
cudaError_t SinkAttentionEntriesToBf16(const V4PagedRows& entries, int64_t table_rows,
                                       uint16_t* data, int32_t* tables, cudaStream_t stream);

// Enqueues the attention on `stream`. cudaErrorInvalidValue for negative sizes, heads or dim
// < 1 with tokens > 0, a missing pointer, num_splits outside [0, kMaxSinkAttentionSplits], a
// workspace smaller than SinkAttentionWorkspaceBytes, or no kernel for the params
// (SinkAttentionKernelFor is kAuto). tokens == 0 enqueues nothing.
cudaError_t SinkAttentionF32(const SinkAttentionParams& params, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_V4_SINK_ATTENTION_H_
