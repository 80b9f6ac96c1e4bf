// RunBenchmark end to end on the CPU backend with a tiny dummy model: every figure is
// produced, finite and positive, for each requested batch size and both cache fills; the
// flag helpers and the refusals.
#include "tools/bench/bench_runner.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

std::string FixtureDir() {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/deepinfer/tests/fixtures/dsv3_qlora_rope";
}

BenchConfig SmallConfig() {
  BenchConfig c;
  c.model = DummyModelSpec(FixtureDir(), 7);
  c.backend = "cpu";
  c.decode_num_requests = {3};
  c.context_length = 20;
  c.prefill_batch_tokens = 40;
  c.output_len = 5;
  c.warmup = 1;
  c.prefill_repeats = 2;
  return c;
}

void ExpectDecodeFigures(const DecodeResult& d, int64_t batch) {
  EXPECT_EQ(d.batch, batch);
  EXPECT_EQ(d.steps, 4);
  EXPECT_EQ(d.seq0_tokens.size(), 5u);
  for (double v : {d.tokens_per_s, d.p50_seconds, d.roofline_fraction, d.bytes_per_step,
                   d.flops_per_step}) {
    EXPECT_TRUE(std::isfinite(v) && v > 0) << v;
  }
  EXPECT_LE(d.p50_seconds, d.p99_seconds);
}

TEST(BenchRunnerTest, ProducesAllFiguresOnCpu) {
  BenchConfig c = SmallConfig();
  c.dtype = "float32";
  auto r = RunBenchmark(c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->backend, "cpu");
  EXPECT_EQ(r->bytes_per_value, 4);
  EXPECT_EQ(r->kv_cache_dtype, "float32");
  EXPECT_EQ(r->cache_bytes_per_value, 4);
  EXPECT_EQ(r->prefill_tokens_per_step, 40);
  ASSERT_EQ(r->decode.size(), 1u);
  ExpectDecodeFigures(r->decode[0], 3);
  for (double v : {r->prefill_tokens_per_s, r->prefill_roofline_fraction,
                   r->prefill_bytes_per_step, r->prefill_flops_per_step}) {
    EXPECT_TRUE(std::isfinite(v) && v > 0) << v;
  }
  EXPECT_EQ(r->device_bytes_reserved_peak, -1);  // the CPU backend reports no device memory
  const std::string report = FormatBenchReport(c, *r);
  EXPECT_NE(report.find("decode: batch 3"), std::string::npos) << report;
  const std::string json = FormatBenchJson(c, *r);
  EXPECT_EQ(json.front(), '{');
  EXPECT_NE(json.find("\"requests\": 3"), std::string::npos) << json;
  EXPECT_NE(json.find("\"dtype\": \"float32\", \"bytes_per_value\": 4,"), std::string::npos)
      << json;
  ASSERT_EQ(BenchCsvRows(c, *r).size(), 1u);
  EXPECT_EQ(BenchCsvRows(c, *r)[0].find('\n'), std::string::npos);
}

TEST(BenchRunnerTest, SeveralBatchSizesRandomFillNoPrefill) {
  BenchConfig c = SmallConfig();
  c.decode_num_requests = {1, 4};
  c.decode_fill = "random";
  c.prefill_batch_tokens = 0;
  auto r = RunBenchmark(c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prefill_tokens_per_step, 0);
  ASSERT_EQ(r->decode.size(), 2u);
  ExpectDecodeFigures(r->decode[0], 1);
  ExpectDecodeFigures(r->decode[1], 4);
  // More requests read more experts and more cache per step.
  EXPECT_GT(r->decode[1].bytes_per_step, r->decode[0].bytes_per_step);
  EXPECT_EQ(BenchCsvRows(c, *r).size(), 2u);
  EXPECT_EQ(FormatBenchReport(c, *r).find("prefill:"), std::string::npos);
}

TEST(BenchRunnerTest, RejectsBadInput) {
  BenchConfig c = SmallConfig();
  c.output_len = 1;
  c.warmup = 2;
  EXPECT_EQ(RunBenchmark(c).status().code(), absl::StatusCode::kInvalidArgument);
  c = SmallConfig();
  c.decode_num_requests = {2, 0};
  EXPECT_EQ(RunBenchmark(c).status().code(), absl::StatusCode::kInvalidArgument);
  c = SmallConfig();
  c.decode_fill = "zeros";
  EXPECT_EQ(RunBenchmark(c).status().code(), absl::StatusCode::kInvalidArgument);
  c = SmallConfig();
  c.dtype = "fp8";
  EXPECT_EQ(RunBenchmark(c).status().code(), absl::StatusCode::kInvalidArgument);
  // bfloat16 (the default) reaches the backend: bf16 weights, 2 bytes per value.
  c = SmallConfig();
  c.dtype = "bfloat16";
  auto bf16 = RunBenchmark(c);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->bytes_per_value, 2);
  // ... and a bf16 KV cache, counted at 2 bytes per value in the roofline.
  EXPECT_EQ(bf16->kv_cache_dtype, "bfloat16");
  EXPECT_EQ(bf16->cache_bytes_per_value, 2);
  // An fp32 cache under bf16 weights when asked for; a bad name is rejected.
  c.kv_cache_dtype = "float32";
  auto f32_cache = RunBenchmark(c);
  ASSERT_TRUE(f32_cache.ok()) << f32_cache.status();
  EXPECT_EQ(f32_cache->kv_cache_dtype, "float32");
  EXPECT_EQ(f32_cache->cache_bytes_per_value, 4);
  c.kv_cache_dtype = "int8";
  EXPECT_EQ(RunBenchmark(c).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BenchRunnerTest, FlagHelpers) {
  std::vector<int64_t> counts;
  EXPECT_TRUE(ParseRequestCounts("64", &counts));
  EXPECT_EQ(counts, std::vector<int64_t>({64}));
  EXPECT_TRUE(ParseRequestCounts("1,128", &counts));
  EXPECT_EQ(counts, std::vector<int64_t>({1, 128}));
  EXPECT_FALSE(ParseRequestCounts("1,,2", &counts));
  EXPECT_FALSE(ParseRequestCounts("many", &counts));
  EXPECT_EQ(DummyModelSpec("/m/dir", 3), "dummy:/m/dir/config.json@3");
  EXPECT_EQ(DummyModelSpec("/m/c.json", 0), "dummy:/m/c.json@0");
  EXPECT_EQ(DummyModelSpec("dummy:/m/c.json@5", 0), "dummy:/m/c.json@5");
  EXPECT_EQ(BytesPerValue("bfloat16").value(), 2);
  EXPECT_EQ(BytesPerValue("float32").value(), 4);
}

}  // namespace
}  // namespace deepinfer
