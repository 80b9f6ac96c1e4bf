// ParityChecks: prompt logits error and teacher-forced greedy agreement.
#include "tests/parity/parity_checks.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace deepinfer {
namespace {

int32_t Argmax(const std::vector<float>& l) {
  return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
}

}  // namespace

absl::StatusOr<LogitsError> PromptLogitsError(DeepseekV3Model* model, KvBlockPool* pool,
                                              const Fixture& fx, const FixturePrompt& prompt) {
  auto blocks = pool->Allocate(pool->BlocksFor(static_cast<int64_t>(prompt.ids.size())));
  if (!blocks.ok()) return blocks.status();
  SequenceStep s;
  s.tokens = prompt.ids;
  s.block_table = *blocks;
  s.all_logits = true;
  auto r = model->Step({s}, pool);
  if (absl::Status st = pool->Free(*blocks); !st.ok()) return st;
  if (!r.ok()) return r.status();
  const std::vector<float>& ours = r->logits[0];
  if (ours.size() != prompt.ids.size() * fx.vocab) {
    return absl::InternalError("logits of the wrong size");
  }
  const float* hf = fx.logits.data() + prompt.logits_row_offset * fx.vocab;
  double max_ref = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    max_ref = std::max(max_ref, std::abs(static_cast<double>(hf[i])));
  }
  LogitsError e;
  for (size_t t = 0; t < prompt.ids.size(); ++t) {
    double diff = 0;
    for (int64_t v = 0; v < fx.vocab; ++v) {
      const size_t i = t * fx.vocab + v;
      diff = std::max(diff, std::abs(static_cast<double>(ours[i]) - hf[i]));
    }
    e.position_rel.push_back(diff / max_ref);
    e.max_rel = std::max(e.max_rel, diff / max_ref);
  }
  return e;
}

absl::StatusOr<TeacherForcedResult> TeacherForcedGreedy(DeepseekV3Model* model, KvBlockPool* pool,
                                                        const FixturePrompt& prompt) {
  const int64_t total = static_cast<int64_t>(prompt.ids.size() + prompt.greedy.size());
  auto blocks = pool->Allocate(pool->BlocksFor(total));
  if (!blocks.ok()) return blocks.status();
  SequenceStep s;
  s.tokens = prompt.ids;
  s.block_table = *blocks;
  TeacherForcedResult result;
  absl::Status st;
  for (size_t i = 0; i < prompt.greedy.size() && st.ok(); ++i) {
    auto r = model->Step({s}, pool);
    if (!r.ok()) {
      st = r.status();
      break;
    }
    result.matches += Argmax(r->logits[0]) == prompt.greedy[i];
    ++result.positions;
    s.position_offset += static_cast<int64_t>(s.tokens.size());
    s.tokens = {prompt.greedy[i]};
  }
  if (absl::Status f = pool->Free(*blocks); st.ok()) st = f;
  if (!st.ok()) return st;
  return result;
}

}  // namespace deepinfer
