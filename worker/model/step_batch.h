// SequenceStep and StepOutput: one step's batch and its results, as CausalLm::Step takes and
// returns them (and the decode graph runner pads and replays them).
#ifndef DEEPINFER_WORKER_MODEL_STEP_BATCH_H_
#define DEEPINFER_WORKER_MODEL_STEP_BATCH_H_

#include <cstdint>
#include <functional>
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
  // Structured output: when set (with sampling), called once the step's forward pass is
  // enqueued and before sampling, so host work overlaps the device's, to write the tokens that
  // may be sampled: (vocab + 31) / 32 words, bit t % 32 of word t / 32 for token t. Returns
  // false to leave the row unconstrained (the engine then fails the request). The mask applies
  // to the row in place, so logprobs are over the allowed tokens. Such a step is not replayed
  // from a decode graph.
  std::function<bool(uint32_t* words)> fill_allowed_tokens;
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
