// SampleOrCopyLogits: what every model's step does after its LM head: samples the sequences
// that want no logits on the device (DeviceSampler), copies the other rows to the host (Sampler
// picks there), and checks the backend's status.
#ifndef DEEPINFER_WORKER_MODEL_STEP_LOGITS_H_
#define DEEPINFER_WORKER_MODEL_STEP_LOGITS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/model/step_batch.h"

namespace deepinfer {

// logits: device [rows, vocab_size], each sequence's rows in batch order (all of its new tokens'
// rows with all_logits, else its last).
absl::StatusOr<StepOutput> SampleOrCopyLogits(Backend* backend, int64_t vocab_size,
                                              const std::vector<SequenceStep>& batch,
                                              const float* logits, int64_t rows);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_STEP_LOGITS_H_
