// PlainResidualStream: deferred (fused) or immediate residual adds and norms.
#include "worker/model/layers/residual_stream.h"

namespace deepinfer {

PlainResidualStream::PlainResidualStream(Backend* backend, int64_t rows, int64_t hidden, float eps,
                                         OpMode mode, float* x, float* block_out)
    : backend_(backend),
      rows_(rows),
      hidden_(hidden),
      eps_(eps),
      mode_(mode),
      x_(x),
      y_(block_out) {
  // Per-step temporaries, written by an op before they are read (not zeroed).
  h_ = backend_->AllocateScratch(rows_ * hidden_ * sizeof(float));
  if (mode_.bf16_operands) h16_ = backend_->AllocateScratch(rows_ * hidden_ * sizeof(uint16_t));
}

ActivationView PlainResidualStream::h_gemm() const {
  if (h16_ != nullptr) return ActivationView::Bf16(h16_->as<uint16_t>());
  return ActivationView(h_->as<float>());
}

const ResidualNorm* PlainResidualStream::Norm(const float* weight) {
  if (!mode_.fused) {
    backend_->RmsNorm(rows_, hidden_, x_, hidden_, weight, eps_, h_->as<float>(), hidden_);
    return nullptr;
  }
  norm_.x = x_;
  norm_.y = pending_ ? y_ : nullptr;
  norm_.weight = weight;
  norm_.eps = eps_;
  norm_.out = h_->as<float>();
  norm_.out_bf16 = h16_ != nullptr ? h16_->as<uint16_t>() : nullptr;
  pending_ = false;
  return &norm_;
}

void PlainResidualStream::Add() {
  if (mode_.fused) {
    pending_ = true;
    return;
  }
  backend_->Add(rows_ * hidden_, x_, y_, x_);
}

}  // namespace deepinfer
