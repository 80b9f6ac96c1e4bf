#include "coordinator/cli/progress.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

TEST(ProgressTest, CountsRunningTokensAndEtaFromTheAveragePerCompletedRequest) {
  Job job;
  job.set_total_requests(120);
  job.set_completed_requests(30);
  job.set_failed_requests(10);
  job.set_running_requests(8);
  job.set_generated_tokens(900);  // 30 per completed request
  job.set_running_generated_tokens(400);
  job.set_unfinished_max_tokens(80 * 64);
  // 80 requests left x 30 = 2400, less the 400 the running ones have: 2000 at 40/s.
  EXPECT_EQ(FormatProgress(job, 40.0),
            "40/120 done (33.3%), 8 running, 10 failed | 1300 tokens, 40.0 tok/s | ETA 50s");
  job.set_completed_requests(110);
  job.set_running_requests(0);
  job.set_running_generated_tokens(0);
  EXPECT_EQ(FormatProgress(job, 40.0),
            "120/120 done (100.0%), 0 running, 10 failed | 900 tokens, 40.0 tok/s");
}

TEST(ProgressTest, BeforeAnyRequestCompletedTheEtaIsAnUpperBound) {
  Job job;
  job.set_total_requests(5);
  job.set_running_requests(5);
  job.set_running_generated_tokens(100);
  job.set_unfinished_max_tokens(5 * 64);
  // 320 - 100 = 220 tokens at most, at 10/s.
  EXPECT_EQ(FormatProgress(job, 10.0),
            "0/5 done (0.0%), 5 running | 100 tokens, 10.0 tok/s | ETA <= 22s");
  // 220 / 30 = 7.3 s, rounded up.
  EXPECT_EQ(FormatProgress(job, 30.0),
            "0/5 done (0.0%), 5 running | 100 tokens, 30.0 tok/s | ETA <= 8s");
  std::optional<TokensLeft> left = EstimateTokensLeft(job);
  ASSERT_TRUE(left.has_value());
  EXPECT_EQ(left->tokens, 220);
  EXPECT_TRUE(left->upper_bound);
}

TEST(ProgressTest, TheAverageNeverExceedsTheMaxTokensBound) {
  Job job;
  job.set_total_requests(3);
  job.set_completed_requests(1);
  job.set_generated_tokens(1000);
  job.set_unfinished_max_tokens(100);  // the two left may make 100 tokens at most
  std::optional<TokensLeft> left = EstimateTokensLeft(job);
  ASSERT_TRUE(left.has_value());
  EXPECT_EQ(left->tokens, 100);
  EXPECT_FALSE(left->upper_bound);
}

TEST(ProgressTest, NoRateNoEta) {
  Job job;
  job.set_total_requests(5);
  job.set_unfinished_max_tokens(80);
  EXPECT_EQ(FormatProgress(job, std::nullopt), "0/5 done (0.0%), 0 running | 0 tokens");
  EXPECT_EQ(FormatProgress(job, 0.0), "0/5 done (0.0%), 0 running | 0 tokens, 0.0 tok/s");
}

TEST(TokenRateTest, RateBetweenChangesOverTheWindow) {
  TokenRate rate(absl::Seconds(20));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto at = [&](double s) { return t0 + absl::Seconds(s); };
  rate.Add(at(0), 0);  // the first count seen: not a change
  rate.Add(at(5), 0);
  EXPECT_FALSE(rate.PerSecond(at(5)).has_value());
  rate.Add(at(6), 500);  // the first change; the 6 s before it do not count
  rate.Add(at(6.2), 500);
  EXPECT_FALSE(rate.PerSecond(at(6.4)).has_value());
  rate.Add(at(6.5), 700);
  EXPECT_FALSE(rate.PerSecond(at(6.5)).has_value());  // changes less than a second apart
  rate.Add(at(7), 1000);
  rate.Add(at(7.8), 1000);  // repeated counts between heartbeats change nothing
  ASSERT_TRUE(rate.PerSecond(at(7.8)).has_value());
  EXPECT_DOUBLE_EQ(*rate.PerSecond(at(7.8)), 500.0);
  // At 30 s the window starts at 10 s: the newest change at or before it (7 s) is the oldest
  // one kept.
  rate.Add(at(15), 3000);
  rate.Add(at(30), 6000);
  EXPECT_DOUBLE_EQ(*rate.PerSecond(at(30)), (6000.0 - 1000) / 23);
  rate.Add(at(36), 7000);  // window from 16 s: the 15 s change
  EXPECT_DOUBLE_EQ(*rate.PerSecond(at(36)), (7000.0 - 3000) / 21);
  // No change for a whole window: nothing is being generated.
  EXPECT_DOUBLE_EQ(*rate.PerSecond(at(56)), 0.0);
}

TEST(ProgressLineTest, PrintsEachNewClusterNoticeOnceEvenWhenNotDrawing) {
  char buffer[512] = {0};
  FILE* f = fmemopen(buffer, sizeof(buffer), "w");
  ProgressLine line(f, /*enabled=*/false, "deepinfer wait");
  Job job;
  job.set_total_requests(1);
  line.Update(job);
  job.set_cluster_notice("worker(s) w2 left out");
  line.Update(job);
  line.Update(job);
  job.set_cluster_notice("");
  line.Update(job);
  job.set_cluster_notice("worker(s) w2 left out");
  line.Update(job);
  line.Finish();
  std::fclose(f);
  EXPECT_STREQ(buffer,
               "deepinfer wait: worker(s) w2 left out\n"
               "deepinfer wait: worker(s) w2 left out\n");
}

TEST(ProgressLineTest, PrintsWhyTheJobIsStalledOnceEachTimeItIs) {
  char buffer[512] = {0};
  FILE* f = fmemopen(buffer, sizeof(buffer), "w");
  ProgressLine line(f, /*enabled=*/false, "deepinfer run");
  Job job;
  job.set_total_requests(1);
  job.set_stalled_reason("writes to the state directory fail (disk full)");
  line.Update(job);
  line.Update(job);
  job.set_cluster_notice("worker(s) w2 left out");
  line.Update(job);
  job.clear_stalled_reason();
  line.Update(job);
  job.set_stalled_reason("writes to the state directory fail (disk full)");
  line.Update(job);
  line.Finish();
  std::fclose(f);
  EXPECT_STREQ(buffer,
               "deepinfer run: stalled: writes to the state directory fail (disk full)\n"
               "deepinfer run: worker(s) w2 left out\n"
               "deepinfer run: stalled: writes to the state directory fail (disk full)\n");
}

TEST(ProgressLineTest, DisabledLineWritesNoProgress) {
  char buffer[64] = {0};
  FILE* f = fmemopen(buffer, sizeof(buffer), "w");
  ProgressLine line(f, /*enabled=*/false, "deepinfer run");
  Job job;
  job.set_total_requests(1);
  line.Update(job);
  line.Finish();
  std::fclose(f);
  EXPECT_STREQ(buffer, "");
}

}  // namespace
}  // namespace deepinfer
