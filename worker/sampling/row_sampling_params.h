// RowSamplingParams: one row's sampling parameters as a plain struct that lives in device
// memory (Backend::SampleRows, kernels/sampling:sample), next to the logits it applies to.
// Dependency-free so nvcc and the host compiler see the same layout.
#ifndef DEEPINFER_WORKER_SAMPLING_ROW_SAMPLING_PARAMS_H_
#define DEEPINFER_WORKER_SAMPLING_ROW_SAMPLING_PARAMS_H_

#include <cstdint>

namespace deepinfer {

// The fields mean what SamplingParams' fields mean (worker/sampling/sampler.h); position is
// the `position` argument of Sampler::Sample (it keys the random stream).
struct RowSamplingParams {
  float temperature = 0.0f;  // <= 0: greedy; NaN makes the row invalid
  int32_t top_k = 0;         // <= 0: no limit
  float top_p = 1.0f;        // in (0, 1]; anything else makes the row invalid
  int32_t reserved = 0;      // padding, keep 0
  uint64_t seed = 0;
  int64_t position = 0;
};
static_assert(sizeof(RowSamplingParams) == 32, "RowSamplingParams is shared with device code");

// Most top log-probabilities a row may ask for (OpenAI's limit); Backend::TopLogprobsRows.
constexpr int32_t kMaxTopLogprobs = 20;

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_SAMPLING_ROW_SAMPLING_PARAMS_H_
