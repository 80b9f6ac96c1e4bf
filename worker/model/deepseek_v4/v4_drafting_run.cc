// RunV4Drafting: plain decoding or verified drafts over a batch of prompts.
#include "worker/model/deepseek_v4/v4_drafting_run.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "worker/kv_cache/kv_block_pool.h"

namespace deepinfer {
namespace {

int32_t Argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

}  // namespace

absl::StatusOr<V4DraftingRun> RunV4Drafting(CausalLm* model, Backend* backend,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            int64_t generated, bool speculative,
                                            std::vector<std::vector<int32_t>>* continuation) {
  const int64_t V = model->config().vocab_size;
  const size_t n = prompts.size();
  std::vector<std::vector<int32_t>>& tokens = *continuation;
  V4DraftingRun seen;
  seen.logits.resize(n);
  seen.drafts.resize(n);
  auto pool = KvBlockPool::Create(backend, {model->CacheSpec(), 96, 16});
  if (!pool.ok()) return pool.status();
  std::vector<std::vector<int32_t>> tables(n);
  std::vector<int64_t> computed(n), hidden_from(n, 0);
  std::vector<std::vector<float>> hidden(n);
  if (!speculative) tokens = prompts;
  for (size_t i = 0; i < n; ++i) {
    const int64_t need = static_cast<int64_t>(prompts[i].size()) + generated + 8;
    auto blocks = (*pool)->Allocate(static_cast<int32_t>((need + 15) / 16));
    if (!blocks.ok()) return blocks.status();
    tables[i] = *blocks;
  }
  // Round 1 of the MTP module over the rows [hidden_from, computed) of sequences `live`: the
  // draft from each one's last row.
  auto round1 = [&](const std::vector<size_t>& live) -> absl::Status {
    std::vector<DraftStep> batch;
    for (size_t i : live) {
      DraftStep d;
      d.position_offset = hidden_from[i];
      d.tokens.assign(tokens[i].begin() + hidden_from[i] + 1, tokens[i].begin() + computed[i] + 1);
      d.hidden = hidden[i];
      d.block_table = tables[i];
      batch.push_back(std::move(d));
    }
    auto out = model->Draft(batch, pool->get());
    if (!out.ok()) return out.status();
    for (size_t b = 0; b < live.size(); ++b) {
      const size_t i = live[b];
      seen.drafts[i][computed[i] - 1] = {out->token[b], out->probability[b], out->hidden[b]};
    }
    return absl::OkStatus();
  };
  std::vector<size_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = i;
  {
    std::vector<SequenceStep> batch(n);
    for (size_t i = 0; i < n; ++i) {
      batch[i].tokens = prompts[i];
      batch[i].block_table = tables[i];
      batch[i].return_hidden = true;
    }
    auto out = model->Step(batch, pool->get());
    if (!out.ok()) return out.status();
    for (size_t i = 0; i < n; ++i) {
      computed[i] = static_cast<int64_t>(prompts[i].size());
      seen.logits[i][computed[i] - 1] = out->logits[i];
      if (!speculative) tokens[i].push_back(Argmax(out->logits[i].data(), V));
      hidden[i] = std::move(out->hidden[i]);
    }
    if (absl::Status st = round1(all); !st.ok()) return st;
  }
  for (int64_t step = 0;; ++step) {
    std::vector<size_t> live;
    for (size_t i = 0; i < n; ++i) {
      // The plain run goes 4 tokens further: the drafts and rows of the last verifications.
      const int64_t end = static_cast<int64_t>(prompts[i].size()) + generated;
      if (computed[i] < (speculative ? end : end + 4)) live.push_back(i);
    }
    if (live.empty()) break;
    std::vector<SequenceStep> batch;
    std::vector<int64_t> accepted(n, 0);
    for (size_t i : live) {
      const int64_t c = computed[i];
      SequenceStep s;
      s.tokens = {tokens[i][c]};
      if (speculative) {
        // k drafts, the one at index `wrong` (k: none) not the continuation's.
        const int64_t k = 1 + (step + static_cast<int64_t>(i)) % 3;
        const int64_t wrong = (step + 2 * static_cast<int64_t>(i)) % (k + 1);
        std::vector<int32_t> drafts;
        for (int64_t j = 0; j < k; ++j) {
          const int32_t right = tokens[i][c + 1 + j];
          drafts.push_back(j == wrong ? static_cast<int32_t>((right + 1) % V) : right);
        }
        accepted[i] = std::min(wrong, k);
        // The module's recursive rounds over them: rows past the accepted ones.
        std::vector<float> h = seen.drafts[i][c - 1].hidden;
        for (int64_t r = 2; r <= k; ++r) {
          DraftStep d;
          d.tokens = {drafts[r - 2]};
          d.hidden = h;
          d.position_offset = c + r - 2;
          d.block_table = tables[i];
          auto out = model->Draft({d}, pool->get());
          if (!out.ok()) return out.status();
          h = out->hidden[0];
        }
        s.tokens.insert(s.tokens.end(), drafts.begin(), drafts.end());
      }
      s.position_offset = c;
      s.block_table = tables[i];
      s.all_logits = true;
      s.return_hidden = true;
      batch.push_back(std::move(s));
    }
    auto out = model->Step(batch, pool->get());
    if (!out.ok()) return out.status();
    for (size_t b = 0; b < live.size(); ++b) {
      const size_t i = live[b];
      const int64_t c = computed[i], a = accepted[i];
      for (int64_t r = 0; r <= a; ++r) {
        seen.logits[i][c + r].assign(out->logits[b].begin() + r * V,
                                     out->logits[b].begin() + (r + 1) * V);
      }
      if (!speculative) tokens[i].push_back(Argmax(out->logits[b].data(), V));
      const size_t width = out->hidden[b].size() / batch[b].tokens.size();
      hidden[i].assign(out->hidden[b].begin(), out->hidden[b].begin() + (a + 1) * width);
      hidden_from[i] = c;
      computed[i] = c + a + 1;
    }
    if (absl::Status st = round1(live); !st.ok()) return st;
  }
  return seen;
}

}  // namespace deepinfer
