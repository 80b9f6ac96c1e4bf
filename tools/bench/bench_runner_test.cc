// RunBenchmark end to end on the CPU backend with a tiny dummy model: every figure is
// produced, finite and positive.
#include "tools/bench/bench_runner.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

std::string FixtureConfig() {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/deepinfer/tests/fixtures/dsv3_qlora_rope/config.json";
}

TEST(BenchRunnerTest, ProducesAllFiguresOnCpu) {
  BenchConfig c;
  c.model = "dummy:" + FixtureConfig() + "@7";
  c.backend = "cpu";
  c.decode_num_requests = 3;
  c.context_length = 20;
  c.prefill_batch_tokens = 40;
  c.output_len = 5;
  c.warmup = 1;
  c.prefill_repeats = 2;
  auto r = RunBenchmark(c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->backend, "cpu");
  EXPECT_EQ(r->prefill_tokens_per_step, 40);
  EXPECT_EQ(r->decode_batch, 3);
  EXPECT_EQ(r->decode_steps, 4);
  EXPECT_EQ(r->first_decode_tokens.size(), 5u);
  for (double v : {r->prefill_tokens_per_s, r->decode_tokens_per_s, r->decode_p50_seconds,
                   r->prefill_roofline_fraction, r->decode_roofline_fraction}) {
    EXPECT_TRUE(std::isfinite(v) && v > 0) << v;
  }
  EXPECT_LE(r->decode_p50_seconds, r->decode_p99_seconds);
  EXPECT_EQ(r->device_bytes_reserved_peak, -1);  // the CPU backend reports no device memory
  const std::string report = FormatBenchReport(c, *r);
  EXPECT_NE(report.find("decode: batch 3"), std::string::npos) << report;
  EXPECT_EQ(BenchCsvRow(c, *r).find('\n'), std::string::npos);
}

TEST(BenchRunnerTest, RejectsBadSizes) {
  BenchConfig c;
  c.model = "dummy:" + FixtureConfig();
  c.output_len = 1;
  c.warmup = 2;
  EXPECT_EQ(RunBenchmark(c).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deepinfer
