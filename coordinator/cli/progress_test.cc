#include "coordinator/cli/progress.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

TEST(ProgressTest, FormatsCountsRateAndEta) {
  Job job;
  job.set_total_requests(120);
  job.set_completed_requests(30);
  job.set_failed_requests(10);
  job.set_generated_tokens(800);
  EXPECT_EQ(FormatProgress(job, absl::Seconds(20)),
            "40/120 requests (33.3%), 10 failed | 40.0 tok/s | ETA 40s");
  job.set_completed_requests(110);
  EXPECT_EQ(FormatProgress(job, absl::Seconds(20)), "120/120 requests (100.0%), 10 failed | 40.0 tok/s");
}

TEST(ProgressTest, NoEtaBeforeTheFirstResult) {
  Job job;
  job.set_total_requests(5);
  EXPECT_EQ(FormatProgress(job, absl::Seconds(2)), "0/5 requests (0.0%) | 0.0 tok/s");
  job.set_completed_requests(1);
  EXPECT_EQ(FormatProgress(job, absl::Seconds(100)),
            "1/5 requests (20.0%) | 0.0 tok/s | ETA 6m40s");
}

TEST(ProgressTest, DisabledLineWritesNothing) {
  char buffer[64] = {0};
  FILE* f = fmemopen(buffer, sizeof(buffer), "w");
  ProgressLine line(f, /*enabled=*/false);
  Job job;
  job.set_total_requests(1);
  line.Update(job);
  line.Finish();
  std::fclose(f);
  EXPECT_STREQ(buffer, "");
}

}  // namespace
}  // namespace deepinfer
