// Greedy sampling on the device (fp32 logits): the GPU counterpart of Backend::ArgmaxRows.
#ifndef DEEPINFER_KERNELS_SAMPLING_ARGMAX_H_
#define DEEPINFER_KERNELS_SAMPLING_ARGMAX_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// out[r] = argmax of logits row r (rows of width vocab); the lowest index wins ties.
cudaError_t ArgmaxRowsF32(int64_t rows, int64_t vocab, const float* logits, int32_t* out,
                          cudaStream_t stream);

// Greedy sampling with the chosen token's log-probability: token[r] = argmax of row r (lowest
// index on ties) and logprob[r] = logits[r, token] - logsumexp(logits[r, :]) (the max and the
// sum of exp(l - max) accumulated in double, as worker/sampling/Sampler does on the host).
cudaError_t GreedySampleRowsF32(int64_t rows, int64_t vocab, const float* logits, int32_t* token,
                                float* logprob, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_SAMPLING_ARGMAX_H_
