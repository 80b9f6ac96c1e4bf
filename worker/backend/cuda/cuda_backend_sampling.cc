// CudaBackend's sampling ops: argmax, greedy and sampled tokens with their logprobs, top
// logprobs, logit adjustments, raw logprobs of given tokens.
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/sampling/adjust_logits.h"
#include "kernels/sampling/argmax.h"
#include "kernels/sampling/sample.h"
#include "kernels/sampling/token_mask.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/op_timer.h"

namespace deepinfer {

void CudaBackend::ArgmaxRows(int64_t rows, int64_t vocab, const float* logits, int32_t* out) {
  OpTimer timer(this, "ArgmaxRows");
  auto workspace = AllocateScratch(kernels::ArgmaxWorkspaceBytes(rows, vocab));
  Check(kernels::ArgmaxRowsF32(rows, vocab, logits, workspace->data(), out, stream_),
        "kernels::ArgmaxRowsF32");
}

void CudaBackend::GreedySampleRows(int64_t rows, int64_t vocab, const float* logits, int32_t* token,
                                   float* logprob) {
  OpTimer timer(this, "GreedySampleRows");
  auto workspace = AllocateScratch(kernels::ArgmaxWorkspaceBytes(rows, vocab));
  Check(
      kernels::GreedySampleRowsF32(rows, vocab, logits, workspace->data(), token, logprob, stream_),
      "kernels::GreedySampleRowsF32");
}

void CudaBackend::MaskLogitsRows(int64_t n, int64_t vocab, float* logits, const int32_t* rows,
                                 const uint32_t* masks) {
  OpTimer timer(this, "MaskLogitsRows");
  Check(kernels::MaskLogitsRowsF32(n, vocab, logits, rows, masks, stream_),
        "kernels::MaskLogitsRowsF32");
}

void CudaBackend::SampleRows(int64_t rows, int64_t vocab, const float* logits,
                             const RowSamplingParams* params, int32_t* token, float* logprob) {
  OpTimer timer(this, "SampleRows");
  if (vocab <= 0 || vocab > std::numeric_limits<int32_t>::max()) {
    Record(absl::InvalidArgumentError(
        absl::StrCat("SampleRows: vocab must be in [1, 2^31), got ", vocab)));
    return;
  }
  Check(kernels::SampleRowsF32(rows, vocab, logits, params, token, logprob, stream_),
        "kernels::SampleRowsF32");
}

void CudaBackend::TopLogprobsRows(int64_t rows, int64_t vocab, const float* logits, int32_t n,
                                  int32_t* ids, float* logprobs) {
  OpTimer timer(this, "TopLogprobsRows");
  if (n < 1 || n > kMaxTopLogprobs) {
    Record(absl::InvalidArgumentError(
        absl::StrCat("TopLogprobsRows: n must be in [1, ", kMaxTopLogprobs, "], got ", n)));
    return;
  }
  if (vocab <= 0 || vocab > std::numeric_limits<int32_t>::max()) {
    Record(absl::InvalidArgumentError(
        absl::StrCat("TopLogprobsRows: vocab must be in [1, 2^31), got ", vocab)));
    return;
  }
  Check(kernels::TopLogprobsF32(rows, vocab, logits, n, ids, logprobs, stream_),
        "kernels::TopLogprobsF32");
}

void CudaBackend::AdjustLogits(int64_t rows, int64_t vocab, float* logits, int64_t n,
                               const LogitAdjustment* adjustments, const int32_t* count) {
  OpTimer timer(this, "AdjustLogits");
  Check(kernels::AdjustLogitsF32(rows, vocab, logits, n, adjustments, count, stream_),
        "kernels::AdjustLogitsF32");
}

void CudaBackend::TokenLogprobRows(int64_t rows, int64_t vocab, const float* logits,
                                   const int32_t* token, float* logprob) {
  OpTimer timer(this, "TokenLogprobRows");
  if (vocab <= 0 || vocab > std::numeric_limits<int32_t>::max()) {
    Record(absl::InvalidArgumentError(
        absl::StrCat("TokenLogprobRows: vocab must be in [1, 2^31), got ", vocab)));
    return;
  }
  auto workspace = AllocateScratch(kernels::ArgmaxWorkspaceBytes(rows, vocab));
  Check(
      kernels::TokenLogprobRowsF32(rows, vocab, logits, workspace->data(), token, logprob, stream_),
      "kernels::TokenLogprobRowsF32");
}

}  // namespace deepinfer
