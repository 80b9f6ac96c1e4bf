// LmHead: the end of a decoder stack, the final norm of the rows whose logits are wanted and the
// LM head's GEMM into logits [rows, vocab]. With fused ops the norm adds the last block's
// pending output (PlainResidualStream::pending) and, with bf16 weights, hands the GEMM its
// operand in bf16.
#ifndef DEEPINFER_WORKER_MODEL_LAYERS_LM_HEAD_H_
#define DEEPINFER_WORKER_MODEL_LAYERS_LM_HEAD_H_

#include <cstdint>
#include <memory>

#include "worker/backend/backend.h"
#include "worker/backend/ops/op_mode.h"

namespace deepinfer {

class LmHead {
 public:
  // norm_weight: device fp32 [hidden]; head: [vocab, hidden] in the weights' dtype. Both owned
  // by the caller's weights.
  LmHead(Backend* backend, int64_t hidden_size, int64_t vocab_size, float eps,
         const float* norm_weight, WeightView head)
      : backend_(backend),
        hidden_size_(hidden_size),
        vocab_size_(vocab_size),
        eps_(eps),
        norm_weight_(norm_weight),
        head_(head) {}

  // Logits of `rows` contiguous rows of x. y: the last block's output still to be added to them
  // (null: added already). normed: [rows, hidden] for the norm's output, which may be x itself
  // only when y is null.
  std::unique_ptr<DeviceBuffer> Logits(int64_t rows, float* x, const float* y, float* normed,
                                       OpMode mode);

 private:
  // The final norm into normed, or with bf16 operands into normed_bf16; returns the head's
  // operand.
  ActivationView FinalNorm(int64_t rows, float* x, const float* y, float* normed,
                           uint16_t* normed_bf16, OpMode mode);

  Backend* const backend_;
  const int64_t hidden_size_, vocab_size_;
  const float eps_;
  const float* const norm_weight_;
  const WeightView head_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_LAYERS_LM_HEAD_H_
