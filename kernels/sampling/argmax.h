// Greedy sampling on the device (fp32 logits): the GPU counterparts of Backend::ArgmaxRows,
// Backend::GreedySampleRows and Backend::TokenLogprobRows.
//
// Both split every row into chunks of kArgmaxChunk values, one block per chunk (so one row
// still spreads over many SMs), writing a per-chunk partial (max, argmax, sum of exp) to a
// workspace; a second kernel combines each row's partials in chunk order. The launch shapes
// depend only on rows and vocab (fixed per CUDA-graph bucket), and the result does not change
// from run to run.
#ifndef DEEPINFER_KERNELS_SAMPLING_ARGMAX_H_
#define DEEPINFER_KERNELS_SAMPLING_ARGMAX_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace deepinfer {
namespace kernels {

// Values of a row one block reduces in the first pass.
constexpr int64_t kArgmaxChunk = 4096;

// Device workspace ArgmaxRowsF32 / GreedySampleRowsF32 need for rows x vocab (16 bytes per
// chunk of each row); contents need not be initialised.
size_t ArgmaxWorkspaceBytes(int64_t rows, int64_t vocab);

// out[r] = argmax of logits row r (rows of width vocab); the lowest index wins ties; a row
// without a value above -inf gets 0 (as std::max_element).
cudaError_t ArgmaxRowsF32(int64_t rows, int64_t vocab, const float* logits, void* workspace,
                          int32_t* out, cudaStream_t stream);

// Greedy sampling with the chosen token's log-probability: token[r] = argmax of row r (lowest
// index on ties) and logprob[r] = logits[r, token] - logsumexp(logits[r, :]). Each block sums
// expf(l - its chunk's max) in double; the chunks' sums are rescaled to the row maximum in
// double (Sampler sums exp(l - max) in double: the two agree to ~1e-7 relative).
cudaError_t GreedySampleRowsF32(int64_t rows, int64_t vocab, const float* logits, void* workspace,
                                int32_t* token, float* logprob, cudaStream_t stream);

// logprob[r] = logits[r, token[r]] - logsumexp(logits[r, :]) with GreedySampleRowsF32's
// normaliser, for tokens picked elsewhere (from adjusted logits); a token outside [0, vocab)
// gets NaN. Same workspace as the two above.
cudaError_t TokenLogprobRowsF32(int64_t rows, int64_t vocab, const float* logits, void* workspace,
                                const int32_t* token, float* logprob, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_SAMPLING_ARGMAX_H_
