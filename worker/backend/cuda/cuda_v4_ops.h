// CudaV4Ops: the DeepSeek-V4 ops (worker/backend/v4_ops.h) on a CudaBackend's stream, through the
// kernels of kernels/v4 (no host synchronisation; workspaces from the backend's scratch: each op
// can be recorded in the backend's CUDA graphs). V4Ops returns nothing, so errors go where every
// CudaBackend op's go: the first is recorded, logged and returned by the backend's status()
// (while recording a graph: by Capture), naming the op and its sizes when a kernel refuses its
// arguments.
// Owned by the CudaBackend (CudaBackend::v4_ops()); per-op timing as the backend's own ops.
#ifndef DEEPINFER_WORKER_BACKEND_CUDA_CUDA_V4_OPS_H_
#define DEEPINFER_WORKER_BACKEND_CUDA_CUDA_V4_OPS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "worker/backend/v4_ops.h"

namespace deepinfer {

class CudaBackend;

class CudaV4Ops : public V4Ops {
 public:
  // `backend` outlives this (it owns it).
  explicit CudaV4Ops(CudaBackend* backend) : backend_(backend) {}

  // kernels::HcMixF32 / HcHeadF32 / HcExpandF32 (kernels/v4/hyper_connection.h).
  void HcMix(const HcMixArgs& args) override;
  // kernels::HcMixFromStreamsF32 where it takes the shapes (its partials from scratch, the
  // backend's counter: one launch up to 4 rows).
  bool HcMixFromStreams(const HcMixArgs& args) override;
  // kernels::RmsNormRopeF32 (RmsNormRopeToBf16 with out_bf16) where it takes the shapes (rows
  // up to 2048 wide).
  bool NormRope(const NormRopeArgs& args) override;
  // kernels::RmsNormRopePairF32 where it takes both (fp32 outputs, widths in one of its classes).
  // NormRope and NormRopePair: weight and inv_freq are read before the programmatic-dependent-
  // launch wait (the model's weights: no op of a step writes them).
  bool NormRopePair(const NormRopeArgs& first, const NormRopeArgs& second) override;
  // From kBf16AttentionMinTokens queries (prefill: decode and its graphs keep the fp32 query and
  // output) with bf16 weights, outside batch-invariant mode, where
  // kernels::SinkAttentionTakesBf16Io(dim) (V4-Flash's dim 512 on sm_80+).
  bool TakesBf16Attention(int64_t tokens, int64_t heads, int64_t dim) override;
  static constexpr int64_t kBf16AttentionMinTokens = 512;
  void HcHead(const HcHeadArgs& args) override;
  void HcExpand(const HcExpandArgs& args) override;
  // kernels::CompressWindowsF32.
  void CompressWindows(const CompressWindowsArgs& args) override;
  // kernels::SinkAttentionF32 (bf16 tensor cores for a bf16 model where they run, else the
  // exact kernel; q_bf16 / out_bf16 on the bf16 kernel, one split), its split workspace from
  // the backend's scratch.
  void SinkAttention(const SinkAttentionArgs& args) override;
  // kernels::IndexerTopKF32, its scores' workspace (tokens x max_candidates) from scratch; from
  // kTensorCoreIndexerMinTokens tokens with bf16 weights (outside batch-invariant mode) with
  // tensor-core scores (IndexerScoreOrder::kTensorCoreBf16), else in the CPU's arithmetic
  // (kSequential).
  void IndexerTopK(const IndexerTopKArgs& args) override;
  static constexpr int64_t kTensorCoreIndexerMinTokens = 512;
  // kernels::V4RouteF32.
  void Route(const V4RouteArgs& args) override;
  // kernels::V4RouteFromHiddenF32 (logits and routing in one launch; the logits in scratch, the
  // backend's tile counters) up to kRouteFromHiddenMaxTokens tokens where it takes the shapes,
  // outside batch-invariant mode (whose router GEMM sums in the batch-invariant GEMM's order).
  bool RouteFromHidden(const V4RouteFromHiddenArgs& args) override;
  static constexpr int64_t kRouteFromHiddenMaxTokens = 128;
  // kernels::CopyRowsF32.
  void CopyRows(const CopyRowsArgs& args) override;
  // kernels::SwiGluClampedF32.
  void SwiGluClamped(int64_t rows, int64_t inter, const float* x, float limit, float* out) override;

 private:
  // Records a failed launch (err) in the backend's status, naming `call` and the op's `shape`.
  void RecordFailure(cudaError_t err, const char* call, const std::string& shape);

  CudaBackend* backend_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_CUDA_CUDA_V4_OPS_H_
