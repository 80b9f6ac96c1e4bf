// Parity of DeepSeek-V4 on the CPU backend with HF transformers' deepseek_v4 (float32 on the
// stored values; fixtures by tools/make_fixtures_v4.py). logits.bin holds HF's logits at every
// position of each prompt followed by the first 23 tokens of its greedy continuation, from one
// forward pass without cache; greedy_24 is HF's greedy continuation by full recompute.
//
// The indexer's top-k over tied scores (DeepseekV4Model::set_indexer_full_forward_ties): HF's
// choice among exactly equal scores depends on the length of the forward pass, so where ties
// occur HF's logits are a function of the pass, not of a position's past. With the HF rule, one
// prefill gives HF's logits at every position and greedy by full recompute gives greedy_24.
// With the serving rule (the default), chunked prefill and decode give exactly what one prefill
// gives. dsv4_bf16 (8 index heads) has no tie that changes HF's outputs (HF's cached generate
// equals its full recompute there), so the serving rule must match HF at every position and
// give greedy_24 through the cache; on dsv4_mix (4 index heads) the 300-token prompt has such
// ties (HF's cached generate differs from its full recompute), and the test prints how many
// positions agree.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/parity/parity_checks.h"
#include "tests/parity/v4_parity_runs.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/deepseek_v4/deepseek_v4_model.h"

namespace deepinfer {
namespace {

constexpr double kTolerance = 1e-4;

// Whether the fixture has no indexer tie that changes HF's outputs (see the header).
bool ServingRuleIsHfs(const std::string& fixture) { return fixture == "dsv4_bf16"; }

class V4ParityTest : public ::testing::TestWithParam<std::string> {
 protected:
  V4ParityTest() : backend_(2) {}
  void SetUp() override {
    auto m = LoadParityModel(GetParam(), &backend_);
    ASSERT_TRUE(m.ok()) << m.status();
    m_ = std::move(*m);
    v4_ = dynamic_cast<DeepseekV4Model*>(m_.model.get());
    ASSERT_NE(v4_, nullptr);
  }
  std::vector<float> Run(const std::vector<int32_t>& ids, int64_t chunk) {
    auto r = RunInSteps(m_.model.get(), m_.pool.get(), ids, chunk);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : std::vector<float>();
  }
  std::vector<double> RowErrors(const FixturePrompt& p, const std::vector<float>& ours) {
    return CoveredRowErrors(m_.fx, p, ours);
  }

