// DeepSeek-V4's verification steps and MTP drafts against plain decoding, on the CPU backend
// (batch-invariant: a row's values do not depend on what else its step computes), for both V4
// fixtures with a generated MTP module. Every prompt of a fixture runs in one batch; after the
// prefill each sequence goes on by steps of 1 + k rows (k = 1, 2, 3 in turn) whose drafts are the
// plain continuation's tokens except one forced wrong at a rotating index, so that runs of drafts
// are accepted whole and cut at every index, and the rejected rows fall on every phase of the
// compress ratios (4, 8, 16) and sliding windows (8, 16). Before each verification the MTP module
// drafts recursively over the same drafts, writing its own rows past the accepted tokens.
//
// With spare ring rows for 3 drafts (ModelConfig::speculative_tokens), every verified row whose
// inputs were accepted has the plain run's logits bit for bit, and every round-1 draft of the MTP
// module (token, probability, residual streams) the plain run's: the rejected rows left no trace
// in the window rings, compressor rows, compressed entries or indexer keys. Without spare rows the
// same schedule changes accepted rows (what the test would see if a trace were left).
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/deepseek_v4/v4_mtp_fixture.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

constexpr int64_t kGenerated = 40;  // tokens each sequence generates with drafts

struct Drafted {
  int32_t token = 0;
  float probability = 0;
  std::vector<float> hidden;
};

// What a run saw, per sequence: the logits after each position from the prompt's last on, and
// the MTP module's round-1 draft from each such position.
struct Seen {
  std::vector<std::map<int64_t, std::vector<float>>> logits;
  std::vector<std::map<int64_t, Drafted>> drafts;
};

class V4SpeculativeTest : public ::testing::TestWithParam<const char*> {
 protected:
  std::unique_ptr<CausalLm> Model(int64_t spare) {
    auto f = OpenV4MtpFixture(GetParam(), spare);
    EXPECT_TRUE(f.ok()) << f.status();
    if (!f.ok()) return nullptr;
    prompts_ = f->prompts;
    auto model = BuildModel(f->config, f->source.get(), &backend_);
    EXPECT_TRUE(model.ok()) << model.status();
    sources_.push_back(std::move(f->source));
    return model.ok() ? std::move(*model) : nullptr;
  }

  static int32_t Argmax(const float* row, int64_t n) {
    return static_cast<int32_t>(std::max_element(row, row + n) - row);
  }

