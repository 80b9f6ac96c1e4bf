// LmHead: final norm (fused with the pending residual add or not) and the head GEMM.
#include "worker/model/layers/lm_head.h"

namespace deepinfer {

std::unique_ptr<DeviceBuffer> LmHead::Logits(int64_t rows, float* x, const float* y, float* normed,
                                             OpMode mode) {
  const int64_t H = hidden_size_, V = vocab_size_;
  auto normed16 = backend_->AllocateScratch(mode.bf16_operands ? rows * H * sizeof(uint16_t) : 1);
  const ActivationView head_in = FinalNorm(rows, x, y, normed, normed16->as<uint16_t>(), mode);
  auto logits = backend_->AllocateScratch(rows * V * sizeof(float));
  backend_->Gemm(rows, V, H, head_in, H, head_, H, logits->as<float>(), V, false);
  return logits;
}

ActivationView LmHead::FinalNorm(int64_t rows, float* x, const float* y, float* normed,
                                 uint16_t* normed_bf16, OpMode mode) {
  const int64_t H = hidden_size_;
  if (!mode.fused) {
    backend_->RmsNorm(rows, H, x, H, norm_weight_, eps_, normed, H);
    return normed;
  }
  if (mode.bf16_operands) {
    backend_->AddRmsNorm(rows, H, x, y, norm_weight_, eps_, nullptr, normed_bf16);
    return ActivationView::Bf16(normed_bf16);
  }
  if (normed == x) {
    // AddRmsNorm's output may not alias x: y is null here (see Logits).
    backend_->RmsNorm(rows, H, x, H, norm_weight_, eps_, normed, H);
  } else {
    backend_->AddRmsNorm(rows, H, x, y, norm_weight_, eps_, normed, nullptr);
  }
  return normed;
}

}  // namespace deepinfer