  CpuBackend backend_;
  ParityModel m_;
  DeepseekV4Model* v4_ = nullptr;
};

TEST_P(V4ParityTest, OnePrefillMatchesHfAtEveryPosition) {
  v4_->set_indexer_full_forward_ties(true);
  for (const FixturePrompt& p : m_.fx.prompts) {
    const std::vector<double> err = RowErrors(p, Run(CoveredIds(p), 0));
    const double worst = *std::max_element(err.begin(), err.end());
    std::printf("[v4-parity] %s prompt_len=%zu positions=%zu rel=%.3e\n", GetParam().c_str(),
                p.ids.size(), err.size(), worst);
    EXPECT_LE(worst, kTolerance) << "prompt of " << p.ids.size() << " tokens";
  }
}

TEST_P(V4ParityTest, GreedyByFullRecomputeIsHfs) {
  v4_->set_indexer_full_forward_ties(true);
  const int64_t V = m_.fx.vocab;
  for (const FixturePrompt& p : m_.fx.prompts) {
    std::vector<int32_t> ids = p.ids, got;
    for (size_t i = 0; i < p.greedy.size(); ++i) {
      const std::vector<float> logits = Run(ids, 0);
      ASSERT_EQ(static_cast<int64_t>(logits.size()), static_cast<int64_t>(ids.size()) * V);
      got.push_back(ArgmaxRow(logits.data() + logits.size() - V, V));
      ids.push_back(got.back());
    }
    EXPECT_EQ(got, p.greedy) << "prompt of " << p.ids.size() << " tokens";
  }
}

// The cache carries the window ring, the compressor rows and the compressed entries across
// steps: chunks that split windows anywhere, and single tokens, give what one prefill gives.
TEST_P(V4ParityTest, ChunkedPrefillAndDecodeMatchOnePrefill) {
  for (const FixturePrompt& p : m_.fx.prompts) {
    const std::vector<int32_t> ids = CoveredIds(p);
    const std::vector<float> one = Run(ids, 0);
    double max_one = 0;
    for (float x : one) max_one = std::max<double>(max_one, std::fabs(x));
    for (int64_t chunk : {1, 3, 5, 16}) {
      const std::vector<float> got = Run(ids, chunk);
      ASSERT_EQ(got.size(), one.size());
      double worst = 0;
      for (size_t i = 0; i < one.size(); ++i) {
        worst = std::max<double>(worst, std::fabs(got[i] - one[i]) / max_one);
      }
      EXPECT_LE(worst, 1e-5) << "chunks of " << chunk << ", prompt of " << p.ids.size();
    }
    // And against HF, position by position (see the header on ties).
    const std::vector<double> err = RowErrors(p, one);
    const int64_t within =
        std::count_if(err.begin(), err.end(), [](double e) { return e <= kTolerance; });
    std::printf(
        "[v4-parity] %s serving ties: prompt_len=%zu %lld / %zu positions within %.0e of "
        "HF\n",
        GetParam().c_str(), p.ids.size(), static_cast<long long>(within), err.size(), kTolerance);
    if (ServingRuleIsHfs(GetParam())) {
      EXPECT_EQ(within, static_cast<int64_t>(err.size())) << "prompt of " << p.ids.size();
    }
  }
}

// Greedy through the cache (prefill, then one token per step), alone and batched: the same
// tokens both ways; HF's greedy_24 on dsv4_bf16, printed against it on dsv4_mix.
TEST_P(V4ParityTest, CachedGreedyAloneEqualsBatched) {
  auto alone = GreedyContinuations(m_, false);
  ASSERT_TRUE(alone.ok()) << alone.status();
  auto batched = GreedyContinuations(m_, true);
  ASSERT_TRUE(batched.ok()) << batched.status();
  EXPECT_EQ(*alone, *batched);
  for (size_t s = 0; s < alone->size(); ++s) {
    const std::vector<int32_t>& want = m_.fx.prompts[s].greedy;
    size_t same = 0;
    while (same < want.size() && (*alone)[s][same] == want[same]) ++same;
    std::printf("[v4-parity] %s cached greedy: prompt_len=%zu first %zu / %zu tokens as HF's\n",
                GetParam().c_str(), m_.fx.prompts[s].ids.size(), same, want.size());
    if (ServingRuleIsHfs(GetParam())) {
      EXPECT_EQ((*alone)[s], want) << "prompt of " << m_.fx.prompts[s].ids.size();
    }
  }
}

// A bounded rebuild (docs/model.md, "Replay after preemption or worker loss"): after `kept`
// positions the paged entries are read out of the sequence's blocks, the blocks (and with them the
// state slot) are freed, the entries are written into other blocks, and only the positions from
// BoundedReplayStart(kept) are replayed. Every position from `kept` on then has the logits of
// one prefill, bit for bit.
TEST_P(V4ParityTest, BoundedRebuildMatchesOnePrefill) {
  const int64_t V = m_.fx.vocab;
  int rebuilt = 0;
  for (const FixturePrompt& p : m_.fx.prompts) {
    const std::vector<int32_t> ids = CoveredIds(p);
    const int64_t n = static_cast<int64_t>(ids.size()), kept = n - 8;
    const int64_t start = m_.model->BoundedReplayStart(kept);
    if (start == 0) continue;  // too short: a rebuild replays every position
    ++rebuilt;
    const std::vector<float> one = Run(ids, 0);
    auto first = m_.pool->Allocate(m_.pool->BlocksFor(n));
    ASSERT_TRUE(first.ok()) << first.status();
    SequenceStep prefix;
    prefix.tokens.assign(ids.begin(), ids.begin() + kept);
    prefix.block_table = *first;
    ASSERT_TRUE(m_.model->Step({prefix}, m_.pool.get()).ok());
    const int32_t kept_blocks = m_.pool->BlocksFor(kept);
    auto bytes = m_.pool->ReadBlocks({first->begin(), first->begin() + kept_blocks});
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    ASSERT_TRUE(m_.pool->Free(*first).ok());
    // Other blocks than the freed ones: the entries come from the bytes read.
    auto filler = m_.pool->Allocate(3);
    ASSERT_TRUE(filler.ok()) << filler.status();
    auto second = m_.pool->Allocate(m_.pool->BlocksFor(n));
    ASSERT_TRUE(second.ok()) << second.status();
    ASSERT_NE((*second)[0], (*first)[0]);
    ASSERT_TRUE(
        m_.pool->WriteBlocks({second->begin(), second->begin() + kept_blocks}, *bytes).ok());
    SequenceStep replay;
    replay.tokens.assign(ids.begin() + start, ids.end());
    replay.position_offset = start;
    replay.block_table = *second;
    replay.all_logits = true;
    replay.replay_from = start;
    replay.kept_end = kept;
    auto r = m_.model->Step({replay}, m_.pool.get());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(static_cast<int64_t>(r->logits[0].size()), (n - start) * V);
    int64_t differing = 0;
    for (int64_t pos = kept; pos < n; ++pos) {
      differing += !std::equal(one.begin() + pos * V, one.begin() + (pos + 1) * V,
                               r->logits[0].begin() + (pos - start) * V);
    }
    EXPECT_EQ(differing, 0) << "prompt of " << p.ids.size() << ": replayed from " << start;
    std::printf("[v4-parity] %s bounded rebuild: %lld positions, kept %lld, replayed %lld\n",
                GetParam().c_str(), static_cast<long long>(n), static_cast<long long>(kept),
                static_cast<long long>(n - start));
    ASSERT_TRUE(m_.pool->Free(*second).ok());
    ASSERT_TRUE(m_.pool->Free(*filler).ok());
  }
  EXPECT_GT(rebuilt, 0) << "no prompt long enough for a bounded rebuild";
}

// A rebuild that starts later than BoundedReplayStart allows is refused.
TEST_P(V4ParityTest, RebuildStartingTooLateIsRefused) {
  auto blocks = m_.pool->Allocate(m_.pool->BlocksFor(400));
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  SequenceStep s;
  s.tokens = {1, 2};
  s.block_table = *blocks;
  s.kept_end = 398;
  s.replay_from = m_.model->BoundedReplayStart(398) + 1;
  s.position_offset = s.replay_from;
  auto r = m_.model->Step({s}, m_.pool.get());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_TRUE(m_.pool->Free(*blocks).ok());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, V4ParityTest, ::testing::Values("dsv4_bf16", "dsv4_mix"));

}  // namespace
}  // namespace deepinfer
