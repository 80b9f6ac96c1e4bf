// SequenceStep and StepOutput: one step's batch and its results, as CausalLm::Step takes and
// returns them (and the decode graph runner pads and replays them).
#ifndef DEEPINFER_WORKER_MODEL_STEP_BATCH_H_
#define DEEPINFER_WORKER_MODEL_STEP_BATCH_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "worker/sampling/sampler.h"

namespace deepinfer {

struct SequenceStep {
  std::vector<int32_t> tokens;       // new tokens, at positions position_offset, +1, ...
  int64_t position_offset = 0;       // tokens already in the cache for this sequence
  std::vector<int32_t> block_table;  // must cover position_offset + tokens.size() positions
  bool all_logits = false;           // logits for every new token, else only the last
  // If set, the next token is sampled from the last row's logits (position of the sampled
  // token = position_offset + tokens.size(), which keys the seeded random stream).
  std::optional<SamplingParams> sampling;
  // Whether StepOutput::logits carries this sequence's rows. The engine only needs the sampled
  // token: without logits, the token is sampled on the device (greedy, seeded temperature /
  // top-k / top-p, up to kMaxTopLogprobs top logprobs; worker/sampling/device_sampler.h) and
  // only the token and its log-probabilities come back to the host (not a vocabulary row).
  bool return_logits = true;
  // A bounded rebuild (CausalLm::BoundedReplayStart; 0 and 0 for an ordinary sequence): the
  // sequence's paged entries of positions [0, kept_end) were restored into its blocks, and its
  // per-sequence state holds nothing before replay_from, where the rebuild's first step starts.
  // The model attends to no window key before replay_from and leaves the kept entries as they
  // are. Pass both on every step of the sequence until it is freed.
  int64_t replay_from = 0;
  int64_t kept_end = 0;
};

struct StepOutput {
  // Per sequence, row-major [rows, vocab]: rows = tokens.size() if all_logits, else 1; empty
  // where SequenceStep::return_logits is false.
  std::vector<std::vector<float>> logits;
  // Per sequence; token -1 where SequenceStep::sampling was unset.
  std::vector<SampledToken> sampled;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_STEP_BATCH_H_
