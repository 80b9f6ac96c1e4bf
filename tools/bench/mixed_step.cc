#include "tools/bench/mixed_step.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace deepinfer {

absl::StatusOr<std::vector<MixedStepShape>> ParseMixedSteps(const std::string& text) {
  std::vector<MixedStepShape> out;
  if (text.empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> dp = absl::StrSplit(part, ':');
    MixedStepShape s;
    if (dp.size() != 2 || !absl::SimpleAtoi(dp[0], &s.decode_rows) ||
        !absl::SimpleAtoi(dp[1], &s.prompt_tokens) || s.decode_rows < 1 || s.prompt_tokens < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--mixed-steps takes D:P[,D:P...], D decode rows and P prompt tokens, both >= 1 "
          "(e.g. 64:512,256:2048); '",
          part, "' is not D:P"));
    }
    out.push_back(s);
  }
  return out;
}

std::vector<PromptChunk> MixedPromptChunks(int64_t prompt_tokens, int64_t prompt_length) {
  std::vector<PromptChunk> out;
  int64_t offset = prompt_length / 2;
  for (int64_t left = prompt_tokens; left > 0 && prompt_length > 0;) {
    PromptChunk c;
    c.offset = offset;
    c.tokens = std::min(left, prompt_length - offset);
    c.completes = offset + c.tokens == prompt_length;
    out.push_back(c);
    left -= c.tokens;
    offset = 0;
  }
  return out;
}

int64_t MixedPromptBlocks(int64_t prompt_tokens, int64_t prompt_length, int64_t block_size) {
  int64_t blocks = 0;
  for (const PromptChunk& c : MixedPromptChunks(prompt_tokens, prompt_length)) {
    blocks += (c.offset + c.tokens + block_size - 1) / block_size;
  }
  return blocks;
}

absl::StatusOr<MixedStepTimes> MeasureMixedStep(CausalLm* model, KvBlockPool* pool,
                                                const MixedStepShape& shape,
                                                const MixedStepOptions& options,
                                                const std::function<int32_t()>& token,
                                                const std::function<absl::Status()>& before_step,
                                                std::vector<SequenceStep>* decode) {
  if (shape.decode_rows != static_cast<int64_t>(decode->size()) || shape.prompt_tokens < 1 ||
      options.prompt_length < 1 || options.timed_steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bench: mixed step ", shape.decode_rows, ":", shape.prompt_tokens, " with ", decode->size(),
        " decode sequences, prompt length ", options.prompt_length, " and ", options.timed_steps,
        " timed steps (want D = the sequences, P, L, steps >= 1)"));
  }
  using Clock = std::chrono::steady_clock;
  const std::vector<PromptChunk> chunks =
      MixedPromptChunks(shape.prompt_tokens, options.prompt_length);
  const int64_t bs = pool->block_size();
  MixedStepTimes times;
  times.prompts = static_cast<int64_t>(chunks.size());
  times.sampled_rows = shape.decode_rows;
  for (const PromptChunk& c : chunks) times.sampled_rows += c.completes ? 1 : 0;

  for (int64_t step = 0; step <= options.timed_steps; ++step) {
    // The prompt sequences, each holding its prompt up to the end of its chunk.
    std::vector<SequenceStep> prompts(chunks.size());
    std::vector<std::vector<int32_t>> tables;
    absl::Status st;
    for (size_t j = 0; j < chunks.size() && st.ok(); ++j) {
      const PromptChunk& c = chunks[j];
      absl::StatusOr<std::vector<int32_t>> blocks =
          pool->Allocate(static_cast<int32_t>((c.offset + c.tokens + bs - 1) / bs));
      if (!blocks.ok()) {
        st = blocks.status();
        break;
      }
      tables.push_back(*blocks);
      SequenceStep& p = prompts[j];
      p.block_table = *std::move(blocks);
      p.tokens.resize(c.offset + c.tokens);
      for (int32_t& t : p.tokens) t = token();
      p.return_logits = false;
    }
    // A continued prompt: its first part, untimed, as the step before would have computed it.
    if (st.ok() && chunks[0].offset > 0) {
      SequenceStep first = prompts[0];
      first.tokens.resize(chunks[0].offset);
      st = before_step();
      if (st.ok()) st = model->Step({first}, pool).status();
    }
    if (st.ok()) {
      std::vector<SequenceStep> batch = *decode;
      for (size_t j = 0; j < chunks.size(); ++j) {
        SequenceStep& p = prompts[j];
        p.tokens.erase(p.tokens.begin(), p.tokens.begin() + chunks[j].offset);
        p.position_offset = chunks[j].offset;
        if (chunks[j].completes) {
          p.sampling = options.prompt_sampling;
          p.sampling->seed = static_cast<uint64_t>(shape.decode_rows) + j;
        }
        batch.push_back(std::move(p));
      }
      st = before_step();
      if (st.ok()) {
        const Clock::time_point t0 = Clock::now();
        absl::StatusOr<StepOutput> out = model->Step(batch, pool);
        const Clock::time_point t1 = Clock::now();
        if (!out.ok()) {
          st = out.status();
        } else {
          if (step > 0)
            times.step_seconds.push_back(std::chrono::duration<double>(t1 - t0).count());
          for (size_t i = 0; i < decode->size(); ++i) {
            (*decode)[i].position_offset += 1;
            (*decode)[i].tokens = {out->sampled[i].token};
          }
        }
      }
    }
    for (const std::vector<int32_t>& t : tables) {
      absl::Status freed = pool->Free(t);
      if (st.ok()) st = freed;
    }
    if (!st.ok()) return st;
  }
  return times;
}

std::string FormatMixedStepReport(const std::vector<MixedStepResult>& results) {
  std::string out;
  for (const MixedStepResult& m : results) {
    absl::StrAppendFormat(
        &out,
        "mixed: %d decode rows at context %d + %d prompt tokens (%d prompts of %d, the first "
        "continued from offset %d), %d rows sampled, %d timed steps, p50 %.4f s, p99 %.4f s, "
        "%.1f tok/s\n",
        m.shape.decode_rows, m.context, m.shape.prompt_tokens, m.prompts, m.prompt_length,
        m.prompt_length / 2, m.sampled_rows, m.timed_steps, m.p50_seconds, m.p99_seconds,
        m.tokens_per_s);
  }
  return out;
}

std::string FormatMixedStepJson(const std::vector<MixedStepResult>& results) {
  std::string out;
  for (const MixedStepResult& m : results) {
    absl::StrAppendFormat(
        &out,
        "%s{\"decode_rows\": %d, \"prompt_tokens\": %d, \"context\": %d, \"prompt_length\": %d, "
        "\"prompts\": %d, \"sampled_rows\": %d, \"timed_steps\": %d, \"p50_s\": %.6f, "
        "\"p99_s\": %.6f, \"tokens_per_s\": %.3f}",
        out.empty() ? "" : ", ", m.shape.decode_rows, m.shape.prompt_tokens, m.context,
        m.prompt_length, m.prompts, m.sampled_rows, m.timed_steps, m.p50_seconds, m.p99_seconds,
        m.tokens_per_s);
  }
  return out;
}

}  // namespace deepinfer
