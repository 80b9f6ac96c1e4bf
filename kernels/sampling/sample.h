// Seeded sampling and top log-probabilities on the device (fp32 logits): the GPU counterparts
// of worker/sampling/Sampler, behind Backend::SampleRows and Backend::TopLogprobsRows.
//
// Its per-row algorithm (sample_row.h) is also tested on the host against Sampler; the kernels
// against the CPU backend on an H200 (docs/cuda/graphs-and-sampling.md, "Device sampling", with
// their cost).
#ifndef DEEPINFER_KERNELS_SAMPLING_SAMPLE_H_
#define DEEPINFER_KERNELS_SAMPLING_SAMPLE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "worker/sampling/row_sampling_params.h"

namespace deepinfer {
namespace kernels {

// Row r of logits ([rows, vocab]) sampled with params[r] (device memory): token[r] is the token
// Sampler::Sample picks for the same logits, parameters and position, logprob[r] its
// log-softmax over the raw row. Follows Sampler step by step: candidates in (logit descending,
// lower id first) order, top-k then the top-p prefix of the top-k-normalised probabilities
// (in double; the prefix mass summed in 2^-53 fixed point), then the race argmax
// p_i / -log(U(seed, position, i)) with ties going to the earlier candidate. A row whose top_p
// is outside (0, 1] or whose temperature is NaN (Sampler's INVALID_ARGUMENT) gets token -1 and
// logprob NaN. One block per row; O(V) per row without filtering, up to O(8 V) more for top-k
// and for top-p (radix select; 2 passes each on random rows, docs/cuda/graphs-and-sampling.md).
cudaError_t SampleRowsF32(int64_t rows, int64_t vocab, const float* logits,
                          const RowSamplingParams* params, int32_t* token, float* logprob,
                          cudaStream_t stream);

// The n most likely tokens of each row (1 <= n <= kMaxTopLogprobs): ids[r * n + j] by logit
// descending, lower id first on ties; logprobs[r * n + j] = logit - logsumexp(row) (the sum
// in double). Entries j >= vocab get id -1 and logprob -inf. One block per row, O(n V).
cudaError_t TopLogprobsF32(int64_t rows, int64_t vocab, const float* logits, int32_t n,
                           int32_t* ids, float* logprobs, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_SAMPLING_SAMPLE_H_
