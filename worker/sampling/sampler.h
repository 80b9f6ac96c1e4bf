// Sampler: picks the next token from one row of logits on the host: greedy, temperature, top-k,
// top-p, with per-request seeds, and reports log-probabilities.
//
// Seeded sampling uses the exponential race from DeepSeek's reference: among the tokens that
// survive top-k/top-p, choose argmax p_i / E_i with E_i ~ Exp(1) drawn from CounterRng keyed by
// (seed, position, token id). This samples exactly from p, and since the noise depends only on
// the request's seed and the token's position, a request gets the same tokens whatever else is
// in the batch.
#ifndef DEEPINFER_WORKER_SAMPLING_SAMPLER_H_
#define DEEPINFER_WORKER_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/sampling/logit_adjustment.h"
#include "worker/sampling/row_sampling_params.h"

namespace deepinfer {

struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy (argmax, lowest id on ties)
  int32_t top_k = 0;         // <= 0: no limit
  float top_p = 1.0f;        // in (0, 1]
  uint64_t seed = 0;
  int32_t num_logprobs = 0;  // how many top tokens to report besides the chosen one
  // Applied to the logits before the token is picked (greedy or sampled), one entry per token
  // (ids strictly ascending, `row` ignored): logit_bias, the min_tokens mask and the penalties
  // (logit_adjustment.h). Log-probabilities stay those of the raw logits, as vLLM reports them.
  std::vector<LogitAdjustment> adjustments;
};

struct SampledToken {
  int32_t token = -1;
  // log softmax of the raw logits (before temperature and filtering), as vLLM/OpenAI report.
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;  // descending, num_logprobs entries
};

// The device-memory form of (params, position) for Backend::SampleRows. num_logprobs is not
// part of it: top log-probabilities are Backend::TopLogprobsRows.
RowSamplingParams ToRowSamplingParams(const SamplingParams& params, int64_t position);

class Sampler {
 public:
  // The checks Sample makes on params: INVALID_ARGUMENT for top_p outside (0, 1], a NaN
  // temperature, a negative num_logprobs, adjustments whose tokens are not ascending within
  // [0, vocab) or whose repetition is not > 0 (DeviceSampler makes the same ones).
  static absl::Status Validate(const SamplingParams& params, int64_t vocab);
  // position: index of the token being sampled within its sequence (prompt length + generated
  // so far); it keys the random stream.
  static absl::StatusOr<SampledToken> Sample(const float* logits, int32_t vocab,
                                             const SamplingParams& params, int64_t position);
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_SAMPLING_SAMPLER_H_