  // Runs every prompt: a prefill, then verification steps with the drafts `schedule` gives (none:
  // plain decoding, which also fixes the continuation `tokens_`). Round 1 of the MTP module runs
  // after every step over its accepted rows.
  Seen RunAll(CausalLm* model, bool speculative) {
    const int64_t V = model->config().vocab_size;
    const size_t n = prompts_.size();
    Seen seen;
    seen.logits.resize(n);
    seen.drafts.resize(n);
    auto pool = KvBlockPool::Create(&backend_, {model->CacheSpec(), 96, 16});
    EXPECT_TRUE(pool.ok()) << pool.status();
    if (!pool.ok()) return seen;
    std::vector<std::vector<int32_t>> tables(n);
    std::vector<int64_t> computed(n), hidden_from(n, 0);
    std::vector<std::vector<float>> hidden(n);
    if (!speculative) tokens_.assign(n, {});
    for (size_t i = 0; i < n; ++i) {
      const int64_t need = static_cast<int64_t>(prompts_[i].ids.size()) + kGenerated + 8;
      auto blocks = (*pool)->Allocate(static_cast<int32_t>((need + 15) / 16));
      EXPECT_TRUE(blocks.ok()) << blocks.status();
      if (!blocks.ok()) return seen;
      tables[i] = *blocks;
      if (!speculative) tokens_[i] = prompts_[i].ids;
    }
    // Round 1 of the MTP module over each sequence's rows [hidden_from, computed): the draft from
    // its last row.
    auto round1 = [&] {
      std::vector<DraftStep> batch(n);
      for (size_t i = 0; i < n; ++i) {
        DraftStep& d = batch[i];
        d.position_offset = hidden_from[i];
        d.tokens.assign(tokens_[i].begin() + hidden_from[i] + 1,
                        tokens_[i].begin() + computed[i] + 1);
        d.hidden = hidden[i];
        d.block_table = tables[i];
      }
      auto out = model->Draft(batch, pool->get());
      ASSERT_TRUE(out.ok()) << out.status();
      for (size_t i = 0; i < n; ++i) {
        seen.drafts[i][computed[i] - 1] = {out->token[i], out->probability[i], out->hidden[i]};
      }
    };
    // The prefill.
    {
      std::vector<SequenceStep> batch(n);
      for (size_t i = 0; i < n; ++i) {
        batch[i].tokens = prompts_[i].ids;
        batch[i].block_table = tables[i];
        batch[i].return_hidden = true;
      }
      auto out = model->Step(batch, pool->get());
      EXPECT_TRUE(out.ok()) << out.status();
      if (!out.ok()) return seen;
      for (size_t i = 0; i < n; ++i) {
        computed[i] = static_cast<int64_t>(prompts_[i].ids.size());
        seen.logits[i][computed[i] - 1] = out->logits[i];
        if (!speculative) tokens_[i].push_back(Argmax(out->logits[i].data(), V));
        hidden[i] = std::move(out->hidden[i]);
      }
      round1();
    }
    for (int step = 0;; ++step) {
      std::vector<size_t> live;
      for (size_t i = 0; i < n; ++i) {
        // The plain run goes 4 tokens further: the drafts and rows of the last verifications.
        const int64_t end = static_cast<int64_t>(prompts_[i].ids.size()) + kGenerated;
        if (computed[i] < (speculative ? end : end + 4)) {
          live.push_back(i);
        }
      }
      if (live.empty()) break;
      std::vector<SequenceStep> batch;
      std::vector<int64_t> accepted(n, 0);
      for (size_t i : live) {
        const int64_t c = computed[i];
        SequenceStep s;
        s.tokens = {tokens_[i][c]};
        if (speculative) {
          // k drafts, the one at index `wrong` (k: none) not the continuation's.
          const int64_t k = 1 + (step + i) % 3, wrong = (step + 2 * i) % (k + 1);
          std::vector<int32_t> drafts;
          for (int64_t j = 0; j < k; ++j) {
            const int32_t right = tokens_[i][c + 1 + j];
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
            EXPECT_TRUE(out.ok()) << out.status();
            if (!out.ok()) return seen;
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
      EXPECT_TRUE(out.ok()) << out.status();
      if (!out.ok()) return seen;
      for (size_t b = 0; b < live.size(); ++b) {
        const size_t i = live[b];
        const int64_t c = computed[i], a = accepted[i];
        for (int64_t r = 0; r <= a; ++r) {
          seen.logits[i][c + r].assign(out->logits[b].begin() + r * V,
                                       out->logits[b].begin() + (r + 1) * V);
        }
        if (!speculative) tokens_[i].push_back(Argmax(out->logits[b].data(), V));
        const size_t width = out->hidden[b].size() / batch[b].tokens.size();
        hidden[i].assign(out->hidden[b].begin(), out->hidden[b].begin() + (a + 1) * width);
        hidden_from[i] = c;
        computed[i] = c + a + 1;
      }
      // Round 1 of the module over the rows each sequence accepted.
      std::vector<DraftStep> dbatch;
      for (size_t i : live) {
        DraftStep d;
        d.position_offset = hidden_from[i];
        d.tokens.assign(tokens_[i].begin() + hidden_from[i] + 1,
                        tokens_[i].begin() + computed[i] + 1);
        d.hidden = hidden[i];
        d.block_table = tables[i];
        dbatch.push_back(std::move(d));
      }
      auto dout = model->Draft(dbatch, pool->get());
      EXPECT_TRUE(dout.ok()) << dout.status();
      if (!dout.ok()) return seen;
      for (size_t b = 0; b < live.size(); ++b) {
        const size_t i = live[b];
        seen.drafts[i][computed[i] - 1] = {dout->token[b], dout->probability[b], dout->hidden[b]};
      }
    }
    return seen;
  }

  // Rows that differ (bitwise) from the plain run's, and rows compared.
  static std::pair<int, int> Compare(const Seen& got, const Seen& want) {
    int differ = 0, compared = 0;
    for (size_t i = 0; i < got.logits.size(); ++i) {
      for (const auto& [p, row] : got.logits[i]) {
        const auto& w = want.logits[i].at(p);
        ++compared;
        if (row.size() != w.size() ||
            std::memcmp(row.data(), w.data(), row.size() * sizeof(float)) != 0) {
          ++differ;
        }
      }
      for (const auto& [p, d] : got.drafts[i]) {
        const Drafted& w = want.drafts[i].at(p);
        ++compared;
        if (d.token != w.token || d.probability != w.probability ||
            d.hidden.size() != w.hidden.size() ||
            std::memcmp(d.hidden.data(), w.hidden.data(), d.hidden.size() * sizeof(float)) != 0) {
          ++differ;
        }
      }
    }
    return {differ, compared};
  }

  CpuBackend backend_{2};
  std::vector<std::unique_ptr<WeightSource>> sources_;
  std::vector<V4MtpFixture::Prompt> prompts_;
  std::vector<std::vector<int32_t>> tokens_;  // per prompt: the plain continuation
};

TEST_P(V4SpeculativeTest, RejectedDraftsLeaveNoTrace) {
  auto model = Model(/*spare=*/3);
  ASSERT_NE(model, nullptr);
  ASSERT_EQ(prompts_.size(), 3u);
  const Seen plain = RunAll(model.get(), /*speculative=*/false);
  for (size_t i = 0; i < prompts_.size(); ++i) {
    // The plain run is the model's greedy continuation: HF's.
    const std::vector<int32_t> generated(tokens_[i].begin() + prompts_[i].ids.size(),
                                         tokens_[i].begin() + prompts_[i].ids.size() + 24);
    EXPECT_EQ(generated, prompts_[i].greedy) << "prompt " << i;
  }
  const Seen drafted = RunAll(model.get(), /*speculative=*/true);
  const auto [differ, compared] = Compare(drafted, plain);
  EXPECT_EQ(differ, 0) << "of " << compared;
  EXPECT_GT(compared, 3 * kGenerated);
}

TEST_P(V4SpeculativeTest, WithoutSpareRowsRejectedDraftsLeaveTraces) {
  auto model = Model(/*spare=*/0);
  ASSERT_NE(model, nullptr);
  const Seen plain = RunAll(model.get(), /*speculative=*/false);
  const Seen drafted = RunAll(model.get(), /*speculative=*/true);
  EXPECT_GT(Compare(drafted, plain).first, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, V4SpeculativeTest, ::testing::Values("dsv4_bf16", "dsv4_mix"));

}  // namespace
}  // namespace deepinfer
