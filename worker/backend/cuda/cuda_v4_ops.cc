// CudaV4Ops: each op one kernel of kernels/v4 on the backend's stream.
#include "worker/backend/cuda/cuda_v4_ops.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/v4/compress_windows.h"
#include "kernels/v4/copy_rows.h"
#include "kernels/v4/hyper_connection.h"
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

// Lead: wire kernels::SinkAttention (//kernels/v4:sink_attention) here.
void CudaV4Ops::SinkAttention(const SinkAttentionArgs& a) {
  backend_->Record(absl::UnimplementedError(
      "CudaV4Ops::SinkAttention: DeepSeek-V4's sink attention is not yet on CUDA"));
}

// Lead: wire kernels::IndexerTopK (//kernels/v4:indexer_topk) here.
void CudaV4Ops::IndexerTopK(const IndexerTopKArgs& a) {
  backend_->Record(absl::UnimplementedError(
      "CudaV4Ops::IndexerTopK: DeepSeek-V4's lightning indexer is not yet on CUDA"));
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
