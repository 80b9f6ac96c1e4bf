// SampleOrCopyLogits: a Step's tail after the LM head, the sampling family's one call. Sequences
// that want no logits and whose sampling the device supports are sampled there (DeviceSampler,
// only tokens and log-probabilities come back), every row of a verified sequence too
// (SequenceStep::row_sampling); the rows of the others are copied to the host (Sampler picks
// there). Structured-output masks (SequenceStep::fill_allowed_tokens) are applied
// to their rows first, before any logit adjustment or sampling. It also checks the backend's
// status, which the copies have waited for.
#ifndef DEEPINFER_WORKER_MODEL_LAYERS_STEP_SAMPLING_H_
#define DEEPINFER_WORKER_MODEL_LAYERS_STEP_SAMPLING_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/model/step_batch.h"

namespace deepinfer {

// logits: device [rows, vocab_size], each sequence's rows in batch order (every row of an
// all_logits sequence, else its last). A masked row's disallowed logits become -inf in place.
absl::StatusOr<StepOutput> SampleOrCopyLogits(Backend* backend, int64_t vocab_size,
                                              const std::vector<SequenceStep>& batch, float* logits,
                                              int64_t rows);

// The draft head's picks (CausalLm::Draft): per row of logits (device [rows, vocab_size]), the
// greedy token (lowest id on ties) and the probability the row's softmax gives it, computed on
// the device (Backend::GreedySampleRows), so that only rows x (token, probability) come back.
// The backend's status if an op failed.
absl::Status GreedyPicks(Backend* backend, int64_t vocab_size, const float* logits, int64_t rows,
                         std::vector<int32_t>* token, std::vector<float>* probability);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_LAYERS_STEP_SAMPLING_H_
