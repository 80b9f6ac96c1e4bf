#include "worker/engine/step_stats.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace deepinfer {
namespace {

TEST(StepStatsTest, GapsHistogramAndTtft) {
  StepStats stats;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  // Step 1: prefill of 300 tokens, 100 ms, recorded no graph.
  stats.AddStep(t0, absl::Milliseconds(100), 0, 300, false, false);
  // Step 2 starts 20 ms after step 1 ended: 4 decodes, 10 ms, recorded a graph.
  stats.AddStep(t0 + absl::Milliseconds(120), absl::Milliseconds(10), 4, 0, true, true);
  // Step 3 starts 5 ms later: 4 decodes again, 10 ms, replayed from the graph.
  stats.AddStep(t0 + absl::Milliseconds(135), absl::Milliseconds(10), 4, 0, false, true);
  stats.AddFirstToken(absl::Milliseconds(100));
  stats.AddFirstToken(absl::Milliseconds(300));
  stats.AddFinished(7);
  stats.AddDropped(2);
  stats.set_async_scheduling(true);
  EXPECT_EQ(stats.steps(), 3);

  const nlohmann::json j = nlohmann::json::parse(stats.ToJson());
  EXPECT_EQ(j["async_scheduling"], true);
  EXPECT_EQ(j["steps"], 3);
  EXPECT_EQ(j["capture_steps"], 1);
  EXPECT_NEAR(j["step_s"].get<double>(), 0.110, 1e-9);
  EXPECT_NEAR(j["capture_s"].get<double>(), 0.010, 1e-9);
  EXPECT_EQ(j["graph_steps"], 2);
  EXPECT_NEAR(j["graph_step_s"].get<double>(), 0.020, 1e-9);
  EXPECT_NEAR(j["gap_s"].get<double>(), 0.025, 1e-9);
  EXPECT_NEAR(j["max_gap_s"].get<double>(), 0.020, 1e-9);
  EXPECT_NEAR(j["span_s"].get<double>(), 0.145, 1e-9);
  EXPECT_NEAR(j["first_step_unix"].get<double>(), 1000.0, 1e-6);
  EXPECT_NEAR(j["last_step_end_unix"].get<double>(), 1000.145, 1e-6);
  EXPECT_EQ(j["decode_tokens"], 8);
  EXPECT_EQ(j["prefill_tokens"], 300);
  EXPECT_EQ(j["dropped_tokens"], 2);
  EXPECT_EQ(j["finished"], 1);
  EXPECT_EQ(j["generated_tokens"], 7);
  EXPECT_EQ(j["first_tokens"], 2);
  EXPECT_NEAR(j["ttft_p50_s"].get<double>(), 0.1, 1e-9);
  EXPECT_NEAR(j["ttft_p99_s"].get<double>(), 0.3, 1e-9);
  // Keyed by (decodes, prefill tokens), in key order.
  ASSERT_EQ(j["histogram"].size(), 2u);
  EXPECT_EQ(j["histogram"][0][0], 0);
  EXPECT_EQ(j["histogram"][0][1], 300);
  EXPECT_EQ(j["histogram"][0][2], 1);
  EXPECT_EQ(j["histogram"][1][0], 4);
  EXPECT_EQ(j["histogram"][1][1], 0);
  EXPECT_EQ(j["histogram"][1][2], 2);
  EXPECT_NEAR(j["histogram"][1][3].get<double>(), 0.020, 1e-9);
}

TEST(StepStatsTest, EmptyIsZeros) {
  const nlohmann::json j = nlohmann::json::parse(StepStats().ToJson());
  EXPECT_EQ(j["async_scheduling"], false);
  EXPECT_EQ(j["steps"], 0);
  EXPECT_EQ(j["gap_s"], 0.0);
  EXPECT_EQ(j["ttft_p50_s"], 0.0);
  EXPECT_TRUE(j["histogram"].empty());
}

}  // namespace
}  // namespace deepinfer
