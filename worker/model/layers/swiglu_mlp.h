// SwiGluMlp: a dense decoder layer's block, its norm and y = down(silu(gate x) * up x), on the
// MLP ops (backend/ops/mlp_ops.h), which run the backend's fused forms where it has them.
#ifndef DEEPINFER_WORKER_MODEL_LAYERS_SWIGLU_MLP_H_
#define DEEPINFER_WORKER_MODEL_LAYERS_SWIGLU_MLP_H_

#include <cstdint>

#include "worker/backend/backend.h"
#include "worker/backend/ops/mlp_ops.h"
#include "worker/model/layers/residual_stream.h"
#include "worker/model/model_weights.h"

namespace deepinfer {

// The device matrices of an MLP of the model's weights (dense layer, shared or routed expert).
SwiGluWeights MlpView(const ModelWeights& weights, const MlpWeights& mlp);

// out [rows, hidden_size] = MLP(norm(x)). With `norm` (fused ops) the norm runs in the same op
// where the backend has one (NormedSwiGlu) and h is its scratch; null: h already holds the
// normed rows, as the GEMMs take them.
void SwiGluMlp(Backend* backend, const ModelWeights& weights, const MlpWeights& mlp,
               int64_t hidden_size, int64_t rows, const ResidualNorm* norm, ActivationView h,
               float* out, OpMode mode);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_LAYERS_SWIGLU_MLP_H_
