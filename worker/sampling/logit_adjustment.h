// LogitAdjustment: what a request's logit_bias, min_tokens and penalties do to one token's logit
// before the token is picked, as a plain struct shared by the host (Sampler) and the device
// (Backend::AdjustLogits, kernels/sampling:adjust_logits). Dependency-free so nvcc and the
// host compiler see the same layout and arithmetic.
//
// One entry per (row, token) that has anything to adjust; the engine builds them each step from
// the sequence's parameters and its token counts (only tokens that appear, are biased or are
// masked have an entry, so the list stays short while the vocabulary is large). The order of
// the steps is vLLM's: logit_bias and the min_tokens mask first, then repetition_penalty, then
// frequency_penalty and presence_penalty.
#ifndef DEEPINFER_WORKER_SAMPLING_LOGIT_ADJUSTMENT_H_
#define DEEPINFER_WORKER_SAMPLING_LOGIT_ADJUSTMENT_H_

#include <cstdint>

#if defined(__CUDACC__)
#define DEEPINFER_ADJUST_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DEEPINFER_ADJUST_HOST_DEVICE inline
#endif

namespace deepinfer {

struct LogitAdjustment {
  int32_t row = 0;  // row of the logits block (Sampler ignores it: one row)
  int32_t token = 0;
  // Added first: logit_bias, plus -inf for EOS and stop tokens while min_tokens is not reached.
  float bias = 0.0f;
  // Then, for a token in the prompt or already generated, the logit is divided by it when
  // positive and multiplied by it otherwise (repetition_penalty; 1: nothing).
  float repetition = 1.0f;
  // Then subtracted: frequency_penalty * (times generated) + presence_penalty * (generated at
  // all), computed by the host.
  float subtract = 0.0f;
};
static_assert(sizeof(LogitAdjustment) == 20, "LogitAdjustment is shared with device code");

// The adjusted logit. Each step is rounded on its own (explicit intrinsics on the device, where
// nvcc would otherwise contract a multiply and a subtraction into an FMA), so the host and the
// device compute the same float.
DEEPINFER_ADJUST_HOST_DEVICE float AdjustLogit(float logit, const LogitAdjustment& a) {
#if defined(__CUDA_ARCH__)
  float l = __fadd_rn(logit, a.bias);
  if (a.repetition != 1.0f) l = l > 0.0f ? __fdiv_rn(l, a.repetition) : __fmul_rn(l, a.repetition);
  return __fsub_rn(l, a.subtract);
#else
  float l = logit + a.bias;
  if (a.repetition != 1.0f) l = l > 0.0f ? l / a.repetition : l * a.repetition;
  return l - a.subtract;
#endif
}

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_SAMPLING_LOGIT_ADJUSTMENT_H_
