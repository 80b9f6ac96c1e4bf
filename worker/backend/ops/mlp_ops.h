// MLP ops: the SwiGLU MLP of dense layers and shared experts, each one call. Where the backend
// has a fused op for the arguments (Backend::GateUpSiluMulBf16, Backend::NormedDenseMlp) the
// call runs it; otherwise it runs the reference composition of primitives (Gemm, SiluMul,
// AddRmsNorm, Add), which is also what the fused op is checked against. Callers never see which.
#ifndef DEEPINFER_WORKER_BACKEND_OPS_MLP_OPS_H_
#define DEEPINFER_WORKER_BACKEND_OPS_MLP_OPS_H_

#include <cstdint>

#include "worker/backend/backend.h"
#include "worker/backend/ops/op_mode.h"

namespace deepinfer {

// A SwiGLU MLP's matrices: gate_up [2 * inter, hidden] (gate rows, then up rows), down
// [hidden, inter].
struct SwiGluWeights {
  int64_t inter = 0;
  WeightView gate_up;
  WeightView down;
};

// out = bf16(silu(g) * u) of the gate_up GEMM of a (w [2*inter, k]): Backend::GateUpSiluMulBf16
// (gate / up rounded to bf16 first) where the backend has it, else Gemm + SiluMulBf16.
void GateUpSiluMulBf16(Backend* backend, int64_t rows, int64_t inter, int64_t k, ActivationView a,
                       int64_t lda, WeightView w, int64_t ldw, uint16_t* out);

// out = down(silu(gate h) * up h) over `rows` rows of width hidden, or out += it with
// accumulate (one fp32 addition per element, as Add). With bf16_operands the activation reaches
// the down GEMM in bf16 (Backend::SwiGluMlpBf16 where the backend takes it, else
// GateUpSiluMulBf16 above and the down Gemm); else fp32 SiluMul.
void SwiGlu(Backend* backend, int64_t rows, int64_t hidden, const SwiGluWeights& w,
            ActivationView h, float* out, bool accumulate, bool bf16_operands);

// out += MLP(h) (a shared expert after the routed sum): with fused ops the down GEMM adds into
// out itself; else the MLP into scratch, then Add.
void AddSwiGlu(Backend* backend, int64_t rows, int64_t hidden, const SwiGluWeights& w,
               ActivationView h, float* out, OpMode mode);

// A dense layer's norm and MLP (DenseMlpArgs): Backend::NormedDenseMlp where the backend has
// it, else AddRmsNorm of the rows (into normed_bf16 when it is set, else d.normed) and SwiGlu of
// them (bf16 operands when normed_bf16 is set).
void NormedSwiGlu(Backend* backend, const DenseMlpArgs& d, uint16_t* normed_bf16);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_OPS_MLP_OPS_H_
