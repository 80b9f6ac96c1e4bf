// MLP ops: fused where the backend has the op, else the reference composition.
#include "worker/backend/ops/mlp_ops.h"

namespace deepinfer {
namespace {

std::unique_ptr<DeviceBuffer> Floats(Backend* backend, int64_t n) {
  return backend->AllocateScratch(n * sizeof(float));
}

}  // namespace

void GateUpSiluMulBf16(Backend* backend, int64_t rows, int64_t inter, int64_t k, ActivationView a,
                       int64_t lda, WeightView w, int64_t ldw, uint16_t* out) {
  if (backend->GateUpSiluMulBf16(rows, inter, k, a, lda, w, ldw, /*swiglu_limit=*/0.0f, out)) {
    return;
  }
  auto gu = Floats(backend, rows * 2 * inter);
  backend->Gemm(rows, 2 * inter, k, a, lda, w, ldw, gu->as<float>(), 2 * inter, false);
  backend->SiluMulBf16(rows, inter, gu->as<float>(), out);
}

void SwiGlu(Backend* backend, int64_t rows, int64_t hidden, const SwiGluWeights& w,
            ActivationView h, float* out, bool accumulate, bool bf16_operands) {
  const int64_t H = hidden, I = w.inter;
  if (bf16_operands) {
    if (backend->SwiGluMlpBf16(rows, H, I, h, w.gate_up, w.down, out, accumulate)) return;
    auto act16 = backend->AllocateScratch(rows * I * sizeof(uint16_t));
    GateUpSiluMulBf16(backend, rows, I, H, h, H, w.gate_up, H, act16->as<uint16_t>());
    backend->Gemm(rows, H, I, ActivationView::Bf16(act16->as<uint16_t>()), I, w.down, I, out, H,
                  accumulate);
    return;
  }
  auto gu = Floats(backend, rows * 2 * I);
  backend->Gemm(rows, 2 * I, H, h, H, w.gate_up, H, gu->as<float>(), 2 * I, false);
  auto act = Floats(backend, rows * I);
  backend->SiluMul(rows, I, gu->as<float>(), act->as<float>());
  backend->Gemm(rows, H, I, act->as<float>(), I, w.down, I, out, H, accumulate);
}

void AddSwiGlu(Backend* backend, int64_t rows, int64_t hidden, const SwiGluWeights& w,
               ActivationView h, float* out, OpMode mode) {
  if (mode.fused) {
    SwiGlu(backend, rows, hidden, w, h, out, /*accumulate=*/true, mode.bf16_operands);
    return;
  }
  auto mlp = Floats(backend, rows * hidden);
  SwiGlu(backend, rows, hidden, w, h, mlp->as<float>(), false, mode.bf16_operands);
  backend->Add(rows * hidden, out, mlp->as<float>(), out);
}

void NormedSwiGlu(Backend* backend, const DenseMlpArgs& d, uint16_t* normed_bf16) {
  if (backend->NormedDenseMlp(d)) return;
  backend->AddRmsNorm(d.rows, d.hidden_size, d.x, d.y, d.norm_weight, d.eps,
                      normed_bf16 == nullptr ? d.normed : nullptr, normed_bf16);
  const ActivationView h =
      normed_bf16 != nullptr ? ActivationView::Bf16(normed_bf16) : ActivationView(d.normed);
  SwiGlu(backend, d.rows, d.hidden_size, {d.inter, d.gate_up, d.down}, h, d.out, false,
         normed_bf16 != nullptr);
}

}  // namespace deepinfer
