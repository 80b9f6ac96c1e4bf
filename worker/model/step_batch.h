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
  // A bounded rebuild (CausalLm::BoundedReplayStart; 0 and 0 for an ordinary sequence): the
  // sequence's paged entries of positions [0, kept_end) were restored into its blocks, and its
  // per-sequence state holds nothing before replay_from, where the rebuild's first step starts.
  // The model attends to no window key before replay_from and leaves the kept entries as they
  // are. Pass both on every step of the sequence until it is freed.
  int64_t replay_from = 0;
  int64_t kept_end = 0;
  // Prefix caching: the table's first shared_blocks blocks are shared read-only with other
  // sequences (a prefix-cache hit). The step must write no entry into them; a model with
  // per-sequence state (KvBlockPool::SequenceSlot) keys it by block_table[shared_blocks], the
  // sequence's first block of its own, which the table must then have.
  int32_t shared_blocks = 0;
  // Whether StepOutput::hidden carries this sequence's rows (a draft head's input).
  bool return_hidden = false;
  // Verification of drafts (speculative decoding): empty, or one entry per new token (with
  // all_logits): row j's next token is picked as `sampling` would pick it at position
  // position_offset + j + 1 with these parameters (on the device where DeviceSampler::Supports
  // them, else on the host), and StepOutput::row_sampled carries the picks. With return_logits
  // false no logit row leaves the device.
  std::vector<SamplingParams> row_sampling;
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
  // Per sequence, one per new token where SequenceStep::row_sampling is set, else empty.
  std::vector<std::vector<SampledToken>> row_sampled;
  // Per sequence, row-major [tokens.size(), width]: the residual stream after the last decoder
  // layer (before the final norm) for every new token; empty unless SequenceStep::return_hidden.
  // width is hidden_size, or hc_mult * hidden_size where the model keeps hc_mult residual
  // streams (DeepSeek-V4's hyper-connections: every stream, before the head collapses them).
  std::vector<std::vector<float>> hidden;
};

// One sequence's rows for the draft head (CausalLm::Draft, multi-token prediction). Row j is
// position position_offset + j: it combines `hidden` row j (the main model's hidden state at that
// position, or for a recursive draft the draft head's own output of the row before) with the
// embedding of tokens[j], the token that follows that position, and predicts the token after
// tokens[j]. The rows' entries are written into the draft head's layers of the KV cache.
struct DraftStep {
  std::vector<int32_t> tokens;
  std::vector<float> hidden;  // [tokens.size(), width] (width as StepOutput::hidden's)
  int64_t position_offset = 0;
  std::vector<int32_t> block_table;  // the sequence's; must cover its rows
  int32_t module = 0;                // which MTP module (< CausalLm::num_draft_layers())
  // The sequence's SequenceStep fields of the same names (a model with per-sequence state finds
  // the sequence's state slot and its rebuild's bounds by them; the paged MLA cache ignores
  // them).
  int32_t shared_blocks = 0;
  int64_t replay_from = 0;
  int64_t kept_end = 0;
};

struct DraftOutput {
  // Per sequence, from its last row: the draft head's greedy token, the probability it gave that
  // token (softmax of the raw logits) and its hidden state [width] (the next recursive draft's
  // input).
  std::vector<int32_t> token;
  std::vector<float> probability;
  std::vector<std::vector<float>> hidden;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_STEP_BATCH_H_
