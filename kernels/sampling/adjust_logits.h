// logit_bias, min_tokens and penalties on the device: the GPU counterpart of
// Backend::AdjustLogits. One thread per entry (entries name distinct (row, token) pairs, so no
// two threads touch one logit); the arithmetic is AdjustLogit (worker/sampling/
// logit_adjustment.h), the same float operations the host does.
#ifndef DEEPINFER_KERNELS_SAMPLING_ADJUST_LOGITS_H_
#define DEEPINFER_KERNELS_SAMPLING_ADJUST_LOGITS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "worker/sampling/logit_adjustment.h"

namespace deepinfer {
namespace kernels {

// logits ([rows, vocab]) in place; entries outside [0, rows) x [0, vocab) are skipped. count
// (optional, device memory): only entries i < *count apply (the launch covers n, so it can be
// recorded once for a varying number of entries).
cudaError_t AdjustLogitsF32(int64_t rows, int64_t vocab, float* logits, int64_t n,
                            const LogitAdjustment* adjustments, const int32_t* count,
                            cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_SAMPLING_ADJUST_LOGITS_H_
