// Structured output on the device: logits of tokens a grammar does not allow become -inf before
// the sampling kernels run (Backend::MaskLogitsRows; the masks come from common/grammar).
#ifndef DEEPINFER_KERNELS_SAMPLING_TOKEN_MASK_H_
#define DEEPINFER_KERNELS_SAMPLING_TOKEN_MASK_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// For i in [0, n): logits[rows[i] * vocab + t] = -inf for every t whose bit is clear in
// masks[i * words + t / 32] (bit t % 32), words = (vocab + 31) / 32. rows and masks are device
// memory. Grid (word blocks, n); each thread handles one 32-token word.
cudaError_t MaskLogitsRowsF32(int64_t n, int64_t vocab, float* logits, const int32_t* rows,
                              const uint32_t* masks, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_SAMPLING_TOKEN_MASK_H_
