// The step benchmark's mixed steps (deepinfer-bench --mixed-steps D:P): one step of D decode
// rows and P prompt tokens, as the engine's scheduler forms a serving step once it runs
// requests and admits new ones (worker/engine/engine.cc, Engine::Step): the decode rows first,
// one token each after their cached context, each sampling its next token; then the prompt
// tokens, cut into chunks over back-to-back prompts of one length L: the first chunk continues
// a prompt whose first L / 2 tokens an earlier step computed (the engine's chunked prefill
// finishes, at the start of a step, the prompt the previous step's token budget cut), the next
// ones are fresh prompts, and the last is cut where the P tokens end. A chunk that reaches its
// prompt's end samples the prompt's first token; a cut one samples nothing. L / 2: a budget
// that cuts prompts at points spread over their length leaves half of one on average.
//
// e2e_job.py prices a job's mixed steps (docs/e2e-jobs.md, "ideal") with these step times,
// which hold what a fresh prefill of D + P tokens leaves out: the decode rows' attention over
// their contexts, the continued chunk's attention to its earlier tokens and the decode rows'
// sampling.
#ifndef DEEPINFER_TOOLS_BENCH_MIXED_STEP_H_
#define DEEPINFER_TOOLS_BENCH_MIXED_STEP_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/causal_lm.h"
#include "worker/model/step_batch.h"

namespace deepinfer {

// D decode rows and P prompt tokens, both >= 1.
struct MixedStepShape {
  int64_t decode_rows = 0;
  int64_t prompt_tokens = 0;
};

// "D:P[,D:P...]" (e.g. "64:512,256:2048"); "" is no shapes. INVALID_ARGUMENT naming the part
// that is not two whole numbers >= 1 joined by ':'.
absl::StatusOr<std::vector<MixedStepShape>> ParseMixedSteps(const std::string& text);

// One prompt's part of a mixed step.
struct PromptChunk {
  int64_t offset = 0;      // the prompt's tokens an earlier step computed
  int64_t tokens = 0;      // computed in this step
  bool completes = false;  // reaches the prompt's end: samples its first token
};

// The chunks of `prompt_tokens` tokens over back-to-back prompts of `prompt_length` tokens,
// the first at offset prompt_length / 2 (see the top comment). Both must be >= 1.
std::vector<PromptChunk> MixedPromptChunks(int64_t prompt_tokens, int64_t prompt_length);

// Blocks of `block_size` positions the prompt sequences of one mixed step take (freed after
// the step); the decode rows' blocks are the caller's.
int64_t MixedPromptBlocks(int64_t prompt_tokens, int64_t prompt_length, int64_t block_size);

struct MixedStepOptions {
  int64_t prompt_length = 0;  // L
  int64_t timed_steps = 3;    // after one untimed step of the same shape
  // The prompts' first tokens are sampled with these parameters (a seed per row); the decode
  // rows keep the sampling their SequenceSteps carry.
  SamplingParams prompt_sampling;
};

// What one rank measured for one shape.
struct MixedStepTimes {
  std::vector<double> step_seconds;  // the timed steps
  int64_t prompts = 0;               // sequences the prompt tokens belong to
  int64_t sampled_rows = 0;          // decode rows + prompts that complete
};

// Runs 1 + options.timed_steps mixed steps of `decode` (the shape's D sequences, each with its
// context cached and its next token as its one token, sampling set: ready for a decode step)
// and P prompt tokens laid out by MixedPromptChunks over new sequences (random tokens from
// `token`; their blocks taken from `pool` before each step and freed after it; a continued
// prompt's first part computed by an untimed step of its own). The decode rows advance one
// position per step, taking the token they sampled. `before_step` runs before every step,
// untimed (expert-parallel ranks line up there: every rank must make the same calls). Each
// timed step is timed to the end of Model::Step (the sampled tokens on the host).
// INVALID_ARGUMENT for a shape whose D is not decode->size() or options without a prompt
// length; the pool's and the model's errors.
absl::StatusOr<MixedStepTimes> MeasureMixedStep(CausalLm* model, KvBlockPool* pool,
                                                const MixedStepShape& shape,
                                                const MixedStepOptions& options,
                                                const std::function<int32_t()>& token,
                                                const std::function<absl::Status()>& before_step,
                                                std::vector<SequenceStep>* decode);

// A shape's figures over the ranks (per step the slowest rank's time).
struct MixedStepResult {
  MixedStepShape shape;
  int64_t context = 0;        // the decode rows' cached tokens at the untimed first step
  int64_t prompt_length = 0;  // L
  int64_t prompts = 0;
  int64_t sampled_rows = 0;
  int64_t timed_steps = 0;
  double p50_seconds = 0;
  double p99_seconds = 0;
  double tokens_per_s = 0;  // (D + P) / p50, one rank
};

// The report's lines (one per shape) and the JSON list's entries (without the brackets).
std::string FormatMixedStepReport(const std::vector<MixedStepResult>& results);
std::string FormatMixedStepJson(const std::vector<MixedStepResult>& results);

}  // namespace deepinfer

#endif  // DEEPINFER_TOOLS_BENCH_MIXED_STEP_H_
