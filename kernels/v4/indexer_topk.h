// DeepSeek-V4's lightning indexer on the GPU: each query token's scores over its candidate
// compressed entries (the indexer keys, read where the cache's paged stream keeps them) and the
// top-k of them, the selection SinkAttentionF32 reads on CSA layers.
// The GPU counterpart of V4Ops::IndexerTopK (worker/backend/v4_ops.h), fp32 in.
//
// Two launches: the scores (a block per (token, 128 candidates): fp32 on CUDA cores, or bf16
// tensor cores with IndexerScoreOrder::kTensorCoreBf16) into the caller's workspace, then the
// top-k (a block per token: a 4-pass radix select over the scores' order-preserving bits, then
// the chosen indices written in ascending order by one pass of block-wide prefix sums). A token
// whose visible candidates number at most topk is not scored (the top-k takes them all). No
// allocation, no host synchronisation: graph-capturable.
#ifndef DEEPINFER_KERNELS_V4_INDEXER_TOPK_H_
#define DEEPINFER_KERNELS_V4_INDEXER_TOPK_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "worker/backend/v4_ops.h"

namespace deepinfer {
namespace kernels {

// How the scores' sums are rounded.
enum class IndexerScoreOrder : int32_t {
  // Every product and sum rounded on its own (no fused multiply-add), the dot products over the
  // dim in order and the heads' terms summed in head order: CpuV4Ops::IndexerTopK's arithmetic
  // step for step, so where the CPU build does not contract (x86-64's baseline, our build) the
  // scores are the CPU's bit for bit and so is the selection, exact ties aside.
  kSequential = 0,
  // The same order with fused multiply-adds in the dot products: about half the instructions,
  // scores within fp32 rounding of the CPU's (a near-tie at the k-th score may then choose
  // differently).
  kFma = 1,
  // q and the keys rounded to bf16 (nearest even), the dot products on tensor cores (fp32
  // accumulation, sm_80+: IndexerTopKTensorCoreRuns), the heads' terms as kSequential: the
  // scores of the bf16-rounded inputs within fp32 rounding (equal to kSequential's where every
  // dot product is exact in fp32, e.g. inputs with few significant bits). Several times faster;
  // the prefill path of bf16 models (the reference indexer rounds further, to FP8).
  kTensorCoreBf16 = 2,
};

// Whether kTensorCoreBf16 runs on the current device (sm_80+ code).
bool IndexerTopKTensorCoreRuns();

// V4Ops::IndexerTopK's arguments (worker/backend/v4_ops.h: IndexerTopKArgs) and what the kernels
// add. Query t's candidates are rows i < candidates[t] of its sequence's paged stream of keys
// (keys: V4PagedRows), of which the first visible[t] count (the others are never chosen).
// Candidate i scores
//   sum_h (relu(q[t, h] · key) * key_scale) * (weights[t, h] * weight_scale)
// and the min(topk, visible) best are chosen: selected[t, :] holds their i ascending, then -1.
// Ties (equal scores, +0 and -0 being equal) go to the lower index; a NaN score ranks above
// every number (as torch.topk ranks it). Where the scores at the k-th place are distinct the
// choice is torch.topk's and CpuV4Ops's; where they tie, CpuV4Ops's choice follows its sort
// algorithms instead, so the two may choose different members of a tie.
// max_candidates (an upper bound of every token's visible candidates, known to the host) is the
// workspace's row length: candidates at or past it are not scored or chosen.
// All pointers are device memory; every candidate row must lie in the stream (not checked on
// the device).
struct IndexerTopKParams : IndexerTopKArgs {
  // At least IndexerTopKWorkspaceBytes(params) bytes of device memory for the scores.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  IndexerScoreOrder order = IndexerScoreOrder::kSequential;
};

// tokens * max_candidates floats.
size_t IndexerTopKWorkspaceBytes(const IndexerTopKParams& params);

// Enqueues the scores and the top-k on `stream`. cudaErrorInvalidValue for negative sizes;
// heads, dim or topk < 1, a missing pointer, or a workspace smaller than
// IndexerTopKWorkspaceBytes with tokens > 0; max_candidates outside [0, 2^31); kTensorCoreBf16
// where IndexerTopKTensorCoreRuns is false. tokens == 0 enqueues nothing.
cudaError_t IndexerTopKF32(const IndexerTopKParams& params, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_V4_INDEXER_TOPK_H_
