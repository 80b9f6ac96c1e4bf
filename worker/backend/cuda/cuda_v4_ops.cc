// CudaV4Ops: each op one kernel of kernels/v4 (NormRope: kernels/rope) on the backend's stream
// (HcMixFromStreams: two).
#include "worker/backend/cuda/cuda_v4_ops.h"

#include <algorithm>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/activation/elementwise.h"
#include "kernels/moe/expert_activation.h"
#include "kernels/moe/noaux_tc_router_fused.h"
#include "kernels/rope/rope.h"
#include "kernels/v4/compress_windows.h"
#include "kernels/v4/copy_rows.h"
#include "kernels/v4/hyper_connection.h"
#include "kernels/v4/indexer_topk.h"
#include "kernels/v4/sink_attention.h"
#include "kernels/v4/swiglu_clamped.h"
#include "kernels/v4/v4_router.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/op_timer.h"

namespace deepinfer {

void CudaV4Ops::RecordFailure(cudaError_t err, const char* call, const std::string& shape) {
  backend_->Record(CudaStatus(err, absl::StrCat(call, " (", shape, ")")));
}

void CudaV4Ops::HcMix(const HcMixArgs& a) {
  CudaBackend::OpTimer timer(backend_, "V4HcMix");
  const cudaError_t err = kernels::HcMixF32(a, backend_->stream_);
  if (err != cudaSuccess) {
    RecordFailure(err, "kernels::HcMixF32",
                  absl::StrCat("rows ", a.rows, ", hc ", a.hc, ", hidden ", a.hidden,
                               ", sinkhorn_iters ", a.sinkhorn_iters));
  }
}

bool CudaV4Ops::HcMixFromStreams(const HcMixArgs& a) {
  if (!kernels::HcMixFromStreamsSupported(a)) return false;
  CudaBackend::OpTimer timer(backend_, "V4HcMixFromStreams");
  if (a.rows == 0) return true;
  const int64_t floats = kernels::HcMixFromStreamsWorkspaceFloats(a.rows, a.hc, a.hidden);
  std::unique_ptr<DeviceBuffer> partials = backend_->AllocateScratch(floats * sizeof(float));
  const cudaError_t err = kernels::HcMixFromStreamsF32(a, partials->as<float>(), backend_->stream_);
  if (err != cudaSuccess) {
    RecordFailure(err, "kernels::HcMixFromStreamsF32",
                  absl::StrCat("rows ", a.rows, ", hc ", a.hc, ", hidden ", a.hidden,
                               ", sinkhorn_iters ", a.sinkhorn_iters));
  }
  return true;
}

bool CudaV4Ops::NormRope(const NormRopeArgs& a) {
  if (!kernels::RmsNormRopeSupported(a.tokens, a.heads, a.dim, a.rope_dim)) return false;
  if (a.x_bf16 != nullptr && a.out_bf16 == nullptr) return false;
  CudaBackend::OpTimer timer(backend_, "V4NormRope");
  const bool bf16 = a.out_bf16 != nullptr;
  cudaError_t err;
  const char* call;
  if (a.x_bf16 != nullptr) {
    call = "kernels::RmsNormRopeBf16";
    err = kernels::RmsNormRopeBf16(a.tokens, a.heads, a.dim, a.x_bf16, a.dim, a.weight, a.eps,
                                   a.out_bf16, a.dim, a.rope_dim, a.positions, a.inv_freq,
                                   a.attention_factor, backend_->stream_);
  } else if (bf16) {
    call = "kernels::RmsNormRopeToBf16";
    err = kernels::RmsNormRopeToBf16(a.tokens, a.heads, a.dim, a.x, a.dim, a.weight, a.eps,
                                     a.out_bf16, a.dim, a.rope_dim, a.positions, a.inv_freq,
                                     a.attention_factor, backend_->stream_);
  } else {
    call = "kernels::RmsNormRopeF32";
    err = kernels::RmsNormRopeF32(a.tokens, a.heads, a.dim, a.x, a.dim, a.weight, a.eps, a.out,
                                  a.dim, a.rope_dim, a.positions, a.inv_freq, a.attention_factor,
                                  backend_->stream_);
  }
  if (err != cudaSuccess) {
    RecordFailure(err, call,
                  absl::StrCat("tokens ", a.tokens, ", heads ", a.heads, ", dim ", a.dim,
                               ", rope_dim ", a.rope_dim));
  }
  return true;
}

bool CudaV4Ops::NormRopePair(const NormRopeArgs& a, const NormRopeArgs& b) {
  auto rows = [](const NormRopeArgs& n) {
    kernels::RmsNormRopeRows r;
    r.tokens = n.tokens, r.heads = n.heads, r.dim = n.dim;
    r.x = n.x, r.ldx = n.dim, r.weight = n.weight, r.out = n.out, r.ldout = n.dim;
    return r;
  };
  const kernels::RmsNormRopeRows ra = rows(a), rb = rows(b);
  if (a.out_bf16 != nullptr || b.out_bf16 != nullptr || a.x_bf16 != nullptr ||
      b.x_bf16 != nullptr || a.rope_dim != b.rope_dim || a.eps != b.eps ||
      a.positions != b.positions || a.inv_freq != b.inv_freq ||
      a.attention_factor != b.attention_factor ||
      !kernels::RmsNormRopePairSupported(ra, rb, a.rope_dim)) {
    return false;
  }
  CudaBackend::OpTimer timer(backend_, "V4NormRopePair");
  const cudaError_t err = kernels::RmsNormRopePairF32(
      ra, rb, a.eps, a.rope_dim, a.positions, a.inv_freq, a.attention_factor, backend_->stream_);
  if (err != cudaSuccess) {
    RecordFailure(err, "kernels::RmsNormRopePairF32",
                  absl::StrCat("tokens ", a.tokens, ", heads ", a.heads, " and ", b.heads, ", dim ",
                               a.dim, " and ", b.dim, ", rope_dim ", a.rope_dim));
  }
  return true;
}

bool CudaV4Ops::TakesBf16Attention(int64_t tokens, int64_t heads, int64_t dim) {
  return tokens >= kBf16AttentionMinTokens && heads >= 1 && dim <= kernels::kRmsNormRopeMaxDim &&
         backend_->weight_dtype() == WeightDType::kBFloat16 && !backend_->tuning_.batch_invariant &&
         kernels::SinkAttentionTakesBf16Io(dim);
}

void CudaV4Ops::HcHead(const HcHeadArgs& a) {
  CudaBackend::OpTimer timer(backend_, "V4HcHead");
  const cudaError_t err = kernels::HcHeadF32(a, backend_->stream_);
  if (err != cudaSuccess) {
    RecordFailure(err, "kernels::HcHeadF32",
                  absl::StrCat("rows ", a.rows, ", hc ", a.hc, ", hidden ", a.hidden));
  }
}

void CudaV4Ops::HcExpand(const HcExpandArgs& a) {
  CudaBackend::OpTimer timer(backend_, "V4HcExpand");
  const cudaError_t err = kernels::HcExpandF32(a, backend_->stream_);
  if (err != cudaSuccess) {
    RecordFailure(err, "kernels::HcExpandF32",
                  absl::StrCat("rows ", a.rows, ", hc ", a.hc, ", hidden ", a.hidden));
  }
}

void CudaV4Ops::CompressWindows(const CompressWindowsArgs& a) {
  CudaBackend::OpTimer timer(backend_, "V4CompressWindows");
  const cudaError_t err = kernels::CompressWindowsF32(a, backend_->stream_);
  if (err != cudaSuccess) {
    RecordFailure(err, "kernels::CompressWindowsF32",
                  absl::StrCat("windows ", a.windows, ", ratio ", a.ratio, ", dim ", a.dim,
                               ", overlap ", a.overlap, ", row_stride ", a.row_stride));
  }
}

void CudaV4Ops::SinkAttention(const SinkAttentionArgs& a) {
  CudaBackend::OpTimer timer(backend_, "V4SinkAttention");
  kernels::SinkAttentionParams p;
  static_cast<SinkAttentionArgs&>(p) = a;
  // bf16 models take the bf16 tensor-core kernel where it runs (the operands carry bf16's
  // rounding, as the model's weights do); fp32 models the exact one.
  // The bf16 query and output (TakesBf16Attention) are that kernel's, with one split.
  if (backend_->weight_dtype() == WeightDType::kBFloat16 &&
      kernels::SinkAttentionKernelRuns(p, kernels::SinkAttentionKernel::kTensorCoreBf16)) {
    p.kernel = kernels::SinkAttentionKernel::kTensorCoreBf16;
  }
  // A prefill-sized call (kBf16AttentionMinTokens queries or more: the bf16 query and output
  // where TakesBf16Attention, else fp32, the same bits) runs on kTensorCoreBf16Prefill (one
  // split) where it runs (a selection stride up to kPrefillMaxSelected: V4-Flash's index_topk is
  // 512), else on kTensorCoreBf16. The prefill kernel reads bf16 copies made once per call (the
  // bits the kernels round the rows to): this step's keys (RoundF32ToBf16; a prefill token's
  // window rows are mostly this step's) and, where the entries' table rows are given, the blocks
  // they name (SinkAttentionEntriesToBf16: the step's sequences' streams so far, each
  // contiguous, which kTensorCoreBf16Prefill reads without the tables; only while that copy is no
  // larger than the bf16 query). The ring is read in fp32.
  const bool bf16_prefill =
      p.kernel == kernels::SinkAttentionKernel::kTensorCoreBf16 &&
      a.tokens >= kBf16AttentionMinTokens && !backend_->tuning_.batch_invariant &&
      kernels::SinkAttentionKernelRuns(p, kernels::SinkAttentionKernel::kTensorCoreBf16Prefill);
  std::unique_ptr<DeviceBuffer> kv_bf16, entries_bf16, entries_tables;
  if (bf16_prefill) {
    kv_bf16 = backend_->AllocateScratch(a.tokens * a.dim * sizeof(uint16_t));  // 256-byte aligned
    cudaError_t err =
        kernels::RoundF32ToBf16(a.tokens * a.dim, a.kv, kv_bf16->as<uint16_t>(), backend_->stream_);
    if (err != cudaSuccess) {
      return RecordFailure(err, "kernels::RoundF32ToBf16",
                           absl::StrCat("tokens ", a.tokens, ", dim ", a.dim));
    }
    p.kv_bf16 = kv_bf16->as<uint16_t>();
    const int64_t values = kernels::SinkAttentionEntriesBf16Values(a.entries, a.entry_table_rows);
    if (a.entries.data != nullptr && a.entries.block_floats % 8 == 0 && values > 0 &&
        values <= a.tokens * a.heads * a.dim) {
      entries_bf16 = backend_->AllocateScratch(values * sizeof(uint16_t));
      entries_tables =
          backend_->AllocateScratch(a.entry_table_rows * a.entries.table_stride * sizeof(int32_t));
      err = kernels::SinkAttentionEntriesToBf16(a.entries, a.entry_table_rows,
                                                entries_bf16->as<uint16_t>(),
                                                entries_tables->as<int32_t>(), backend_->stream_);
      if (err != cudaSuccess) {
        return RecordFailure(err, "kernels::SinkAttentionEntriesToBf16",
                             absl::StrCat("table rows ", a.entry_table_rows, ", table stride ",
                                          a.entries.table_stride));
      }
      p.entries_bf16 = {entries_bf16->as<uint16_t>(), entries_tables->as<int32_t>(),
                        a.entries.table_stride, a.entries.table_stride * a.entries.block_floats};
    }
    p.kernel = kernels::SinkAttentionKernel::kTensorCoreBf16Prefill;
  }
  // Batch-invariant: a fixed split count (by default it follows the token count); each token's
  // rows are cut by their own count.
  if (backend_->tuning_.batch_invariant) p.num_splits = CudaBackend::kBatchInvariantSinkSplits;
  const std::string shape =
      absl::StrCat("tokens ", a.tokens, ", heads ", a.heads, ", dim ", a.dim,
                   a.selected != nullptr ? ", selected" : "", a.q_bf16 != nullptr ? ", bf16 q" : "",
                   a.out_bf16 != nullptr ? ", bf16 out" : "");
  size_t bytes = 0;
  cudaError_t err = kernels::SinkAttentionWorkspaceBytes(p, &bytes);
  if (err != cudaSuccess) return RecordFailure(err, "kernels::SinkAttentionWorkspaceBytes", shape);
  std::unique_ptr<DeviceBuffer> workspace;
  if (bytes > 0) {
    workspace = backend_->AllocateScratch(bytes);
    p.workspace = workspace->data();
    p.workspace_bytes = bytes;
  }
  err = kernels::SinkAttentionF32(p, backend_->stream_);
  if (err != cudaSuccess) RecordFailure(err, "kernels::SinkAttentionF32", shape);
}

void CudaV4Ops::IndexerTopK(const IndexerTopKArgs& a) {
  CudaBackend::OpTimer timer(backend_, "V4IndexerTopK");
  kernels::IndexerTopKParams p;
  static_cast<IndexerTopKArgs&>(p) = a;
  // Prefill of a bf16 model: tensor-core scores over the bf16-rounded query and keys. Decode
  // (and its graphs) and batch-invariant mode keep the CPU's arithmetic.
  if (a.tokens >= kTensorCoreIndexerMinTokens &&
      backend_->weight_dtype() == WeightDType::kBFloat16 && !backend_->tuning_.batch_invariant &&
      kernels::IndexerTopKTensorCoreRuns()) {
    p.order = kernels::IndexerScoreOrder::kTensorCoreBf16;
  }
  std::unique_ptr<DeviceBuffer> workspace;
  const size_t bytes = kernels::IndexerTopKWorkspaceBytes(p);
  if (bytes > 0) {
    workspace = backend_->AllocateScratch(bytes);
    p.workspace = workspace->data();
    p.workspace_bytes = bytes;
  }
  const cudaError_t err = kernels::IndexerTopKF32(p, backend_->stream_);
  if (err != cudaSuccess) {
    RecordFailure(err, "kernels::IndexerTopKF32",
                  absl::StrCat("tokens ", a.tokens, ", heads ", a.heads, ", dim ", a.dim, ", topk ",
                               a.topk, ", max_candidates ", a.max_candidates));
  }
}

void CudaV4Ops::Route(const V4RouteArgs& a) {
  CudaBackend::OpTimer timer(backend_, "V4Route");
  const cudaError_t err = kernels::V4RouteF32(a, backend_->stream_);
  if (err != cudaSuccess) {
    RecordFailure(
        err, "kernels::V4RouteF32",
        absl::StrCat(
            "rows ", a.rows, ", experts ", a.experts, ", top_k ", a.top_k,
            a.hash_table != nullptr ? ", hash table" : "",
            a.hash_table != nullptr && a.token_ids == nullptr ? " without token ids" : ""));
  }
}

bool CudaV4Ops::RouteFromHidden(const V4RouteFromHiddenArgs& a) {
  const V4RouteArgs& r = a.route;
  if (backend_->tuning_.batch_invariant || r.rows > kRouteFromHiddenMaxTokens) return false;
  if (!kernels::V4RouteFromHiddenSupported(a)) return false;
  if (r.rows == 0) return true;
  // A token tile has at least one token, so the RouteTokensF32 counters cover every tile.
  static_assert(kRouteFromHiddenMaxTokens <= kernels::kFusedRouterTileCounters);
  std::unique_ptr<DeviceBuffer> logits =
      backend_->AllocateScratch(static_cast<size_t>(r.rows * r.experts) * sizeof(float));
  kernels::V4RouteFromHiddenParams p;
  p.args = a;
  p.logits = logits->as<float>();
  p.tile_counters = backend_->route_tile_counters_;
  CudaBackend::OpTimer timer(backend_, "V4RouteFromHidden");
  const cudaError_t err = kernels::V4RouteFromHiddenF32(p, backend_->stream_);
  if (err != cudaSuccess) {
    RecordFailure(err, "kernels::V4RouteFromHiddenF32",
                  absl::StrCat("rows ", r.rows, ", experts ", r.experts, ", top_k ", r.top_k,
                               ", hidden ", a.hidden_size));
  }
  return true;
}

void CudaV4Ops::CopyRows(const CopyRowsArgs& a) {
  CudaBackend::OpTimer timer(backend_, "V4CopyRows");
  const cudaError_t err = kernels::CopyRowsF32(a, backend_->stream_);
  if (err != cudaSuccess) {
    RecordFailure(err, "kernels::CopyRowsF32", absl::StrCat("rows ", a.rows, ", width ", a.width));
  }
}

void CudaV4Ops::SwiGluClamped(int64_t rows, int64_t inter, const float* x, float limit,
                              float* out) {
  CudaBackend::OpTimer timer(backend_, "V4SwiGluClamped");
  const cudaError_t err = kernels::SwiGluClampedF32(rows, inter, x, limit, out, backend_->stream_);
  if (err != cudaSuccess) {
    RecordFailure(err, "kernels::SwiGluClampedF32", absl::StrCat("rows ", rows, ", inter ", inter));
  }
}

}  // namespace deepinfer
