// SwiGluMlp: y = down(silu(gate x) * up x), the MLP of dense layers and of shared and routed
// experts, on the backend's ops.
#ifndef DEEPINFER_WORKER_MODEL_LAYERS_SWIGLU_MLP_H_
#define DEEPINFER_WORKER_MODEL_LAYERS_SWIGLU_MLP_H_

#include <cstdint>

#include "absl/status/status.h"
#include "worker/backend/backend.h"
#include "worker/model/model_weights.h"

namespace deepinfer {

// out = MLP(h) over `rows` rows of width hidden_size, or out += MLP(h) with accumulate. With
// bf16_operands (fused ops, bf16 weights) the activation reaches the down GEMM in bf16 (and
// the backend's bf16-output gate_up where it has one).
absl::Status SwiGluMlp(Backend* backend, const ModelWeights& weights, const MlpWeights& w,
                       int64_t hidden_size, int64_t rows, ActivationView h, float* out,
                       bool accumulate, bool bf16_operands);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_LAYERS_SWIGLU_MLP_H_
