// OpMode: how the ops of a step compute, never what (CausalLm::SetFusedOps): fused ops hand each
// residual add to the next norm and let GEMMs accumulate into their output; with them and bf16
// weights, GEMM operands are handed over already rounded to bf16.
#ifndef DEEPINFER_WORKER_BACKEND_OPS_OP_MODE_H_
#define DEEPINFER_WORKER_BACKEND_OPS_OP_MODE_H_

namespace deepinfer {

struct OpMode {
  bool fused = true;
  bool bf16_operands = false;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_OPS_OP_MODE_H_
