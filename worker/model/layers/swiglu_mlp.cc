// SwiGluMlp: gate_up GEMM, SiLU-mul, down GEMM.
#include "worker/model/layers/swiglu_mlp.h"

namespace deepinfer {

absl::Status SwiGluMlp(Backend* backend, const ModelWeights& weights, const MlpWeights& w,
                       int64_t hidden_size, int64_t rows, ActivationView h, float* out,
                       bool accumulate, bool bf16_operands) {
  const int64_t H = hidden_size, I = w.inter;
  auto Floats = [backend](int64_t n) { return backend->AllocateScratch(n * sizeof(float)); };
  if (bf16_operands) {
    auto act16 = backend->AllocateScratch(rows * I * sizeof(uint16_t));
    // The backend's bf16-output gate_up where it has one (CUDA: prefill sizes), else fp32
    // gate_up values into SiLU-mul.
    if (!backend->GateUpSiluMulBf16(rows, I, H, h, H, weights.Matrix(w.gate_up), H,
                                    act16->as<uint16_t>())) {
      auto gu = Floats(rows * 2 * I);
      backend->Gemm(rows, 2 * I, H, h, H, weights.Matrix(w.gate_up), H, gu->as<float>(), 2 * I,
                    false);
      backend->SiluMulBf16(rows, I, gu->as<float>(), act16->as<uint16_t>());
    }
    backend->Gemm(rows, H, I, ActivationView::Bf16(act16->as<uint16_t>()), I,
                  weights.Matrix(w.down), I, out, H, accumulate);
    return absl::OkStatus();
  }
  auto gu = Floats(rows * 2 * I);
  backend->Gemm(rows, 2 * I, H, h, H, weights.Matrix(w.gate_up), H, gu->as<float>(), 2 * I, false);
  auto act = Floats(rows * I);
  backend->SiluMul(rows, I, gu->as<float>(), act->as<float>());
  backend->Gemm(rows, H, I, act->as<float>(), I, weights.Matrix(w.down), I, out, H, accumulate);
  return absl::OkStatus();
}

}  // namespace deepinfer
