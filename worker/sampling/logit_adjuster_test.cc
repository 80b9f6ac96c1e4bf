// Tests for LogitAdjuster and AdjustLogit: the entries a sequence's parameters and token counts
// give, against values worked out by hand from the OpenAI / vLLM definitions.
#include "worker/sampling/logit_adjuster.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(AdjustLogitTest, BiasThenRepetitionThenSubtraction) {
  LogitAdjustment a;
  a.bias = 1.0f;
  a.repetition = 2.0f;
  a.subtract = 0.5f;
  EXPECT_EQ(AdjustLogit(3.0f, a), 1.5f);    // (3 + 1) / 2 - 0.5
  EXPECT_EQ(AdjustLogit(-1.5f, a), -1.5f);  // (-1.5 + 1) * 2 - 0.5
  EXPECT_EQ(AdjustLogit(-1.0f, a), -0.5f);  // 0 is not positive: 0 * 2 - 0.5
  a.bias = -kInf;
  EXPECT_EQ(AdjustLogit(50.0f, a), -kInf);  // a mask stays a mask
}

TEST(LogitAdjusterTest, EntriesFollowCountsAndMinTokens) {
  LogitAdjusterParams p;
  p.logit_bias = {{5, 1.5f}};
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.repetition_penalty = 1.25f;
  p.min_tokens = 3;
  p.stop_tokens = {2, 99};  // 99 is outside the vocabulary: never sampled, never masked
  const std::vector<int32_t> prompt = {5, 7, 7};
  auto adj = LogitAdjuster::Create(p, 20, prompt);
  ASSERT_TRUE(adj.ok()) << adj.status();
  EXPECT_TRUE(adj->active());
  for (int32_t t : {7, 9, 9}) adj->AddGenerated(t);
  // 3 generated: min_tokens reached, so token 2 has no entry.
  std::vector<LogitAdjustment> e = adj->Entries();
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].token, 5);  // biased, in the prompt, not generated
  EXPECT_EQ(e[0].bias, 1.5f);
  EXPECT_EQ(e[0].repetition, 1.25f);
  EXPECT_EQ(e[0].subtract, 0.0f);
  EXPECT_EQ(e[1].token, 7);  // prompt and generated once: 0.25 * 1 + 0.5
  EXPECT_EQ(e[1].bias, 0.0f);
  EXPECT_EQ(e[1].repetition, 1.25f);
  EXPECT_EQ(e[1].subtract, 0.75f);
  EXPECT_EQ(e[2].token, 9);  // generated twice: 0.25 * 2 + 0.5
  EXPECT_EQ(e[2].repetition, 1.25f);
  EXPECT_EQ(e[2].subtract, 1.0f);
}

TEST(LogitAdjusterTest, MinTokensMasksStopTokensUntilReached) {
  LogitAdjusterParams p;
  p.min_tokens = 2;
  p.stop_tokens = {4, 1};
  auto adj = LogitAdjuster::Create(p, 8, {3});
  ASSERT_TRUE(adj.ok()) << adj.status();
  ASSERT_TRUE(adj->active());
  for (int step = 0; step < 2; ++step) {
    std::vector<LogitAdjustment> e = adj->Entries();
    ASSERT_EQ(e.size(), 2u) << step;
    EXPECT_EQ(e[0].token, 1);
    EXPECT_EQ(e[0].bias, -kInf);
    EXPECT_EQ(e[1].token, 4);
    EXPECT_EQ(e[1].bias, -kInf);
    adj->AddGenerated(6);
  }
  EXPECT_TRUE(adj->Entries().empty());
}

TEST(LogitAdjusterTest, EntriesAfterPendingTokensCountThem) {
  LogitAdjusterParams p;
  p.logit_bias = {{6, 2.0f}};
  p.min_tokens = 2;
  p.stop_tokens = {4};
  auto adj = LogitAdjuster::Create(p, 8, {3});
  ASSERT_TRUE(adj.ok()) << adj.status();
  EXPECT_FALSE(adj->counts_tokens());
  // 0 generated + 1 pending: still below min_tokens; + 2 pending: reached.
  std::vector<LogitAdjustment> e = adj->EntriesAfter(1);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].token, 4);
  EXPECT_EQ(e[0].bias, -kInf);
  EXPECT_EQ(e[1].token, 6);
  e = adj->EntriesAfter(2);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].token, 6);
  EXPECT_EQ(e[0].bias, 2.0f);
  adj->AddGenerated(5);
  EXPECT_EQ(adj->EntriesAfter(1).size(), 1u);  // 1 generated + 1 pending
  EXPECT_EQ(adj->Entries().size(), 2u);        // 1 generated

  LogitAdjusterParams penalties;
  penalties.presence_penalty = 0.5f;
  adj = LogitAdjuster::Create(penalties, 8, {3});
  ASSERT_TRUE(adj.ok());
  EXPECT_TRUE(adj->counts_tokens());
}

TEST(LogitAdjusterTest, NothingAskedIsInactive) {
  auto adj = LogitAdjuster::Create(LogitAdjusterParams{}, 8, {1, 2});
  ASSERT_TRUE(adj.ok());
  EXPECT_FALSE(adj->active());
  LogitAdjusterParams stops_only;
  stops_only.stop_tokens = {1};  // no min_tokens: nothing to mask
  adj = LogitAdjuster::Create(stops_only, 8, {1});
  ASSERT_TRUE(adj.ok());
  EXPECT_FALSE(adj->active());
}

TEST(LogitAdjusterTest, RefusesBadParameters) {
  LogitAdjusterParams p;
  p.logit_bias = {{8, 1.0f}};
  auto adj = LogitAdjuster::Create(p, 8, {1});
  ASSERT_FALSE(adj.ok());
  EXPECT_NE(adj.status().message().find("logit_bias: token id 8"), std::string::npos)
      << adj.status();
  p = {};
  p.repetition_penalty = 0.0f;
  adj = LogitAdjuster::Create(p, 8, {1});
  ASSERT_FALSE(adj.ok());
  EXPECT_NE(adj.status().message().find("repetition_penalty"), std::string::npos);
  p = {};
  p.frequency_penalty = std::nanf("");
  EXPECT_FALSE(LogitAdjuster::Create(p, 8, {1}).ok());
  p = {};
  p.min_tokens = -1;
  EXPECT_FALSE(LogitAdjuster::Create(p, 8, {1}).ok());
}

}  // namespace
}  // namespace deepinfer
