// DeepSeek-V4's lightning indexer on the GPU: each query token's scores over its candidate
// compressed entries and the top-k of them, the selection SinkAttentionF32 reads on CSA layers.
// The GPU counterpart of V4Ops::IndexerTopK (worker/backend/v4_ops.h), fp32 in.
//
// Two launches: the scores (a block per (token, 128 candidates), fp32 on CUDA cores) into the
// caller's workspace, then the top-k (a block per token: a 4-pass radix select over the scores'
// order-preserving bits, then the chosen indices written in ascending order by one pass of
// block-wide prefix sums). No allocation, no host synchronisation: graph-capturable.
#ifndef DEEPINFER_KERNELS_V4_INDEXER_TOPK_H_
#define DEEPINFER_KERNELS_V4_INDEXER_TOPK_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

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
};

// The meaning of V4Ops::IndexerTopK's IndexerTopKArgs. Query t's candidates are the keys rows
// keys[key_begin[t] + i] for i < candidates[t], of which the first visible[t] count (the others
// are never chosen). Candidate i scores
//   sum_h (relu(q[t, h] · key) * key_scale) * (weights[t, h] * weight_scale)
// and the min(topk, visible) best are chosen: selected[t, :] holds their i ascending, then -1.
// Ties (equal scores, +0 and -0 being equal) go to the lower index; a NaN score ranks above
// every number (as torch.topk ranks it). Where the scores at the k-th place are distinct the
// choice is torch.topk's and CpuV4Ops's; where they tie, CpuV4Ops's choice follows its sort
// algorithms instead, so the two may choose different members of a tie.
// All pointers are device memory; every candidate row must lie in keys (not checked on the
// device).
struct IndexerTopKParams {
  int64_t tokens = 0, heads = 0, dim = 0, topk = 0;
  const float* q = nullptr;        // [tokens, heads, dim]
  const float* weights = nullptr;  // [tokens, heads]
  float weight_scale = 1.0f, key_scale = 1.0f;
  const float* keys = nullptr;          // [rows, dim]
  const int32_t* key_begin = nullptr;   // [tokens]
  const int32_t* candidates = nullptr;  // [tokens]
  const int32_t* visible = nullptr;     // [tokens]
  int32_t* selected = nullptr;          // [tokens, topk]

  // An upper bound of every token's visible candidates (the host knows it from the step's
  // shapes): the workspace's row length. Candidates at or past it are not scored or chosen.
  int64_t max_candidates = 0;
  // At least IndexerTopKWorkspaceBytes(params) bytes of device memory for the scores.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  IndexerScoreOrder order = IndexerScoreOrder::kSequential;
};

// tokens * max_candidates floats.
size_t IndexerTopKWorkspaceBytes(const IndexerTopKParams& params);

// Enqueues the scores and the top-k on `stream`. cudaErrorInvalidValue for negative sizes;
// heads, dim or topk < 1, a missing pointer, or a workspace smaller than
// IndexerTopKWorkspaceBytes with tokens > 0; max_candidates outside [0, 2^31). tokens == 0
// enqueues nothing.
cudaError_t IndexerTopKF32(const IndexerTopKParams& params, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_V4_INDEXER_TOPK_H_
