// DeviceSampler: picks a step's next tokens from logits that stay in device memory, with the
// Backend's sampling ops, so that only tokens and log-probabilities come back to the host (not
// 129280-float rows). The result is what Sampler::Sample returns for the same row, parameters
// and position: the CPU backend runs Sampler's arithmetic in these ops, the CUDA kernels follow
// it (docs/cuda/graphs-and-sampling.md, "Device sampling").
#ifndef DEEPINFER_WORKER_SAMPLING_DEVICE_SAMPLER_H_
#define DEEPINFER_WORKER_SAMPLING_DEVICE_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/sampling/sampler.h"

namespace deepinfer {

// One token to sample: from logits row `row`, as Sampler::Sample(row, params, position).
struct RowSampleRequest {
  int64_t row = 0;
  SamplingParams params;
  int64_t position = 0;
};

class DeviceSampler {
 public:
  // Whether Sample takes these parameters (top logprobs are limited to kMaxTopLogprobs on the
  // device; more must go through Sampler on host logits).
  static bool Supports(const SamplingParams& params) {
    return params.num_logprobs <= kMaxTopLogprobs;
  }

  // The SampledToken of each request, in order, from logits ([rows, vocab], device memory).
  // Greedy requests (temperature <= 0) go through one GreedySampleRows over the rows they span,
  // the others through SampleRows with per-row parameters uploaded once, top logprobs through
  // TopLogprobsRows; rows of the last two that are not consecutive are gathered first. Requests
  // with logit adjustments: their rows are copied, AdjustLogits applies the entries (uploaded
  // once for the step), SampleRows picks from the copy and TokenLogprobRows gives the raw
  // logprob of the pick. One copy
  // to the host at the end. INVALID_ARGUMENT for a request Sampler::Validate rejects, one that
  // !Supports, or a row outside [0, rows); the backend's status() if an op failed.
  static absl::StatusOr<std::vector<SampledToken>> Sample(
      Backend* backend, const float* logits, int64_t rows, int64_t vocab,
      const std::vector<RowSampleRequest>& requests);
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_SAMPLING_DEVICE_SAMPLER_H_
