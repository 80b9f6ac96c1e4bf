// SwiGluMlp: the dense block's norm and MLP as one MLP op, or the MLP of normed rows.
#include "worker/model/layers/swiglu_mlp.h"

namespace deepinfer {

SwiGluWeights MlpView(const ModelWeights& weights, const MlpWeights& mlp) {
  return {mlp.inter, weights.Matrix(mlp.gate_up), weights.Matrix(mlp.down)};
}

void SwiGluMlp(Backend* backend, const ModelWeights& weights, const MlpWeights& mlp,
               int64_t hidden_size, int64_t rows, const ResidualNorm* norm, ActivationView h,
               float* out, OpMode mode) {
  if (norm == nullptr) {
    SwiGlu(backend, rows, hidden_size, MlpView(weights, mlp), h, out, false, mode.bf16_operands);
    return;
  }
  DenseMlpArgs d;
  d.rows = rows;
  d.hidden_size = hidden_size;
  d.inter = mlp.inter;
  d.x = norm->x;
  d.y = norm->y;
  d.norm_weight = norm->weight;
  d.eps = norm->eps;
  d.normed = norm->out;
  d.gate_up = weights.Matrix(mlp.gate_up);
  d.down = weights.Matrix(mlp.down);
  d.out = out;
  NormedSwiGlu(backend, d, norm->out_bf16);
}

}  // namespace deepinfer
